/** Block pool and KV cache manager: exact block ids and free-queue order. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { BlockPool } from "../src/kv/block-pool.js";
import { KvCacheManager, type KvSequence } from "../src/kv/kv-cache-manager.js";

test("allocation takes blocks from the front of the free queue", () => {
  const pool = new BlockPool(6);
  assert.deepEqual(pool.freeOrder(), [0, 1, 2, 3, 4, 5]);
  assert.deepEqual(pool.allocate(2)!.map((b) => b.id), [0, 1]);
  assert.deepEqual(pool.freeOrder(), [2, 3, 4, 5]);
  assert.equal(pool.allocate(5), null, "short pools allocate nothing");
  assert.deepEqual(pool.freeOrder(), [2, 3, 4, 5]);
});

test("freed blocks join the tail; a request's blocks are freed tail first", () => {
  const kv = new KvCacheManager(6, 4);
  const seq: KvSequence = { id: "a", allTokenIds: Array.from({ length: 10 }, (_, i) => i), numComputedTokens: 0, cacheSalt: "" };
  assert.ok(kv.allocateSlots(seq, 10));
  assert.deepEqual(kv.blockIds("a"), [0, 1, 2]);
  kv.free("a");
  assert.deepEqual(kv.pool.freeOrder(), [3, 4, 5, 2, 1, 0]);
});

test("LRU eviction: the least recently freed cached block is reused first and loses its hash", () => {
  const kv = new KvCacheManager(4, 2);
  const a: KvSequence = { id: "a", allTokenIds: [1, 2, 3, 4, 5], numComputedTokens: 0, cacheSalt: "" };
  assert.ok(kv.allocateSlots(a, 5));
  kv.cacheFullBlocks({ ...a, numComputedTokens: 5 });
  assert.deepEqual(kv.blockIds("a"), [0, 1, 2]);
  kv.free("a");
  assert.deepEqual(kv.pool.freeOrder(), [3, 2, 1, 0]);
  assert.equal(kv.pool.numCachedFree, 2, "blocks 0 and 1 are full, so cached");
  const b: KvSequence = { id: "b", allTokenIds: [9, 9, 9, 9, 9, 9], numComputedTokens: 0, cacheSalt: "" };
  assert.ok(kv.allocateSlots(b, 6));
  assert.deepEqual(kv.blockIds("b"), [3, 2, 1], "block 1 (tail of a's chain) is evicted before block 0");
  assert.equal(kv.pool.blocks[1]!.hash, null);
  assert.notEqual(kv.pool.blocks[0]!.hash, null, "block 0 keeps its hash until reused");
});

test("a hit on a free cached block removes it from the free queue and takes a reference", () => {
  const kv = new KvCacheManager(5, 2);
  const prompt = [1, 2, 3, 4, 5];
  const a: KvSequence = { id: "a", allTokenIds: prompt, numComputedTokens: 0, cacheSalt: "" };
  kv.allocateSlots(a, 5);
  kv.cacheFullBlocks({ ...a, numComputedTokens: 5 });
  kv.free("a");
  assert.deepEqual(kv.pool.freeOrder(), [3, 4, 2, 1, 0]);
  const b: KvSequence = { id: "b", allTokenIds: prompt, numComputedTokens: 0, cacheSalt: "" };
  const hit = kv.computedBlocks(b);
  assert.deepEqual(hit.blocks.map((x) => x.id), [0, 1]);
  assert.equal(hit.numTokens, 4);
  assert.ok(kv.allocateSlots(b, 1, hit.blocks));
  assert.deepEqual(kv.blockIds("b"), [0, 1, 3]);
  assert.deepEqual(kv.pool.freeOrder(), [4, 2]);
  assert.equal(kv.pool.blocks[0]!.refCount, 1);
});

test("a cache hit is capped so at least one prompt token is computed", () => {
  const kv = new KvCacheManager(8, 2);
  const prompt = [1, 2, 3, 4];
  const a: KvSequence = { id: "a", allTokenIds: prompt, numComputedTokens: 0, cacheSalt: "" };
  kv.allocateSlots(a, 4);
  kv.cacheFullBlocks({ ...a, numComputedTokens: 4 });
  const hit = kv.computedBlocks({ ...a, id: "b" });
  assert.equal(hit.numTokens, 2, "both blocks are cached but only the first may be used");
});

test("allocateSlots refuses without side effects when cached hits would leave too few free blocks", () => {
  const kv = new KvCacheManager(3, 2);
  const a: KvSequence = { id: "a", allTokenIds: [1, 2, 3], numComputedTokens: 0, cacheSalt: "" };
  kv.allocateSlots(a, 3);
  kv.cacheFullBlocks({ ...a, numComputedTokens: 3 });
  kv.free("a");
  const b: KvSequence = { id: "b", allTokenIds: [1, 2, 7, 7, 7, 7, 7], numComputedTokens: 0, cacheSalt: "" };
  const hit = kv.computedBlocks(b);
  assert.equal(hit.blocks.length, 1);
  const before = kv.pool.freeOrder();
  assert.equal(kv.allocateSlots(b, 5, hit.blocks), false);
  assert.deepEqual(kv.pool.freeOrder(), before);
  assert.equal(hit.blocks[0]!.refCount, 0);
});

test("different salts never share blocks", () => {
  const kv = new KvCacheManager(8, 2);
  const prompt = [1, 2, 3, 4, 5];
  const a: KvSequence = { id: "a", allTokenIds: prompt, numComputedTokens: 0, cacheSalt: "tenant-a" };
  kv.allocateSlots(a, 5);
  kv.cacheFullBlocks({ ...a, numComputedTokens: 5 });
  assert.equal(kv.computedBlocks({ ...a, id: "b", cacheSalt: "tenant-b" }).blocks.length, 0);
  assert.equal(kv.computedBlocks({ ...a, id: "c" }).blocks.length, 2);
});
