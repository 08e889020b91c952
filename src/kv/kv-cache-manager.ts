/**
 * The scheduler's only door to KV memory: prefix-cache hits, slot allocation
 * (nothing when memory is short), and freeing. Block hashes chain over full
 * blocks: hash(parent, token ids, salt), the salt being the tenant's, so one
 * tenant never hits (or times) another's cached prompts.
 */
import { createHash } from "node:crypto";
import { BlockPool, type Block } from "./block-pool.js";

/** What the KV manager needs to know of a request. */
export interface KvSequence {
  readonly id: string;
  /** Prompt then generated tokens. */
  readonly allTokenIds: readonly number[];
  readonly numComputedTokens: number;
  readonly cacheSalt: string;
}

export interface CachedPrefix {
  blocks: Block[];
  numTokens: number;
}

export class KvCacheManager {
  readonly pool: BlockPool;
  private readonly tables = new Map<string, Block[]>();
  private readonly hashes = new Map<string, string[]>();
  /** Prefix-cache counters, in tokens. */
  queries = 0;
  hits = 0;

  constructor(
    numBlocks: number,
    readonly blockSize: number,
    readonly enablePrefixCaching = true,
  ) {
    this.pool = new BlockPool(numBlocks);
  }

  blockTable(id: string): readonly Block[] {
    return this.tables.get(id) ?? [];
  }

  /** Physical block ids of a request, in logical order. */
  blockIds(id: string): number[] {
    return this.blockTable(id).map((b) => b.id);
  }

  /** Blocks of a new (or recomputing) request already in the cache, capped so one token is left to compute. */
  computedBlocks(seq: KvSequence): CachedPrefix {
    const total = seq.allTokenIds.length;
    if (!this.enablePrefixCaching) return { blocks: [], numTokens: 0 };
    const hashes = this.hashChain(seq, Math.floor((total - 1) / this.blockSize));
    const blocks: Block[] = [];
    for (const h of hashes) {
      const b = this.pool.lookup(h);
      if (!b) break;
      blocks.push(b);
    }
    return { blocks, numTokens: blocks.length * this.blockSize };
  }

  /**
   * Makes room for `numNewTokens` more tokens after the computed ones, taking
   * `cached` (from computedBlocks) first. Returns false, changing nothing, when blocks run short.
   */
  allocateSlots(seq: KvSequence, numNewTokens: number, cached: readonly Block[] = []): boolean {
    const table = this.tables.get(seq.id) ?? [];
    const needed = this.blocksNeeded(seq, numNewTokens, cached);
    const cachedFree = cached.filter((b) => b.free).length; // touching these takes them off the free list
    if (needed > this.pool.numFree - cachedFree) return false;
    for (const b of cached) this.pool.touch(b);
    const fresh = needed > 0 ? this.pool.allocate(needed)! : [];
    this.tables.set(seq.id, [...table, ...cached, ...fresh]);
    if (cached.length) this.hashes.set(seq.id, cached.map((b) => b.hash!));
    return true;
  }

  /** New blocks allocateSlots(seq, numNewTokens, cached) would take (0 when its table holds them). */
  blocksNeeded(seq: KvSequence, numNewTokens: number, cached: readonly Block[] = []): number {
    const computed = seq.numComputedTokens + cached.length * this.blockSize;
    return Math.max(0, Math.ceil((computed + numNewTokens) / this.blockSize) - (this.tables.get(seq.id)?.length ?? 0) - cached.length);
  }

  /** Registers the request's newly full blocks in the prefix cache. */
  cacheFullBlocks(seq: KvSequence): void {
    if (!this.enablePrefixCaching) return;
    const table = this.tables.get(seq.id);
    if (!table) return;
    const full = Math.floor(seq.numComputedTokens / this.blockSize);
    const known = this.hashes.get(seq.id) ?? [];
    if (full <= known.length) return;
    const hashes = this.hashChain(seq, full, known);
    this.hashes.set(seq.id, hashes);
    for (let i = known.length; i < full; i++) this.pool.cache(table[i]!, hashes[i]!);
  }

  /** Counts an admitted request's prefix-cache lookup (in tokens). */
  recordLookup(queried: number, hit: number): void {
    this.queries += queried;
    this.hits += hit;
  }

  /** Releases all of a request's blocks, tail first, so a chain's tail is evicted before its head. */
  free(id: string): void {
    const table = this.tables.get(id);
    this.tables.delete(id);
    this.hashes.delete(id);
    if (table) this.pool.release([...table].reverse());
  }

  /** Hashes of the first `count` full blocks, extending `known`. */
  private hashChain(seq: KvSequence, count: number, known: readonly string[] = []): string[] {
    const out = [...known];
    const tokens = seq.allTokenIds;  // a request's getter copies its whole sequence: once, not once a block
    for (let i = out.length; i < count; i++) {
      const h = createHash("sha256");
      h.update(out[i - 1] ?? "root");
      h.update(`${seq.cacheSalt.length}:${seq.cacheSalt}`);
      h.update(Int32Array.from(tokens.slice(i * this.blockSize, (i + 1) * this.blockSize)));
      out.push(h.digest("base64"));
    }
    return out;
  }
}
