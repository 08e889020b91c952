/**
 * `npm run test:soak`: minutes of mixed traffic — streaming and not, aborts,
 * priorities, shared prefixes — against one server. Reports requests served,
 * aborts, RSS over time, and checks nothing leaked. WEFT_SOAK_SECONDS sets the length (default 120).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startServer, metric } from "../support/server.js";

test("soak: mixed traffic for minutes leaves no leaked blocks, no lost requests, bounded memory", async () => {
  const seconds = Number(process.env.WEFT_SOAK_SECONDS ?? 120);
  const s = await startServer({ engine: { maxNumSeqs: 32, maxWaitingRequests: 4096 } });
  const keys = [s.store.create("soak-high", "high"), s.store.create("soak-normal", "normal"), s.store.create("soak-low", "low")];
  await new Promise((r) => setTimeout(r, 1100));
  const end = Date.now() + seconds * 1000;
  const counts = { served: 0, aborted: 0, rejected: 0, failed: 0 };
  const rss: number[] = [];
  const sampler = setInterval(() => rss.push(process.memoryUsage().rss / 2 ** 20), 1000);
  let n = 0;
  const client = async (c: number): Promise<void> => {
    while (Date.now() < end) {
      const i = n++;
      const ctrl = new AbortController();
      const abort = i % 7 === 0;
      if (abort) setTimeout(() => ctrl.abort(), (i * 13) % 40);
      const shared = i % 2 ? Array.from({ length: 64 }, (_, j) => 500 + j) : [];
      const body = { model: "tiny", prompt: [...shared, ...Array.from({ length: 1 + (i % 50) }, (_, j) => 1000 + ((i * 31 + j) % 9000))],
        max_tokens: 1 + (i % 40), ignore_eos: true, stream: i % 3 !== 0 };
      try {
        const res = await fetch(`${s.url}/v1/${i % 5 === 0 ? "batch/" : ""}completions`, {
          method: "POST", signal: ctrl.signal,
          headers: { "content-type": "application/json", authorization: `Bearer ${keys[c % 3]!}` }, body: JSON.stringify(body),
        });
        await res.text();
        if (res.status === 200) counts.served++;
        else if (res.status === 429) counts.rejected++;
        else counts.failed++;
      } catch {
        if (ctrl.signal.aborted) counts.aborted++;
        else counts.failed++;
      }
    }
  };
  await Promise.all(Array.from({ length: 64 }, (_, c) => client(c)));
  clearInterval(sampler);
  const deadline = Date.now() + 10000;
  while ((await metric(s.url, "vllm:kv_cache_usage_perc")) > 0) {
    assert.ok(Date.now() < deadline, "KV usage did not return to 0");
    await new Promise((r) => setTimeout(r, 50));
  }
  const leaked = s.manager.engines.reduce((k, m) => k + m.engine.stats().blocksUsed, 0);
  console.log(`soak ${seconds}s: ${counts.served} served, ${counts.aborted} aborted by clients, ${counts.rejected} rejected (429), ` +
    `${counts.failed} failed; RSS ${Math.min(...rss).toFixed(0)}–${Math.max(...rss).toFixed(0)} MiB; leaked blocks ${leaked}`);
  assert.equal(counts.failed, 0);
  assert.equal(leaked, 0);
  assert.ok(Math.max(...rss) < 2048, "RSS stayed under 2 GiB");
  await s.close();
});
