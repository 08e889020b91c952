/** Fair admission: queue room reserved by priority, per-tenant caps, whole groups; token reservations and refunds. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AdmissionPolicy, refusalError, type Admission, type AdmissionGroup } from "../src/engine/admission.js";
import { EngineError } from "../src/engine/errors.js";
import { RequestQueue, agingKey, runsBefore } from "../src/engine/request-queue.js";
import type { Costed } from "../src/engine/fair-share.js";
import { Priority } from "../src/engine/request.js";
import { ApiError } from "../src/server/errors.js";
import { RateLimiter, type RateAdmission, type RateLimits } from "../src/server/rate-limiter.js";

interface Item extends Costed {
  id: string;
}

/** A waiting queue and an admit() that does what Engine.addGroup does: check the whole group, then push all of it. */
function queueWith(maxWaitingRequests: number, maxWaitingPerTenant: number): {
  q: RequestQueue<Item>;
  admit: (priority: Priority, tenant: string, sequences: number) => Admission;
} {
  const q = new RequestQueue<Item>(0.1);
  const policy = new AdmissionPolicy({ maxWaitingRequests, maxWaitingPerTenant });
  let seq = 0;
  const admit = (priority: Priority, tenant: string, sequences: number): Admission => {
    const g: AdmissionGroup = { priority, tenant, sequences };
    const a = policy.check(q, g);
    if (a.ok) for (let i = 0; i < sequences; i++) q.push({ id: `${tenant}-${seq}`, priority, tenant, arrivalTime: 0, sequence: seq++, fairShareCost: 1 });
    return a;
  };
  return { q, admit };
}

const counts = (q: RequestQueue<Item>): number[] => [...q.counts];

test("a LOW flood of 1024 sequences takes half the queue; NORMAL and HIGH are still admitted", () => {
  const { q, admit } = queueWith(1024, 256);
  // 16 batch tenants, each one request of 4 prompts × n 16: only the LOW half of the queue fills.
  const flood = Array.from({ length: 16 }, (_, i) => admit(Priority.LOW, `batch-${i}`, 64));
  assert.equal(flood.filter((a) => a.ok).length, 8);
  assert.deepEqual(counts(q), [0, 0, 512]);
  const refused = flood[8]!;
  assert.ok(!refused.ok && refused.code === "queue_full" && refused.limit === "priority_share", JSON.stringify(refused));
  assert.equal(refused.retryAfter, 1);
  assert.match(refused.message, /queue is full for low priority: requests of low priority or lower hold 512 of the 512 places/);
  assert.deepEqual(admit(Priority.NORMAL, "interactive", 16), { ok: true });
  assert.deepEqual(admit(Priority.HIGH, "premium", 16), { ok: true });
  assert.deepEqual(counts(q), [16, 16, 512]);
});

test("nested shares: NORMAL fills up to 3/4 of the queue with LOW, HIGH the rest; then the total refuses", () => {
  const { q, admit } = queueWith(1024, 0);
  for (let i = 0; i < 8; i++) assert.ok(admit(Priority.LOW, "batch", 64).ok);
  let normal = 0;
  while (admit(Priority.NORMAL, `n${normal}`, 16).ok) normal++;
  assert.equal(normal, 16, "NORMAL gets the 256 places between LOW's 512 and NORMAL's 768");
  const n = admit(Priority.NORMAL, "late", 1);
  assert.ok(!n.ok && n.limit === "priority_share");
  assert.match(n.message, /requests of normal priority or lower hold 768 of the 768 places/);
  let high = 0;
  while (admit(Priority.HIGH, `h${high}`, 16).ok) high++;
  assert.equal(high, 16, "HIGH gets the last 256 places");
  assert.deepEqual(counts(q), [256, 256, 512]);
  const h = admit(Priority.HIGH, "late", 1);
  assert.ok(!h.ok && h.code === "queue_full" && h.limit === "total");
  assert.match(h.message, /the queue is full: 1024 of its 1024 places are taken; this request has 1 sequences/);
  // With HIGH traffic waiting, LOW may still use its half when there is room: room is only reserved upward.
  const { admit: admit2 } = queueWith(1024, 0);
  assert.ok(admit2(Priority.HIGH, "h", 500).ok);
  assert.ok(admit2(Priority.LOW, "l", 512).ok);
  const low = admit2(Priority.LOW, "l", 1);
  assert.ok(!low.ok && low.limit === "priority_share");
  const over = admit2(Priority.HIGH, "h", 13);
  assert.ok(!over.ok && over.limit === "total", "HIGH past the whole queue: the total refuses");
  assert.ok(admit2(Priority.HIGH, "h", 12).ok);
});

