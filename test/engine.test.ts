/** The batching engine: prefix sharing, tenant isolation, aging, preemption, invariants under random load. */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { Engine, type Runner } from "../src/engine/engine.js";
import { DEFAULT_ENGINE_CONFIG, type EngineConfig, type ModelLimits } from "../src/engine/engine-config.js";
import { Priority, Request, RequestStatus } from "../src/engine/request.js";
import { defaultSamplingParams, type SamplingParams } from "../src/engine/sampling-params.js";
import { Scheduler } from "../src/engine/scheduler.js";
import { KvCacheManager } from "../src/kv/kv-cache-manager.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { FIXTURES, assertEngineIdle } from "./helpers.js";
import { FakeRunner } from "./support/fake-runner.js";
import { StopStringMatcher } from "../src/engine/stop-strings.js";

test("stop strings are found across deltas, held back while partial, and never emitted", () => {
  const m = new StopStringMatcher(["STOP", "\n\n"]);
  assert.deepEqual(m.push("Hello ST"), { text: "Hello", stopped: null });
  assert.deepEqual(m.push("ill going S"), { text: " STill goin", stopped: null });
  assert.deepEqual(m.push("TO"), { text: "g ", stopped: null });
  assert.deepEqual(m.push("P and more"), { text: "", stopped: "STOP" });
  const n = new StopStringMatcher(["xyz"]);
  assert.deepEqual(n.push("abcxy"), { text: "abc", stopped: null });
  assert.equal(n.flush(), "xy");
  const kept = new StopStringMatcher(["STOP"], true);
  assert.deepEqual(kept.push("abSTOPcd"), { text: "abSTOP", stopped: "STOP" });
});

const CONFIG: EngineConfig = {
  ...DEFAULT_ENGINE_CONFIG, blockSize: 4, maxNumSeqs: 8, maxNumBatchedTokens: 64, enablePrefixCaching: true, agingRate: 0.1,
  maxWaitingRequests: 100, maxWaitingPerTenant: 0,
};
const LIMITS: ModelLimits = { numBlocks: 64, maxModelLen: 512, vocabSize: 1000, eosTokenIds: [] };

/** An engine with the test's config and limits, any of them overridden. */
function makeEngine(runner: Runner, over: Partial<EngineConfig & ModelLimits> = {}): Engine {
  const pick = <T extends object>(base: T): T => Object.fromEntries(Object.keys(base).map((k) => [k, k in over ? over[k as keyof typeof over] : base[k as keyof T]])) as T;
  return new Engine(runner, pick(CONFIG), pick(LIMITS));
}
const greedy = (maxTokens: number, over: Partial<SamplingParams> = {}): SamplingParams =>
  defaultSamplingParams({ temperature: 0, maxTokens, ignoreEos: true, ...over });
const range = (n: number, from = 1): number[] => Array.from({ length: n }, (_, i) => from + i);


test("two requests sharing a 3-block prefix share its physical blocks and compute only the suffix", async () => {
  const prefix = range(12); // 3 blocks of 4
  const runner = new FakeRunner();
  const engine = makeEngine(runner);
  const first = await engine.add({ promptTokenIds: [...prefix, 100, 101], params: greedy(3) }).collect();
  const computedBefore = runner.tokensComputed;
  // Hold the second request mid-generation to inspect its blocks while the first's are cached.
  const holder = engine.add({ id: "holder", promptTokenIds: [...prefix, 200], params: greedy(50) });
  const iter = holder[Symbol.asyncIterator]();
  await iter.next();
  const shared = engine.kv.blockIds("holder").slice(0, 3);
  const third = engine.add({ id: "third", promptTokenIds: [...prefix, 300, 301], params: greedy(50) });
  const it3 = third[Symbol.asyncIterator]();
  await it3.next();
  assert.deepEqual(engine.kv.blockIds("third").slice(0, 3), shared);
  for (const id of shared) assert.equal(engine.kv.pool.blocks[id]!.refCount, 2);
  engine.abort("holder");
  engine.abort("third");
  // Computed tokens for "holder": its 1-token suffix + decodes; never the 12 prefix tokens.
  const firstStepOfHolder = runner.steps.find((s) => s.some((x) => x.startPosition === 12 && x.tokenIds[0] === 200))!;
  assert.ok(firstStepOfHolder, "holder's first step starts at position 12");
  assert.ok(runner.tokensComputed - computedBefore < 2 * 12, "prefix tokens were not recomputed");
  // With caching off, the same prompts produce the same tokens.
  const plain = makeEngine(new FakeRunner(), { enablePrefixCaching: false });
  assert.deepEqual((await plain.add({ promptTokenIds: [...prefix, 100, 101], params: greedy(3) }).collect()).tokenIds, first.tokenIds);
  const cachedAgain = await engine.add({ promptTokenIds: [...prefix, 100, 101], params: greedy(3) }).collect();
  assert.deepEqual(cachedAgain.tokenIds, first.tokenIds);
  assert.equal(cachedAgain.usage!.cachedTokens, 12);
  assertEngineIdle(engine);
});

