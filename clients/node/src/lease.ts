// Leases: a share of a key's budget held by the client and spent locally,
// with the Rust client's rules (crates/quotad-client/src/lease.rs,
// lessee.rs, docs/leases.md):
//
// - a check finding no lease goes to quotad as without leases, and a lease
//   is asked for in the background (the first request is never delayed);
// - a held lease is spent locally until its units or its time run out; its
//   time ends at its own send time + ttl x (1 - 1/1000) less the margin,
//   never after quotad's end;
// - at half spent or half its TTL the next spend starts a renewal: the next
//   lease is asked for while the current one is spent on; when it arrives
//   the old one stops and is settled (with what was spent of it) in the
//   next lease call, so a lease is never settled while it can be spent;
// - `direct` (near the end of the budget) sends the key's checks to quotad
//   for the back-off; a policy quotad will not lease is remembered for 60 s,
//   and so is a key it refuses (a refusal naming `key`), for that key only;
// - after a failed call the lease held is spent on until its end, the
//   stopped one is settled again with the next call.
import * as grpc from "@grpc/grpc-js";
import { policyFields, policyId } from "./policy.js";
import type { CheckRequest, Decision, LeaseTerms, PolicyRef } from "./types.js";

export type { LeaseTerms } from "./types.js";

/** How long a policy quotad refused to lease is checked call by call before the client asks again. */
export const NOT_LEASABLE_RECHECK_MS = 60_000;

/** Leases, as `ClientOptions.leases`. */
export interface LeaseOptions {
  /** Units to ask for per lease (quotad grants at most the policy's `lease.max_units` and a fair share). */
  want: number;
  /** How much before its computed end a lease stops being spent; 5 ms by default. */
  marginMs?: number;
  /** How long a key answered `direct` (or whose lease call failed) is checked call by call; 1 s by default. */
  directBackoffMs?: number;
  /** The most keys leases are held for at once; 10,000 by default. */
  maxKeys?: number;
}


/** What a client's leases have done. */
export interface LeaseStats {
  /** Checks admitted from a lease, without a call. */
  localAdmissions: number;
  acquired: number;
  renewed: number;
  /** Leases given back with nothing asked in exchange, and their units. */
  returned: number;
  returnedUnits: number;
  /** Answers `direct`. */
  direct: number;
  /** Refusals that marked a policy as not leasable. */
  notLeasable: number;
  /** Lease calls that failed. */
  failed: number;
  /** Leases that can be spent now. */
  held: number;
}

interface Taken {
  id: string;
  spent: number;
}

class Slot {
  held: { id: string; units: number } | undefined;
  left = 0;
  endMs = 0;
  renewAtMs = 0;
  renewBelow = 0;
  limit = 0;
  resetUntilMs = 0;
  directUntilMs = 0;
  calling = false;
  /** A lease stopped by its successor, to settle with the next call. */
  stopped: Taken | undefined;

  constructor(
    readonly key: string,
    readonly policy: PolicyRef,
    readonly terms: LeaseTerms | undefined,
  ) {}

  holds(now: number): boolean {
    return this.held !== undefined && now < this.endMs;
  }

  /** Stops the lease held and hands it over for settling; undefined when none is held or it has ended. */
  take(now: number): Taken | undefined {
    const held = this.held;
    const left = this.left;
    this.held = undefined;
    this.left = 0;
    if (held === undefined || now >= this.endMs) return undefined;
    return { id: held.id, spent: held.units - left };
  }
}

type Unary = (stub: grpc.Client, method: string, request: unknown, options: { deadlineMs: number }) => Promise<unknown>;

interface WireLeaseResponse {
  lease: { lease_id: string; units: number; ttl_ms: number } | null;
  direct: boolean;
  settled: string;
  returned: number;
  limit: number;
  reset_after_ms: number;
}

/** Codes with which quotad refuses to lease for the policy itself, changing nothing. */
const REFUSED = new Set<number>([
  grpc.status.INVALID_ARGUMENT,
  grpc.status.NOT_FOUND,
  grpc.status.FAILED_PRECONDITION,
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.UNIMPLEMENTED,
]);

/** Whether a refusal names the request's `key` (quotad words one as `<field>: <what is wrong>`). */
function namesTheKey(error: unknown): boolean {
  const details = (error as { details?: unknown })?.details;
  return typeof details === "string" && details.startsWith("key: ");
}

/** The client's side of `quotad.v1.Leases`. */
export class Lessee {
  private readonly slots = new Map<string, Slot>();
  private readonly notLeasable = new Map<string, number>();
  private closed = false;
  private inFlight = 0;
  private idle: Array<() => void> = [];
  private readonly marginMs: number;
  private readonly backoffMs: number;
  private readonly maxKeys: number;
  private readonly counts = {
    localAdmissions: 0,
    acquired: 0,
    renewed: 0,
    returned: 0,
    returnedUnits: 0,
    direct: 0,
    notLeasable: 0,
    failed: 0,
  };