test("one request of 64 prompts × n 16 is refused whole and for good: 400 naming n", () => {
  const { q, admit } = queueWith(1024, 256);
  const a = admit(Priority.LOW, "batch", 64 * 16);
  assert.ok(!a.ok && a.code === "invalid_request" && a.limit === "tenant" && a.param === "n", JSON.stringify(a));
  assert.match(a.message, /1024 sequences \(prompts × n\), more than the 256 one API key may have waiting/);
  const uncapped = queueWith(1024, 0).admit(Priority.LOW, "batch", 64 * 16);
  assert.ok(!uncapped.ok && uncapped.code === "invalid_request" && uncapped.limit === "priority_share");
  assert.match(uncapped.message, /more than the 512 low-priority sequences the queue may hold/);
  const tooBig = queueWith(1024, 0).admit(Priority.HIGH, "premium", 1025);
  assert.ok(!tooBig.ok && tooBig.code === "invalid_request" && tooBig.limit === "total");
  assert.equal(q.size, 0);
  // The engine's errors: a permanent refusal is invalid_request on `n`, a temporary one queue_full with Retry-After.
  const e = refusalError(a);
  assert.ok(e instanceof EngineError && e.code === "invalid_request" && e.param === "n");
  const { admit: admitSmall } = queueWith(2, 0);
  admitSmall(Priority.HIGH, "t", 2);
  const full = admitSmall(Priority.HIGH, "t", 1);
  assert.ok(!full.ok);
  const f = refusalError(full);
  assert.equal(f.code, "queue_full");
  assert.equal(f.retryAfter, 1);
});

test("per-tenant cap: a tenant at its cap is refused while another is admitted; room comes back as its requests leave", () => {
  const { q, admit } = queueWith(1024, 256);
  for (let i = 0; i < 16; i++) assert.ok(admit(Priority.NORMAL, "a", 16).ok);
  assert.equal(q.waitingOf("a"), 256);
  const a = admit(Priority.NORMAL, "a", 1);
  assert.ok(!a.ok && a.code === "queue_full" && a.limit === "tenant");
  assert.match(a.message, /this API key already has 256 sequences waiting, of the 256 it may have; this request has 1/);
  assert.deepEqual(admit(Priority.NORMAL, "b", 16), { ok: true });
  for (let i = 0; i < 16; i++) assert.equal(q.pop()!.tenant, "a", "a arrived first");
  assert.equal(q.waitingOf("a"), 240);
  assert.deepEqual(admit(Priority.NORMAL, "a", 16), { ok: true });
  assert.equal(q.waitingOf("a"), 256);
});

test("all or nothing: a group one sequence too large is refused and changes nothing; a group that exactly fits is admitted", () => {
  const { q, admit } = queueWith(10, 0);
  assert.ok(admit(Priority.HIGH, "t", 7).ok);
  const a = admit(Priority.HIGH, "u", 4);
  assert.ok(!a.ok && a.limit === "total");
  assert.equal(q.size, 7);
  assert.equal(q.waitingOf("u"), 0);
  assert.ok(admit(Priority.HIGH, "u", 3).ok);
  assert.equal(q.size, 10);
  // Shares round up: a one-place queue admits a request of any priority when empty.
  for (const p of [Priority.HIGH, Priority.NORMAL, Priority.LOW]) assert.ok(queueWith(1, 0).admit(p, "t", 1).ok);
});

