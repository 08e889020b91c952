/**
 * Fair share between the tenants of one priority tier: start-time fair
 * queueing, weighted by tokens. A request costs its tokens (prompt +
 * max_tokens). Each tenant's requests get consecutive virtual start times,
 * each one its predecessors' cost later; the tier's virtual time is the start
 * of its last admitted request; a request starts at the later of the two. So
 * a tenant with one request waiting behind another tenant's 500 is admitted
 * next, and a tenant that has been served much recently waits behind those
 * that have not. The tag is fixed at push: a heap on it is O(log n).
 */
import type { Queued } from "./request-queue.js";

export interface Costed extends Queued {
  /** Tokens the request may take: prompt + max_tokens. */
  readonly fairShareCost: number;
}

export class FairShare {
  /** The virtual start of the tier's last admitted request. */
  private virtualNow = 0;
  /** Per tenant: the virtual time at which its queued work ends. */
  private readonly finish = new Map<string, number>();

  /** The virtual start of a newly queued request. */
  tag(r: Costed): number {
    const start = Math.max(this.virtualNow, this.finish.get(r.tenant) ?? 0);
    this.finish.set(r.tenant, start + r.fairShareCost);
    return start;
  }

  /** A request with virtual start `start` was admitted: virtual time moves to it. */
  admitted(start: number): void {
    if (start <= this.virtualNow) return;
    this.virtualNow = start;
    for (const [tenant, end] of this.finish) if (end <= start) this.finish.delete(tenant); // caught up: owes nothing
  }
}