  constructor(
    private readonly options: LeaseOptions,
    private readonly stub: grpc.Client,
    private readonly unary: Unary,
    private readonly clock: () => number,
    private readonly deadlineMs: number,
    private readonly onCall: () => void,
  ) {
    if (!Number.isSafeInteger(options.want) || options.want < 1) {
      throw new RangeError(`leases.want: must be a whole number of units, at least 1 (got ${options.want})`);
    }
    this.marginMs = Math.ceil(options.marginMs ?? 5);
    this.backoffMs = Math.ceil(options.directBackoffMs ?? 1_000);
    this.maxKeys = options.maxKeys ?? 10_000;
  }

  static emptyStats(): LeaseStats {
    return {
      localAdmissions: 0,
      acquired: 0,
      renewed: 0,
      returned: 0,
      returnedUnits: 0,
      direct: 0,
      notLeasable: 0,
      failed: 0,
      held: 0,
    };
  }

  stats(): LeaseStats {
    const now = this.clock();
    let held = 0;
    for (const s of this.slots.values()) if (s.holds(now)) held++;
    return { ...this.counts, held };
  }

  /** The last instant (exclusive) a lease sent at `sentMs` with `ttlMs` may be spent. */
  endMs(sentMs: number, ttlMs: number): number {
    return sentMs + ttlMs - Math.ceil(ttlMs / 1_000) - this.marginMs;
  }

  /** A local admission from a held lease, or undefined (then the check goes to quotad, and a lease call may start). */
  spend(check: CheckRequest, _deadlineMs: number): Decision | undefined {
    if (this.closed) return undefined;
    const terms = typeof check.policy === "string" ? undefined : check.leaseTerms;
    // An inline policy without terms has nothing to lease with.
    if (typeof check.policy !== "string" && terms === undefined) return undefined;
    const cost = check.cost ?? 1;
    // Bad input is quotad's to refuse, naming the field.
    if (!Number.isSafeInteger(cost) || cost < 1 || check.key === "") return undefined;
    const now = this.clock();
    const id = policyId(check.policy, check.key);
    let slot = this.slots.get(id);
    if (slot === undefined) {
      const pid = policyId(check.policy, "");
      const until = this.notLeasable.get(pid);
      if (until !== undefined && now < until) return undefined;
      if (this.slots.size >= this.maxKeys) {
        for (const [k, s] of this.slots) {
          if (!s.calling && now >= s.endMs && now >= s.directUntilMs && s.stopped === undefined) this.slots.delete(k);
        }
        if (this.slots.size >= this.maxKeys) return undefined;
      }
      slot = new Slot(check.key, check.policy, terms);
      this.slots.set(id, slot);
      this.start(slot);
      return undefined;
    }
    if (now < slot.endMs && slot.left >= cost) {
      slot.left -= cost;
      this.counts.localAdmissions += 1;
      const due = slot.left <= slot.renewBelow || now >= slot.renewAtMs;
      if (due && now >= slot.directUntilMs && !slot.calling) this.start(slot);
      return {
        allowed: true,
        limit: slot.limit,
        remaining: slot.left,
        retryAfterMs: 0,
        resetAfterMs: Math.max(0, slot.resetUntilMs - now),
        reason: "within_limit",
      };
    }
    if (now >= slot.directUntilMs && !slot.calling) this.start(slot);
    return undefined;
  }

  private start(slot: Slot): void {
    slot.calling = true;
    this.inFlight += 1;
    this.renew(slot)
      .catch(() => {
        // Never expected (renew catches its calls' failures); counted, never unhandled.
        this.counts.failed += 1;
      })
      .finally(() => {
      slot.calling = false;
      this.inFlight -= 1;
      if (this.inFlight === 0) for (const wake of this.idle.splice(0)) wake();
    });
  }

  private request(slot: Slot, want: number, taken: Taken | undefined): Record<string, unknown> {
    const request: Record<string, unknown> = { key: slot.key, ...policyFields(slot.policy), want };
    if (slot.terms !== undefined) {
      request.inline_terms = {
        max_units: slot.terms.maxUnits,
        min_units: slot.terms.minUnits,
        max_ttl_ms: slot.terms.maxTtlMs,
      };
    }
    if (taken !== undefined) request.settle = { lease_id: taken.id, spent: taken.spent };
    return request;
  }

  private send(request: Record<string, unknown>): Promise<WireLeaseResponse> {
    this.onCall();
    return this.unary(this.stub, "Lease", request, { deadlineMs: this.deadlineMs }) as Promise<WireLeaseResponse>;
  }