test("the same prompt from two tenants shares no blocks", async () => {
  const engine = makeEngine(new FakeRunner());
  const prompt = range(13);
  await engine.add({ promptTokenIds: prompt, params: greedy(2), tenant: "a" }).collect();
  const b = engine.add({ id: "b", promptTokenIds: prompt, params: greedy(50), tenant: "b" });
  const a2 = engine.add({ id: "a2", promptTokenIds: prompt, params: greedy(50), tenant: "a" });
  await b[Symbol.asyncIterator]().next();
  await a2[Symbol.asyncIterator]().next();
  const bBlocks = new Set(engine.kv.blockIds("b"));
  assert.ok(engine.kv.blockIds("a2").every((id) => !bBlocks.has(id)));
  engine.abort("b");
  engine.abort("a2");
  assertEngineIdle(engine);
});

function schedulerWithClock(rate: number): { s: Scheduler; clock: { t: number }; add: (p: Priority, id: string) => Request } {
  const clock = { t: 0 };
  const s = new Scheduler({ ...CONFIG, maxNumSeqs: 1, agingRate: rate }, { ...LIMITS, maxModelLen: 100 },
    new KvCacheManager(64, 4), () => clock.t);
  let seq = 0;
  const add = (p: Priority, id: string): Request => {
    const r = new Request(id, [1, 2, 3], greedy(1), p, "", "", clock.t, seq++);
    s.add(r);
    return r;
  };
  return { s, clock, add };
}

test("aging: a LOW request that waited long enough runs before a newly arrived HIGH one", () => {
  const rate = 0.1;
  const { s, clock, add } = schedulerWithClock(rate);
  add(Priority.LOW, "low");
  // LOW (2) needs (2 - 0) / rate = 20 s to reach a fresh HIGH's priority, and wins ties only by arrival.
  clock.t = 19.9;
  add(Priority.HIGH, "high-early");
  assert.equal(s.waiting.peek()!.id, "high-early");
  s.waiting.pop();
  clock.t = 20.1;
  add(Priority.HIGH, "high-late");
  assert.equal(s.waiting.peek()!.id, "low");
  const picked = s.schedule();
  assert.equal(picked[0]!.request.id, "low");
  assert.equal(s.counters.agingPromotions, 1);
});

test("aging: under a steady stream of HIGH requests, a LOW request's wait is bounded by (LOW − HIGH) / rate", () => {
  const rate = 0.5, interval = 0.25;
  const { s, clock, add } = schedulerWithClock(rate);
  const low = add(Priority.LOW, "low");
  let n = 0;
  // One request runs per step (maxNumSeqs 1, each finishes in one step); a HIGH request arrives every step.
  while (low.status === RequestStatus.WAITING) {
    add(Priority.HIGH, `h${n++}`);
    const [picked] = s.schedule();
    s.update([picked!], [7]); // one token of max_tokens 1: finished
    clock.t += interval;
    assert.ok(clock.t < 100, "LOW starved");
  }
  const bound = (Priority.LOW - Priority.HIGH) / rate;
  assert.ok(low.scheduledTime! <= bound + interval, `LOW waited ${low.scheduledTime}s, bound ${bound}s`);
  assert.ok(low.scheduledTime! >= bound - interval, "LOW should not jump the queue before it has aged");
});

async function runAll(engine: Engine, prompts: number[][], maxTokens: number): Promise<number[][]> {
  const outs = await Promise.all(prompts.map((p, i) => engine.add({ promptTokenIds: p, params: greedy(maxTokens), priority: (i % 3) as Priority }).collect()));
  for (const o of outs) assert.equal(o.finishReason, "length");
  return outs.map((o) => o.tokenIds);
}

