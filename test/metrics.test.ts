/**
 * /metrics as vLLM writes it, across a load → unload → reload cycle
 * (--max-loaded-models 1, two models): every scrape answers 200, every line
 * parses, counters never go backwards, an unloaded model's gauges are gone.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, fixtureModelDir, type TestServer } from "./support/server.js";

let s: TestServer;
before(async () => (s = await startServer({ models: { other: fixtureModelDir() }, maxLoadedModels: 1 })));
after(async () => s.close());

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses the exposition text line by line; throws on any line that is neither a comment nor a sample. */
function parse(text: string): { samples: Sample[]; types: Map<string, string> } {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const type = /^# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$/.exec(line);
    if (type) {
      types.set(type[1]!, type[2]!);
      continue;
    }
    if (/^# HELP \S+ .*$/.test(line)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `unparsable line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    const value = m[3] === "+Inf" ? Infinity : Number(m[3]);
    assert.ok(!Number.isNaN(value), `bad value: ${line}`);
    samples.push({ name: m[1]!, labels, value });
  }
  return { samples, types };
}

async function scrape(): Promise<{ samples: Sample[]; types: Map<string, string> }> {
  const res = await fetch(`${s.url}/metrics`);
  assert.equal(res.status, 200);
  return parse(await res.text());
}

const key = (x: Sample): string => `${x.name}${JSON.stringify(x.labels)}`;

async function complete(model: string, prompt: string | string[], maxTokens = 3): Promise<Record<string, unknown>> {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(res.status, 200);
  return (await res.json()) as Record<string, unknown>;
}

test("load → unload → reload: 200 on every scrape, every line parsed, counters monotonic, unloaded gauges removed", async () => {
  const seen = new Map<string, number>();
  const check = async (loaded: string, unloaded: string | null): Promise<Sample[]> => {
    const { samples, types } = await scrape();
    for (const x of samples) {
      if (x.name !== "weft_loaded_models") assert.ok(x.labels.model_name, `${x.name} carries model_name`);
      const family = types.get(x.name) ?? types.get(x.name.replace(/_(bucket|sum|count)$/, ""));
      assert.ok(family, `${x.name} has a TYPE line`);
      if (family === "counter" || family === "histogram") {
        const before = seen.get(key(x)) ?? 0;
        assert.ok(x.value >= before, `${key(x)} went backwards: ${before} → ${x.value}`);
        seen.set(key(x), x.value);
      }
    }
    const gauges = samples.filter((x) => ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"].includes(x.name));
    assert.ok(gauges.some((x) => x.labels.model_name === loaded), `gauges of ${loaded}`);
    if (unloaded) assert.ok(!gauges.some((x) => x.labels.model_name === unloaded), `no gauges of unloaded ${unloaded}`);
    return samples;
  };
  const total = (samples: Sample[], name: string, model: string): number =>
    samples.filter((x) => x.name === name && x.labels.model_name === model).reduce((n, x) => n + x.value, 0);

  // A shared prefix, so prefix-cache counters move.
  const prefix = "the quick brown fox jumps over the lazy dog ".repeat(8);
  await complete("tiny", prefix + "one");
  await complete("tiny", prefix + "two");
  const first = await check("tiny", null);
  const hitsBefore = total(first, "vllm:prefix_cache_hits_total", "tiny");
  assert.ok(hitsBefore > 0, "prefix cache hits counted");
  await complete("other", "unload tiny");
  await check("other", "tiny");
  await complete("tiny", prefix + "three"); // reload: a new engine, whose own counters start at 0
  const last = await check("tiny", "other");
  assert.ok(total(last, "vllm:prefix_cache_queries_total", "tiny") > total(first, "vllm:prefix_cache_queries_total", "tiny"), "queries continue across reload");
  assert.equal(total(last, "vllm:request_success_total", "tiny"), 3);
  assert.equal(total(last, "vllm:request_success_total", "other"), 1);
});

test("usage.prompt_tokens_details.cached_tokens is summed over prompts", async () => {
  const prefix = "a long shared prefix that fills whole blocks of the cache ".repeat(6);
  await complete("tiny", prefix + "warm");
  const body = await complete("tiny", [prefix + "x", prefix + "y"], 1);
  const usage = body.usage as { prompt_tokens_details: { cached_tokens: number } };
  const blockSize = 16;
  const prefixTokens = (await complete("tiny", prefix, 1)).usage as { prompt_tokens: number };
  const perPrompt = Math.floor((prefixTokens.prompt_tokens - 1) / blockSize) * blockSize;
  assert.ok(perPrompt >= 32);
  assert.equal(usage.prompt_tokens_details.cached_tokens, 2 * perPrompt, "both prompts' cached tokens count");
});