test("the queue's counts per priority and per tenant follow push, pop and remove", () => {
  const q = new RequestQueue<Item>(0.1);
  const items: Item[] = [
    { id: "a0", priority: Priority.LOW, tenant: "a", arrivalTime: 0, sequence: 0, fairShareCost: 1 },
    { id: "b0", priority: Priority.HIGH, tenant: "b", arrivalTime: 1, sequence: 1, fairShareCost: 1 },
    { id: "a1", priority: Priority.NORMAL, tenant: "a", arrivalTime: 2, sequence: 2, fairShareCost: 1 },
    { id: "c0", priority: Priority.HIGH, tenant: "c", arrivalTime: 30, sequence: 3, fairShareCost: 1 },
  ];
  for (const r of items) q.push(r);
  assert.deepEqual(counts(q), [2, 1, 1]);
  assert.deepEqual(["a", "b", "c", "d"].map((t) => q.waitingOf(t)), [2, 1, 1, 0]);
  assert.ok(q.remove(items[2]!));
  assert.equal(q.remove(items[2]!), false, "a second remove finds nothing and changes no count");
  assert.deepEqual(counts(q), [2, 0, 1]);
  assert.equal(q.waitingOf("a"), 1);
  // Keys 1.1 (b0), 2 (a0), 3 (c0): the LOW request has aged past the HIGH one that came 30 s later.
  assert.deepEqual([q.pop()!.id, q.pop()!.id], ["b0", "a0"]);
  assert.equal(q.waitingOf("a"), 0);
  assert.deepEqual(counts(q), [1, 0, 0]);
  assert.equal(q.pop()!.id, "c0");
  assert.deepEqual([q.size, q.waitingOf("c"), ...counts(q)], [0, 0, 0, 0, 0]);
});

test("agingKey and runsBefore: one definition of the aging order, ties to the earlier admission", () => {
  const low = { priority: Priority.LOW, tenant: "", arrivalTime: 0, sequence: 0, fairShareCost: 1 };
  const highEarly = { priority: Priority.HIGH, tenant: "", arrivalTime: 19.9, sequence: 1 };
  const highLate = { priority: Priority.HIGH, tenant: "", arrivalTime: 20.1, sequence: 2 };
  assert.equal(agingKey(low, 0.1), 2);
  assert.ok(runsBefore(highEarly, low, 0.1));
  assert.ok(runsBefore(low, highLate, 0.1));
  const twin = { ...low, sequence: 5 };
  assert.ok(runsBefore(low, twin, 0.1) && !runsBefore(twin, low, 0.1));
});

/** A limiter on a clock the test moves, in seconds. */
function limiter(limits: Partial<RateLimits>): { l: RateLimiter; clock: { s: number } } {
  const clock = { s: 0 };
  return { l: new RateLimiter({ requestsPerMinute: 0, tokensPerMinute: 0, ...limits }, () => clock.s * 1000), clock };
}

function refusal(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ApiError, String(e));
    return e;
  }
  assert.fail("expected a refusal");
}