test("preemption with a tiny pool: every request completes, outputs equal a large pool's, no leaks", async () => {
  const prompts = Array.from({ length: 12 }, (_, i) => range(5 + ((i * 7) % 13), i * 10));
  const big = makeEngine(new FakeRunner());
  const expected = await runAll(big, prompts, 20);
  const tiny = makeEngine(new FakeRunner(), { numBlocks: 12 });
  const got = await runAll(tiny, prompts, 20);
  assert.deepEqual(got, expected);
  assert.ok(tiny.stats().preemptions > 0, "the tiny pool must have preempted");
  assertEngineIdle(tiny);
  assertEngineIdle(big);
});

test("admission errors: beyond the context, never fitting the pool, a full queue", () => {
  const engine = makeEngine(new FakeRunner(), { numBlocks: 4, maxWaitingRequests: 2 });
  assert.throws(() => engine.add({ promptTokenIds: range(500), params: greedy(20) }), /maximum context length is 512/);
  assert.throws(() => engine.add({ promptTokenIds: range(10), params: greedy(10) }), /can never fit the KV cache/);
  assert.throws(() => engine.add({ promptTokenIds: [5000], params: greedy(1) }), /outside the vocabulary/);
  // The first is scheduled at once; the next two wait while its step runs.
  for (let i = 0; i < 3; i++) engine.add({ promptTokenIds: [1], params: greedy(1) });
  assert.equal(engine.stats().waiting, 2);
  assert.throws(() => engine.add({ promptTokenIds: [1], params: greedy(1) }), /queue is full/);
});

test("stop token ids and EOS end generation; ignore_eos keeps going", async () => {
  const engine = makeEngine(new FakeRunner(), { eosTokenIds: [] });
  const free = await engine.add({ promptTokenIds: [3], params: greedy(6) }).collect();
  const stopAt = free.tokenIds[2]!;
  const byId = await engine.add({ promptTokenIds: [3], params: greedy(6, { stopTokenIds: [stopAt] }) }).collect();
  assert.deepEqual(byId.tokenIds, free.tokenIds.slice(0, 3));
  assert.equal(byId.finishReason, "stop");
  const eos = makeEngine(new FakeRunner(), { eosTokenIds: [stopAt] });
  const byEos = await eos.add({ promptTokenIds: [3], params: greedy(6, { ignoreEos: false }) }).collect();
  assert.equal(byEos.finishReason, "stop");
  assert.equal(byEos.tokenIds.length, 3);
  const ignored = await eos.add({ promptTokenIds: [3], params: greedy(6, { ignoreEos: true }) }).collect();
  assert.equal(ignored.tokenIds.length, 6);
});

test("a step's tokens reach the stream while the next step computes; the last one once the loop ends", async () => {
  // A device-like runner: the step computes for a few ms after execute() returns, the event loop free.
  const fake = new FakeRunner();
  let launched = 0, inFlight = 0;
  const runner: Runner = {
    execute: (seqs) => {
      launched++;
      inFlight++;
      const result = fake.execute(seqs);
      return new Promise((resolve) => setTimeout(() => (inFlight--, resolve(result)), 3));
    },
  };
  // The latency observer is called as each token is emitted (a stream's reader runs later).
  const seen: { launched: number; inFlight: number }[] = [];
  const record = (): void => void seen.push({ launched, inFlight });
  const engine = new Engine(runner, CONFIG, LIMITS, null, undefined, { timeToFirstToken: record, interTokenLatency: record });
  const out = await engine.add({ promptTokenIds: [5, 6, 7], params: greedy(5) }).collect();
  assert.equal(out.tokenIds.length, 5);
  // Token i comes from step i + 1 and is emitted once step i + 2 is launched; the fifth ends the request, so no sixth step.
  assert.deepEqual(seen, [...[2, 3, 4, 5].map((n) => ({ launched: n, inFlight: 1 })), { launched: 5, inFlight: 0 }]);
  assertEngineIdle(engine);
});

