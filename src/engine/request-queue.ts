/**
 * Waiting requests, in three tiers by base priority, ordered with aging:
 *   effective = base − rate × (now − arrival)
 * Lower runs first. Across tiers the tier whose oldest request has the best
 * effective priority goes next; since rate × now is the same for every
 * request, that is the tier with the lowest time-invariant key
 * base + rate × oldest arrival (agingKey). Within a tier, requests run in
 * arrival order, or with fair share (fair-share.ts) in start-time fair
 * order between tenants. Every order is a heap: O(log n) per admission.
 * Counts per base priority and per tenant are kept in O(1) for admission.
 */
import { BinaryHeap } from "./binary-heap.js";
import { FairShare, type Costed } from "./fair-share.js";
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

const earlier = (a: Queued, b: Queued): boolean => a.arrivalTime < b.arrivalTime || (a.arrivalTime === b.arrivalTime && a.sequence < b.sequence);

class Tier<T extends Costed> {
  /** Oldest first: the tier's age, for aging across tiers. */
  readonly byArrival = new BinaryHeap<T>(earlier);
  /** The order of admission within the tier. */
  readonly byTurn: BinaryHeap<T>;

  constructor(
    private readonly fair: FairShare | null,
    /** Each request's fair-share start, fixed when first queued (a preempted request keeps its place). */
    private readonly starts: WeakMap<T, number>,
  ) {
    this.byTurn = fair ? new BinaryHeap<T>((a, b) => this.start(a) < this.start(b) || (this.start(a) === this.start(b) && a.sequence < b.sequence)) : this.byArrival;
  }

  push(r: T): void {
    if (this.fair && !this.starts.has(r)) this.starts.set(r, this.fair.tag(r));
    this.byArrival.push(r);
    if (this.byTurn !== this.byArrival) this.byTurn.push(r);
  }

  remove(r: T): boolean {
    if (!this.byArrival.remove(r)) return false;
    if (this.byTurn !== this.byArrival) this.byTurn.remove(r);
    return true;
  }

  admitted(r: T): void {
    this.fair?.admitted(this.start(r));
  }

  private start(r: T): number {
    return this.starts.get(r)!;
  }
}

export class RequestQueue<T extends Costed> {
  private readonly tiers: Tier<T>[];
  private readonly perPriority = [0, 0, 0];
  private readonly perTenant = new Map<string, number>();

  constructor(
    readonly agingRate: number,
    fairShare = false,
  ) {
    const starts = new WeakMap<T, number>();
    this.tiers = [0, 1, 2].map(() => new Tier<T>(fairShare ? new FairShare() : null, starts));
  }

  get size(): number {
    return this.perPriority[0]! + this.perPriority[1]! + this.perPriority[2]!;
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
    this.tiers[r.priority]!.push(r);
    this.count(r, 1);
  }

  /** The next request to admit. */
  peek(): T | undefined {
    return this.nextTier()?.byTurn.peek();
  }

  pop(): T | undefined {
    const tier = this.nextTier();
    const r = tier?.byTurn.peek();
    if (!tier || !r) return undefined;
    tier.remove(r);
    tier.admitted(r);
    this.count(r, -1);
    return r;
  }

  /** Removes `r` (an abort): O(n) to find it, O(log n) to fix the heaps. */
  remove(r: T): boolean {
    if (!this.tiers[r.priority]!.remove(r)) return false;
    this.count(r, -1);
    return true;
  }

  /** The best base priority among waiting requests (for counting aging promotions). */
  bestBasePriority(): number | undefined {
    const i = this.perPriority.findIndex((n) => n > 0);
    return i < 0 ? undefined : i;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (const t of this.tiers) yield* t.byArrival;
  }

  /** The tier whose oldest request has the lowest aging key. */
  private nextTier(): Tier<T> | undefined {
    let best: Tier<T> | undefined, bestKey = Infinity;
    for (const t of this.tiers) {
      const oldest = t.byArrival.peek();
      if (oldest && agingKey(oldest, this.agingRate) < bestKey) [best, bestKey] = [t, agingKey(oldest, this.agingRate)];
    }
    return best;
  }

  private count(r: T, d: 1 | -1): void {
    this.perPriority[r.priority]! += d;
    const n = this.waitingOf(r.tenant) + d;
    if (n > 0) this.perTenant.set(r.tenant, n);
    else this.perTenant.delete(r.tenant); // only tenants with waiting requests keep an entry
  }
}