test("token limits are reserved at admission: n 16 × max_tokens 200 is refused against a 100-token budget, before it runs", () => {
  const { l } = limiter({ tokensPerMinute: 100 });
  const a = l.admitRequest("low-key");
  const e = refusal(() => a.reserve(16 + 16 * 200, 16));
  assert.equal(e.status, 400);
  assert.equal(e.code, "invalid_request");
  assert.equal(e.param, "max_tokens");
  assert.match(e.message, /may use up to 3216 tokens .* more than this API key's limit of 100 tokens per minute: lower max_tokens or n/);
  // Refused, it reserved nothing: the whole budget is still there.
  l.admitRequest("low-key").reserve(100, 1);
});

test("reserve, settle and refund: the arithmetic over a sliding minute", () => {
  const { l, clock } = limiter({ tokensPerMinute: 1000 });
  const a = l.admitRequest("k");
  a.reserve(600, 3);
  clock.s = 10;
  const b = l.admitRequest("k");
  const over = refusal(() => b.reserve(500, 1));
  assert.equal(over.status, 429);
  assert.equal(over.code, "rate_limit_exceeded");
  assert.match(over.message, /1000 tokens per minute \(400 left; this request needs 500\)/);
  assert.equal(over.retryAfter, 50, "a's reservation (at 0 s) leaves the window at 60 s");
  a.settle(150); // a used 150 of its 600: 450 come back at once
  b.reserve(500, 1);
  a.settle(900);
  const c = l.admitRequest("k");
  c.reserve(350, 1); // 150 + 500 + 350: exactly the budget, so the second settle changed nothing
  const spent = refusal(() => l.admitRequest("k"));
  assert.equal(spent.status, 429);
  assert.match(spent.message, /1000 tokens per minute/);
  assert.equal(spent.retryAfter, 50, "one token fits again when a's 150 leave at 60 s");
  // Settling with more than reserved charges what was used.
  c.settle(400);
  clock.s = 60; // a (0 s) leaves the window; b (10 s) and c (10 s) hold 500 + 400
  const e = l.admitRequest("k");
  refusal(() => e.reserve(101, 1));
  e.reserve(100, 1);
  clock.s = 70.5; // b and c (10 s) have left; only e (60 s) remains
  l.admitRequest("k").reserve(900, 1);
  // Another key has its own budget.
  l.admitRequest("other").reserve(1000, 1);
});

test("requests count once each, whatever their prompts × n; Retry-After is when the oldest leaves", () => {
  const { l, clock } = limiter({ requestsPerMinute: 3 });
  for (const s of [0, 10, 20]) {
    clock.s = s;
    l.admitRequest("k").reserve(10_000, 64 * 16);
  }
  clock.s = 30;
  const e = refusal(() => l.admitRequest("k"));
  assert.equal(e.status, 429);
  assert.match(e.message, /3 requests per minute/);
  assert.equal(e.retryAfter, 30);
  clock.s = 60.5;
  l.admitRequest("k");
});

test("sequences per minute count prompts × n, are not refunded by settle, and a request over the whole limit is a 400 on n", () => {
  const { l, clock } = limiter({ sequencesPerMinute: 32 });
  const a = l.admitRequest("k");
  a.reserve(0, 16);
  a.settle(0);
  const b = l.admitRequest("k");
  const over = refusal(() => b.reserve(0, 17));
  assert.equal(over.status, 429);
  assert.match(over.message, /32 sequences per minute \(16 left; this request needs 17\)/);
  assert.equal(over.retryAfter, 60);
  b.reserve(0, 16);
  const never = refusal(() => l.admitRequest("k").reserve(0, 33));
  assert.equal(never.status, 400);
  assert.equal(never.param, "n");
  clock.s = 61;
  l.admitRequest("k").reserve(0, 32);
});

test("with no limits nothing is counted and nothing refused; settle is safe before or without reserve", () => {
  const { l } = limiter({});
  assert.equal(l.enabled, false);
  const admissions: RateAdmission[] = [];
  for (let i = 0; i < 1000; i++) admissions.push(l.admitRequest("k"));
  for (const a of admissions) {
    a.reserve(1e9, 1e6);
    a.settle(1e9);
  }
  const { l: limited } = limiter({ tokensPerMinute: 10 });
  const a = limited.admitRequest("k");
  a.settle(0); // e.g. the request failed before its prompts were tokenized
  a.reserve(10, 1); // a settled admission reserves nothing more
  limited.admitRequest("k").reserve(10, 1);
});