test("randomized: invariants hold after every step under arrivals, aborts, priorities and tenants", async () => {
  for (const seed of [1, 2, 3]) {
    let s = seed;
    const rand = (): number => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32);
    const runner = new FakeRunner();
    const engine = makeEngine(runner, { numBlocks: 40, maxNumSeqs: 6, maxNumBatchedTokens: 24, maxWaitingRequests: 1000 });
    const check = (): void => {
      const pool = engine.kv.pool;
      const holders = new Map<number, number>();
      for (const r of engine.scheduler.running) for (const id of engine.kv.blockIds(r.id)) holders.set(id, (holders.get(id) ?? 0) + 1);
      for (const b of pool.blocks) assert.equal(b.refCount, holders.get(b.id) ?? 0, `block ${b.id} ref count`);
      const st = engine.stats();
      assert.equal(st.blocksFree + st.blocksUsed, st.blocksTotal);
      assert.equal(pool.freeOrder().length, st.blocksFree);
      // A block in two tables must be a cached (hashed) one: shared only through the prefix cache.
      for (const [id, n] of holders) if (n > 1) assert.notEqual(pool.blocks[id]!.hash, null);
    };
    const original = runner.execute.bind(runner);
    runner.execute = async (seqs) => {
      check();
      return original(seqs);
    };
    const done: Promise<{ finishReason?: string }>[] = [];
    const ids: string[] = [];
    for (let i = 0; i < 150; i++) {
      const shared = rand() < 0.5 ? range(8, 500) : [];
      const prompt = [...shared, ...range(1 + Math.floor(rand() * 20), Math.floor(rand() * 400))];
      const id = `r${seed}-${i}`;
      ids.push(id);
      done.push(engine.add({ id, promptTokenIds: prompt, params: greedy(1 + Math.floor(rand() * 15)),
        priority: Math.floor(rand() * 3) as Priority, tenant: rand() < 0.5 ? "x" : "y" }).collect());
      if (rand() < 0.2) engine.abort(ids[Math.floor(rand() * ids.length)]!);
      if (rand() < 0.3) await new Promise((r) => setImmediate(r));
    }
    const results = await Promise.all(done);
    for (const r of results) assert.ok(["length", "abort"].includes(r.finishReason!), `finished: ${r.finishReason}`);
    check();
    assertEngineIdle(engine);
    assert.ok(runner.steps.length > 100, "ran thousands of sequence-steps");
  }
});

test("a failed step ends its requests with an error and the engine keeps serving", async () => {
  const engine = makeEngine(new FakeRunner());
  const failing: Runner = { execute: () => Promise.reject(new Error("boom")) };
  const broken = makeEngine(failing);
  const out = await broken.add({ promptTokenIds: [1, 2], params: greedy(3) }).collect();
  assert.equal(out.finishReason, "error");
  assert.match(out.error!, /boom/);
  assertEngineIdle(broken);
  const ok = await engine.add({ promptTokenIds: [1, 2], params: greedy(3) }).collect();
  assert.equal(ok.tokenIds.length, 3);
});

test("real model: 32 concurrent requests each equal their solo run", async () => {
  const ckpt = loadCheckpoint(path.join(FIXTURES, "tiny-qwen3"));
  const engine = makeEngine(await ModelRunner.create(ckpt, { numBlocks: 256, blockSize: 8 }),
    { numBlocks: 256, blockSize: 8, maxNumSeqs: 32, maxNumBatchedTokens: 128, vocabSize: ckpt.config.vocab, maxModelLen: 256 });
  const prompts = Array.from({ length: 32 }, (_, i) => Array.from({ length: 3 + ((i * 5) % 29) }, (_, j) => (i * 7919 + j * 104729) % 150000));
  const params = (i: number): SamplingParams => i % 2 ? greedy(12) : defaultSamplingParams({ temperature: 0.9, topP: 0.95, seed: i, maxTokens: 12, ignoreEos: true });
  const solo: number[][] = [];
  for (const [i, p] of prompts.entries()) solo.push((await engine.add({ promptTokenIds: p, params: params(i) }).collect()).tokenIds);
  const together = await Promise.all(prompts.map((p, i) => engine.add({ promptTokenIds: p, params: params(i) }).collect()));
  assert.deepEqual(together.map((o) => o.tokenIds), solo);
  assertEngineIdle(engine);
});

