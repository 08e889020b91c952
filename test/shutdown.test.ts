/** SIGTERM while requests stream: each ends complete or with an explicit error event; the process exits 0. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { ROOT, tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";

async function readSse(res: Response): Promise<{ events: Record<string, unknown>[]; done: boolean }> {
  const text = await res.text();
  const events: Record<string, unknown>[] = [];
  let done = false;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    if (line === "data: [DONE]") done = true;
    else events.push(JSON.parse(line.slice(6)) as Record<string, unknown>);
  }
  return { events, done };
}

test("SIGTERM: streams finish or end with an error event, new requests get 503, exit code 0", async () => {
  const child = spawn(process.execPath, [path.join(ROOT, "dist", "src", "cli.js"), "serve", "--model", `tiny=${fixtureModelDir()}`,
    "--port", "0", "--db", path.join(tempDir(), "db.sqlite"), "--shutdown-timeout", "1.5", "--kv-cache-memory", "67108864"],
    { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  const deadline = Date.now() + 20000;
  while (!/listening on (http:\/\/127\.0\.0\.1:\d+)/.test(out)) {
    assert.ok(Date.now() < deadline, `server did not start: ${out}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const url = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out)![1]!;
  const request = (maxTokens: number): Promise<Response> => fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: maxTokens, ignore_eos: true, stream: true }),
  });
  // Under load: eight short requests finish inside the drain window; eight long ones cannot.
  const lengths = [20, 20, 20, 20, 20, 20, 20, 20, 3000, 3000, 3000, 3000, 3000, 3000, 3000, 3000];
  const responses = await Promise.all(lengths.map(request));
  const bodies = responses.map(readSse);
  await new Promise((r) => setTimeout(r, 300));
  child.kill("SIGTERM");
  await new Promise((r) => setTimeout(r, 100));
  // The long streams cannot finish, so the server is still draining (1.5 s) and answers new requests with 503.
  const late = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  assert.equal(late.status, 503);
  assert.ok(late.headers.get("retry-after"));
  const results = await Promise.all(bodies);
  for (const [i, r] of results.entries()) {
    assert.ok(r.done, `stream ${i} ended with [DONE]`);
    const finish = r.events.map((e) => (e.choices as { finish_reason: string | null }[] | undefined)?.[0]?.finish_reason).find((f) => f);
    const error = r.events.find((e) => e.error);
    if (lengths[i] === 20) assert.equal(finish, "length", "short requests complete");
    else assert.ok(error, "long requests end with an explicit error event");
  }
  assert.equal(await exited, 0);
});