  private settled(answer: WireLeaseResponse): void {
    if (answer.settled === "SETTLED_RETURNED") this.counts.returnedUnits += Number(answer.returned);
  }

  /** Asks for the lease after the one held, settling the one stopped before it, if any. */
  private async renew(slot: Slot): Promise<void> {
    const stopped = slot.stopped;
    slot.stopped = undefined;
    if (this.closed) {
      for (const t of [stopped, slot.take(this.clock())]) if (t !== undefined) await this.giveBack(slot, t);
      return;
    }
    const renewal = slot.holds(this.clock());
    const request = this.request(slot, this.options.want, stopped);
    // The lease's time counts from here, before the request leaves.
    const sentMs = this.clock();
    let answer: WireLeaseResponse;
    try {
      answer = await this.send(request);
    } catch (error) {
      this.failed(slot, stopped, error, this.clock());
      return;
    }
    const receivedMs = this.clock();
    this.settled(answer);
    const lease = !answer.direct && answer.lease !== null && Number(answer.lease.units) > 0 ? answer.lease : undefined;
    if (lease === undefined) {
      this.counts.direct += 1;
      const reset = Number(answer.reset_after_ms);
      slot.directUntilMs = receivedMs + (reset === 0 ? this.backoffMs : Math.min(reset, this.backoffMs));
      return;
    }
    const ttl = Number(lease.ttl_ms);
    const units = Number(lease.units);
    const endMs = this.endMs(sentMs, ttl);
    if (endMs <= receivedMs || this.closed) {
      // Arrived too late to spend any of it, or after shutdown: straight back.
      await this.giveBack(slot, { id: lease.lease_id, spent: 0 });
      slot.directUntilMs = receivedMs + this.backoffMs;
      return;
    }
    if (renewal) this.counts.renewed += 1;
    else this.counts.acquired += 1;
    // The lease held until now stops here, and is settled with the next call.
    slot.stopped = slot.take(receivedMs);
    slot.held = { id: lease.lease_id, units };
    slot.limit = Number(answer.limit);
    slot.resetUntilMs = receivedMs + Number(answer.reset_after_ms);
    slot.renewAtMs = Math.min(sentMs + Math.floor(ttl / 2), endMs);
    slot.renewBelow = Math.floor(units / 2);
    slot.endMs = endMs;
    slot.left = units;
  }

  private failed(slot: Slot, stopped: Taken | undefined, error: unknown, now: number): void {
    const code = (error as { code?: unknown })?.code;
    if (code === grpc.status.NOT_FOUND && stopped !== undefined) {
      // The key no longer holds the stopped lease (it was reset): nothing to settle.
      this.counts.failed += 1;
      slot.directUntilMs = now;
    } else if (code === grpc.status.INVALID_ARGUMENT && namesTheKey(error)) {
      // quotad refuses this key (too long, say), not the policy: only this
      // key goes unleased until the recheck; the policy's other keys lease.
      this.counts.failed += 1;
      slot.directUntilMs = now + NOT_LEASABLE_RECHECK_MS;
    } else if (typeof code === "number" && REFUSED.has(code)) {
      this.counts.notLeasable += 1;
      const until = now + NOT_LEASABLE_RECHECK_MS;
      this.notLeasable.set(policyId(slot.policy, ""), until);
      slot.directUntilMs = until;
    } else {
      // Unreachable, failed, or of unknown fate: the stopped lease is
      // settled next time, the one held spent on until its end.
      slot.stopped = stopped;
      this.counts.failed += 1;
      slot.directUntilMs = now + this.backoffMs;
    }
  }

  private async giveBack(slot: Slot, taken: Taken): Promise<void> {
    try {
      this.settled(await this.send(this.request(slot, 0, taken)));
      this.counts.returned += 1;
    } catch {
      // Its units come back when it ends.
      this.counts.failed += 1;
    }
  }

  /** Stops leasing: no lease is spent and no lease call starts from now on. */
  close(): void {
    this.closed = true;
  }

  /** Stops leasing, waits (within the deadline) for lease calls in flight, and returns every lease held. */
  async shutdown(): Promise<void> {
    this.close();
    if (this.inFlight > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, this.deadlineMs);
        this.idle.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    const now = this.clock();
    const returns: Array<Promise<void>> = [];
    for (const slot of this.slots.values()) {
      if (slot.calling) continue;
      const held = [slot.stopped, slot.take(now)].filter((t): t is Taken => t !== undefined);
      slot.stopped = undefined;
      if (held.length === 0) continue;
      slot.calling = true;
      returns.push(
        (async () => {
          for (const t of held) await this.giveBack(slot, t);
          slot.calling = false;
        })(),
      );
    }
    await Promise.all(returns);
  }
}