test("penalties change what is sampled; without them the same request repeats itself", async () => {
  const ckpt = loadCheckpoint(path.join(FIXTURES, "tiny-qwen3"));
  const engine = makeEngine(await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: 16 }), { numBlocks: 64, blockSize: 16, vocabSize: ckpt.config.vocab });
  const run = async (over: Partial<SamplingParams>): Promise<number[]> =>
    (await engine.add({ promptTokenIds: [352, 24944, 50865, 95443, 92077], params: greedy(12, over) }).collect()).tokenIds;
  const plain = await run({});
  assert.ok(new Set(plain).size < plain.length, "greedy decoding of the fixture repeats a token");
  const rep = await run({ repetitionPenalty: 3 });
  const pres = await run({ presencePenalty: 2 });
  const freq = await run({ frequencyPenalty: 2 });
  for (const out of [rep, pres, freq]) {
    assert.notDeepEqual(out, plain);
    assert.ok(new Set(out).size > new Set(plain).size, "penalties discourage repeats");
  }
  assert.deepEqual(await run({}), plain);
});

test("EngineManager: engines on first use; past --max-loaded-models the least recently used idle one is unloaded", async () => {
  const { EngineManager, DEFAULT_ENGINE_CONFIG } = await import("../src/engine/engine-manager.js");
  const dir = path.join(FIXTURES, "tiny-qwen3");
  const m = new EngineManager(new Map([["a", dir], ["b", dir], ["c", dir]]), { ...DEFAULT_ENGINE_CONFIG, kvCacheMemory: 2 ** 22 }, 2);
  assert.deepEqual(m.engines.map((e) => e.id), []);
  await m.acquire("a", "t");
  await new Promise((r) => setTimeout(r, 5));
  await m.acquire("b", "t");
  await new Promise((r) => setTimeout(r, 5));
  await m.acquire("a", "t"); // a is now the most recently used
  await m.acquire("c", "t");
  assert.deepEqual(m.engines.map((e) => e.id).sort(), ["a", "c"]);
  await m.shutdown(0);
  assert.deepEqual(m.engines, []);
});

test("fair share: B's one request behind A's 200 (same tier) starts within the next max-num-seqs admissions; with --no-fair-share, after all of them", () => {
  const maxNumSeqs = 4;
  for (const fairShare of [true, false]) {
    const clock = { t: 0 };
    const s = new Scheduler({ ...CONFIG, maxNumSeqs, maxNumBatchedTokens: 1000, fairShare }, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => clock.t);
    let seq = 0;
    const add = (tenant: string, id: string, p = Priority.NORMAL): void => s.add(new Request(id, [1, 2, 3], greedy(4), p, tenant, tenant, clock.t, seq++));
    for (let i = 0; i < 200; i++) add("A", `a${i}`);
    const order: string[] = [];
    const step = (): void => {
      for (const x of s.schedule()) if (!order.includes(x.request.id)) order.push(x.request.id);
      for (const r of [...s.running]) s.finish(r, RequestStatus.FINISHED_LENGTH);
      clock.t += 0.05;
    };
    step(); // A's first four run
    add("B", "b");
    const admittedBefore = order.length;
    while (s.hasWork) step();
    const after = order.indexOf("b") - admittedBefore;
    if (fairShare) assert.ok(after < maxNumSeqs, `B admitted ${after} admissions after it arrived`);
    else assert.equal(after, 196, "first come, first served: B waits behind all of A's");
  }
});

test("fair share weighs tokens: a tenant served much waits behind one served little; priorities and aging still rule across tiers", () => {
  const clock = { t: 0 };
  const s = new Scheduler({ ...CONFIG, maxNumSeqs: 1, maxNumBatchedTokens: 1000 }, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => clock.t);
  let seq = 0;
  const add = (tenant: string, id: string, maxTokens: number, p = Priority.NORMAL): void =>
    s.add(new Request(id, [1, 2, 3], greedy(maxTokens), p, tenant, tenant, clock.t, seq++));
  // Big asks 3 × 300 tokens, small asks 3 × 10, all at once: small's cheap requests are not stuck behind big's.
  for (let i = 0; i < 3; i++) add("big", `big${i}`, 300);
  for (let i = 0; i < 3; i++) add("small", `small${i}`, 10);
  add("vip", "vip", 10, Priority.HIGH);
  const order: string[] = [];
  while (s.hasWork) {
    for (const x of s.schedule()) order.push(x.request.id);
    for (const r of [...s.running]) s.finish(r, RequestStatus.FINISHED_LENGTH);
    clock.t += 0.01;
  }
  assert.equal(order[0], "vip", "HIGH first, whatever the shares");
  assert.deepEqual(order.slice(1, 5), ["big0", "small0", "small1", "small2"], "after big's first turn, small's are all cheaper than big's next");
});

