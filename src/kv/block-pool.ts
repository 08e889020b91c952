/**
 * The KV cache's blocks: ref-counts, an intrusive doubly linked free list in
 * LRU order, and the prefix-cache map from block hash to block. Allocation,
 * release, touch and lookup are O(1) per block; numCachedFree walks the free
 * list, and is read only for stats.
 */

export interface Block {
  readonly id: number;
  refCount: number;
  /** Hash of the full block's tokens (chained); kept after free until the block is reused. */
  hash: string | null;
  prev: Block | null;
  next: Block | null;
  /** Whether the block is currently linked into the free list. */
  free: boolean;
}

export class BlockPool {
  readonly blocks: Block[];
  private head: Block | null = null; // least recently freed: evicted first
  private tail: Block | null = null;
  private freeCount = 0;
  private readonly cached = new Map<string, Block>();

  constructor(readonly numBlocks: number) {
    this.blocks = Array.from({ length: numBlocks }, (_, id) => ({ id, refCount: 0, hash: null, prev: null, next: null, free: false }));
    for (const b of this.blocks) this.append(b);
  }

  get numFree(): number {
    return this.freeCount;
  }

  /** Free blocks that still hold a cached prefix. */
  get numCachedFree(): number {
    let n = 0;
    for (let b = this.head; b; b = b.next) if (b.hash !== null) n++;
    return n;
  }

  get numUsed(): number {
    return this.numBlocks - this.freeCount;
  }

  /** Ids in free-list order (front = next to be allocated). */
  freeOrder(): number[] {
    const ids: number[] = [];
    for (let b = this.head; b; b = b.next) ids.push(b.id);
    return ids;
  }

  /** Takes `n` blocks from the front of the free list, evicting their cached hashes. Null when short. */
  allocate(n: number): Block[] | null {
    if (n > this.freeCount) return null;
    const out: Block[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.head!;
      this.unlink(b);
      if (b.hash !== null) {
        if (this.cached.get(b.hash) === b) this.cached.delete(b.hash);
        b.hash = null;
      }
      b.refCount = 1;
      out.push(b);
    }
    return out;
  }

  /** Drops one reference from each block, in the order given; unreferenced ones join the free list's tail. */
  release(blocks: readonly Block[]): void {
    for (const b of blocks) {
      if (b.refCount <= 0) throw new Error(`block ${b.id} released with ref count ${b.refCount}`);
      if (--b.refCount === 0) this.append(b);
    }
  }

  /** The cached block holding `hash`, if any. */
  lookup(hash: string): Block | undefined {
    return this.cached.get(hash);
  }

  /** Takes a reference on a cache hit; a free cached block leaves the free list. */
  touch(b: Block): void {
    if (b.free) this.unlink(b);
    b.refCount++;
  }

  /** Registers a full block under its hash (first writer wins: duplicates stay uncached). */
  cache(b: Block, hash: string): void {
    if (b.hash !== null || this.cached.has(hash)) return;
    b.hash = hash;
    this.cached.set(hash, b);
  }

  private append(b: Block): void {
    b.prev = this.tail;
    b.next = null;
    if (this.tail) this.tail.next = b;
    else this.head = b;
    this.tail = b;
    b.free = true;
    this.freeCount++;
  }

  private unlink(b: Block): void {
    if (b.prev) b.prev.next = b.next;
    else this.head = b.next;
    if (b.next) b.next.prev = b.prev;
    else this.tail = b.prev;
    b.prev = b.next = null;
    b.free = false;
    this.freeCount--;
  }
}
