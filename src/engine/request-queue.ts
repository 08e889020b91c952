/**
 * Waiting requests ordered by effective priority with aging:
 *   effective = base − rate × (now − arrival)
 * Lower runs first. Since rate × now is the same for every request at any
 * instant, the order equals the order of the time-invariant key
 * base + rate × arrival (agingKey), so a binary heap on that key gives O(log n)
 * push/pop with no rescans, and the order is always the current effective order.
 * Counts per base priority and per tenant are kept in O(1) for admission.
 */
import type { Priority } from "./request.js";

export interface Queued {
  readonly priority: Priority;
  readonly tenant: string;
  readonly arrivalTime: number;
  readonly sequence: number;
}

/** The time-invariant key of effective priority (lower runs first): the one definition of aging order. */
export function agingKey(r: Queued, rate: number): number {
  return r.priority + rate * r.arrivalTime;
}

/** Whether `a` runs before `b`: the lower aging key, the earlier admission on ties. */
export function runsBefore(a: Queued, b: Queued, rate: number): boolean {
  const ka = agingKey(a, rate), kb = agingKey(b, rate);
  return ka < kb || (ka === kb && a.sequence < b.sequence);
}

export class RequestQueue<T extends Queued> {
  private readonly heap: T[] = [];
  private readonly perPriority = [0, 0, 0];
  private readonly perTenant = new Map<string, number>();

  constructor(readonly agingRate: number) {}

  get size(): number {
    return this.heap.length;
  }

  /** Waiting count per base priority (HIGH, NORMAL, LOW). */
  get counts(): readonly number[] {
    return this.perPriority;
  }

  /** Waiting count of one tenant. */
  waitingOf(tenant: string): number {
    return this.perTenant.get(tenant) ?? 0;
  }

  push(r: T): void {
    this.heap.push(r);
    this.perPriority[r.priority]!++;
    this.perTenant.set(r.tenant, this.waitingOf(r.tenant) + 1);
    this.up(this.heap.length - 1);
  }

  peek(): T | undefined {
    return this.heap[0];
  }

  pop(): T | undefined {
    const top = this.heap[0];
    if (!top) return undefined;
    this.removeAt(0);
    return top;
  }

  /** Removes `r` (an abort): O(n) to find it, O(log n) to fix the heap. */
  remove(r: T): boolean {
    const i = this.heap.indexOf(r);
    if (i < 0) return false;
    this.removeAt(i);
    return true;
  }

  /** The best base priority among waiting requests (for counting aging promotions). */
  bestBasePriority(): number | undefined {
    const i = this.perPriority.findIndex((n) => n > 0);
    return i < 0 ? undefined : i;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    yield* this.heap;
  }

  private less(a: T, b: T): boolean {
    return runsBefore(a, b, this.agingRate);
  }

  private removeAt(i: number): void {
    const r = this.heap[i]!;
    this.perPriority[r.priority]!--;
    const left = this.waitingOf(r.tenant) - 1;
    if (left > 0) this.perTenant.set(r.tenant, left);
    else this.perTenant.delete(r.tenant); // only tenants with waiting requests keep an entry
    const last = this.heap.pop()!;
    if (i < this.heap.length) {
      this.heap[i] = last;
      this.up(i);
      this.down(i);
    }
  }

  private up(i: number): void {
    const h = this.heap;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(h[i]!, h[p]!)) break;
      [h[i], h[p]] = [h[p]!, h[i]!];
      i = p;
    }
  }

  private down(i: number): void {
    const h = this.heap;
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