test("a step that computes a better-priority request's first token leaves out the worse rows it runs before; aged rows stay", () => {
  const clock = { t: 0 };
  // This rule alone: no LOW row cap while the NORMAL request runs (tested below).
  const cfg = { ...CONFIG, maxNumSeqs: 8, maxNumBatchedTokens: 1000, lowPriorityRowsWhileInteractive: 0 };
  const s = new Scheduler(cfg, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => clock.t);
  let seq = 0;
  const add = (id: string, p: Priority): Request => {
    const r = new Request(id, [1, 2, 3], greedy(50), p, "t", "t", clock.t, seq++);
    s.add(r);
    return r;
  };
  const run = (): string[] => {
    const out = s.schedule();
    s.update(out, out.map((x) => (x.sample ? 7 : null)));
    return out.map((x) => x.request.id).sort();
  };
  add("aged", Priority.LOW); // arrives 20 s before the NORMAL request: at 0.1/s it is ahead in aging order
  run();
  clock.t = 20;
  add("low", Priority.LOW);
  run();
  assert.deepEqual(run(), ["aged", "low"], "both LOW rows decode together");
  add("normal", Priority.NORMAL);
  assert.deepEqual(run(), ["aged", "normal"], "the NORMAL first token's step leaves out the LOW row it runs before");
  assert.deepEqual(run(), ["aged", "low", "normal"], "after its first token every row runs again");
  add("low2", Priority.LOW);
  assert.deepEqual(run(), ["aged", "low", "low2", "normal"], "a first token of the worst priority defers nobody");
});

test("a first token's step leaves out a worse prompt chunk that aged ahead, once only", () => {
  const clock = { t: 0 };
  const cfg = { ...CONFIG, maxNumSeqs: 8, maxNumBatchedTokens: 1000, lowPriorityRowsWhileInteractive: 0 };
  const s = new Scheduler(cfg, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => clock.t);
  let seq = 0;
  const add = (id: string, p: Priority): void => s.add(new Request(id, range(8, 100 * seq), greedy(50), p, "t", "t", clock.t, seq++));
  const run = (): Record<string, number> => {
    const out = s.schedule();
    s.update(out, out.map((x) => (x.sample ? 7 : null)));
    return Object.fromEntries(out.map((x) => [x.request.id, x.numTokens]));
  };
  add("aged", Priority.LOW); // queued 20 s before the NORMAL requests: ahead of them in aging order
  clock.t = 20;
  add("n1", Priority.NORMAL);
  assert.deepEqual(run(), { n1: 8 }, "the aged LOW prompt is admitted first but left out of n1's first-token step");
  add("n2", Priority.NORMAL);
  assert.deepEqual(run(), { aged: 8, n1: 1, n2: 8 }, "left out once only: it computes its prompt beside n2's");
});

test("LOW-priority prefill is capped per step (--low-priority-prefill-tokens); decode tokens and other tiers are not", () => {
  const s = new Scheduler({ ...CONFIG, maxNumSeqs: 8, maxNumBatchedTokens: 1000, lowPriorityPrefillTokens: 32 }, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => 0);
  let seq = 0;
  const add = (id: string, p: Priority): void => s.add(new Request(id, range(40, 100 * seq), greedy(5), p, "t", "t", 0, seq++)); // no shared prefix
  const run = (): Record<string, number> => {
    const out = s.schedule();
    s.update(out, out.map((x) => (x.sample ? 7 : null)));
    return Object.fromEntries(out.map((x) => [x.request.id, x.numTokens]));
  };
  add("a", Priority.LOW);
  add("b", Priority.LOW);
  assert.deepEqual(run(), { a: 32 }, "32 LOW prompt tokens in the first step; b waits");
  assert.deepEqual(run(), { a: 8, b: 24 }, "a finishes its prompt, b takes the rest of the allowance");
  assert.deepEqual(run(), { a: 1, b: 16 }, "a decodes uncapped");
  add("n", Priority.NORMAL);
  assert.deepEqual(run(), { n: 40 }, "a NORMAL prompt is not capped (its first token's step leaves the LOW rows out)");
  assert.deepEqual(run(), { a: 1, b: 1, n: 1 });
});

