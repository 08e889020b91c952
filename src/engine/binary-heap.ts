/** A binary min-heap under a comparator: O(log n) push and pop, O(n) removal of an arbitrary item. */
export class BinaryHeap<T> {
  private readonly items: T[] = [];

  constructor(private readonly less: (a: T, b: T) => boolean) {}

  get size(): number {
    return this.items.length;
  }

  peek(): T | undefined {
    return this.items[0];
  }

  push(x: T): void {
    this.items.push(x);
    this.up(this.items.length - 1);
  }

  pop(): T | undefined {
    const top = this.items[0];
    if (top !== undefined) this.removeAt(0);
    return top;
  }

  remove(x: T): boolean {
    const i = this.items.indexOf(x);
    if (i < 0) return false;
    this.removeAt(i);
    return true;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    yield* this.items;
  }

  private removeAt(i: number): void {
    const last = this.items.pop()!;
    if (i < this.items.length) {
      this.items[i] = last;
      this.up(i);
      this.down(i);
    }
  }

  private up(i: number): void {
    const h = this.items;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(h[i]!, h[p]!)) break;
      [h[i], h[p]] = [h[p]!, h[i]!];
      i = p;
    }
  }

  private down(i: number): void {
    const h = this.items;
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < h.length && this.less(h[l]!, h[m]!)) m = l;
      if (r < h.length && this.less(h[r]!, h[m]!)) m = r;
      if (m === i) break;
      [h[i], h[m]] = [h[m]!, h[i]!];
      i = m;
    }
  }
}