test("while HIGH/NORMAL work is about, LOW rows per step are capped, oldest first; the cap lifts after the window (--low-priority-rows-while-interactive)", () => {
  const clock = { t: 0 };
  const cfg = { ...CONFIG, maxNumSeqs: 8, maxNumBatchedTokens: 1000, lowPriorityRowsWhileInteractive: 2, interactiveWindowMs: 1000 };
  const s = new Scheduler(cfg, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => clock.t);
  let seq = 0;
  const add = (id: string, p: Priority, tokens = 50): void => s.add(new Request(id, [seq * 10 + 1, seq * 10 + 2], greedy(tokens), p, "t", "t", clock.t, seq++));
  const run = (): string[] => {
    const out = s.schedule();
    s.update(out, out.map((x) => (x.sample ? 7 : null)));
    return out.map((x) => x.request.id).sort();
  };
  for (const id of ["l1", "l2", "l3", "l4"]) add(id, Priority.LOW);
  assert.deepEqual(run(), ["l1", "l2", "l3", "l4"], "no interactive work: every LOW row runs");
  add("n", Priority.NORMAL, 3);
  assert.deepEqual(run(), ["n"], "the NORMAL first token's step leaves the LOW rows out");
  assert.deepEqual(run(), ["l1", "l2", "n"], "while it runs, two LOW rows per step, the oldest");
  assert.deepEqual(run(), ["l1", "l2", "n"]);
  clock.t += 0.5;
  assert.deepEqual(run(), ["l1", "l2"], "within the window after it ends, still two");
  clock.t += 0.6;
  assert.deepEqual(run(), ["l1", "l2", "l3", "l4"], "after the window, every LOW row again");
  const off = new Scheduler({ ...cfg, lowPriorityRowsWhileInteractive: 0 }, { ...LIMITS, numBlocks: 4096 }, new KvCacheManager(4096, 4), () => 0);
  for (const [id, p] of [["a", Priority.LOW], ["b", Priority.LOW], ["c", Priority.LOW], ["h", Priority.HIGH]] as const) {
    off.add(new Request(id, [seq, seq + 1], greedy(9), p, "t", "t", 0, seq++));
  }
  const first = off.schedule();
  off.update(first, first.map(() => 7));
  assert.equal(off.schedule().length, 4, "0 turns the cap off");
});

test("a full batch yields a slot to a waiting request of better priority; the preempted one completes later, unchanged", async () => {
  const runner = new FakeRunner();
  const engine = makeEngine(runner, { maxNumSeqs: 2 });
  const low = [0, 1].map((i) => engine.add({ id: `low${i}`, promptTokenIds: [5 + i, 6], params: greedy(40), priority: Priority.LOW }));
  const firsts = low.map((s) => s[Symbol.asyncIterator]());
  await Promise.all(firsts.map((it) => it.next())); // both LOW requests are running
  const stepsBefore = runner.steps.length;
  const normal = await engine.add({ id: "normal", promptTokenIds: [9, 9], params: greedy(3), priority: Priority.NORMAL }).collect();
  assert.equal(normal.tokenIds.length, 3);
  // Waiting for a LOW request to end would take 38 more steps; a yielded slot takes its 3 plus the step in flight.
  assert.ok(runner.steps.length - stepsBefore <= 8, `NORMAL finished in ${runner.steps.length - stepsBefore} steps, without waiting for a LOW one to end`);
  assert.ok(engine.stats().preemptions >= 1, "a LOW request was preempted for it");
  const solo = await makeEngine(new FakeRunner()).add({ promptTokenIds: [5, 6], params: greedy(40) }).collect();
  const rest = await Promise.all(low.map((s) => s.collect()));
  assert.deepEqual(rest.map((o) => o.finishReason), ["length", "length"]);
  assert.equal(rest[0]!.tokenIds.length + 1, solo.tokenIds.length, "the preempted request's output is its solo output (less the token already read)");
  assertEngineIdle(engine);
});
