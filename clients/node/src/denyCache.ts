// The local deny cache: a `limit_exceeded` denial answered again without
// asking quotad, for as long as it is certain to hold. The same rules as the
// Rust client's (crates/quotad-client/src/deny_cache.rs):
//
// A denial of cost `c` with retry time `r` says the key's budget has less
// than `c` room, and that waiting `r` with no other traffic makes room.
// Other traffic only consumes, so until `r` has passed every check of that
// key for a cost from `c` up to the capacity is denied too. The window is
// timed from when the denied request was *sent* and ends `margin(r)` early
// (the two clocks read whole milliseconds at different phases and may run
// at rates up to 1,000 ppm apart), so it never outlasts quotad's. What a
// cached answer *reports* counts from when the answer *arrived*, plus the
// margin, so a caller that waits it out is never early.
import type { CheckRequest, Decision } from "./types.js";
import { policyId } from "./policy.js";

/** The default number of keys the deny cache holds. */
export const DEFAULT_DENY_CACHE_CAPACITY = 10_000;

/** How much earlier than quotad's retry time a cached denial ends. */
export function margin(retryAfterMs: number): number {
  return 1 + Math.floor(retryAfterMs / 1_000);
}

interface Entry {
  id: string;
  cost: number;
  /** Denied until this instant (client clock, from the send). */
  untilMs: number;
  /** The wait reported is up to this instant (from the arrival, plus the margin). */
  retryUntilMs: number;
  resetUntilMs: number;
  limit: number;
  remaining: number;
}

/** What the cache knew when a check was sent. */
export interface Sent {
  atMs: number;
  epoch: number;
}

/** A min-heap of (untilMs, id): expired entries leave from the top, so making room never scans live ones. */
class ExpiryHeap {
  private items: Array<[number, string]> = [];
  /** Index items looked at while purging (tests bound the work per record). */
  examined = 0;

  get length(): number {
    return this.items.length;
  }

  push(untilMs: number, id: string): void {
    const items = this.items;
    items.push([untilMs, id]);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (items[parent]![0] <= items[i]![0]) break;
      [items[parent], items[i]] = [items[i]!, items[parent]!];
      i = parent;
    }
  }

  peek(): [number, string] | undefined {
    return this.items[0];
  }

  pop(): void {
    const items = this.items;
    const last = items.pop();
    if (items.length === 0 || last === undefined) return;
    items[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < items.length && items[l]![0] < items[m]![0]) m = l;
      if (r < items.length && items[r]![0] < items[m]![0]) m = r;
      if (m === i) break;
      [items[m], items[i]] = [items[i]!, items[m]!];
      i = m;
    }
  }

  clear(): void {
    this.items = [];
  }
}

/** A bounded map from (policy, key) to the denial that still holds. */
export class DenyCache {
  private readonly entries = new Map<string, Entry>();
  private readonly expiry = new ExpiryHeap();
  /** Bumped by every reset through the client: a denial decided before a reset is not cached after it. */
  private epoch = 0;

  constructor(readonly capacity: number) {}

  /** Entries held now. */
  get size(): number {
    return this.entries.size;
  }

  /** Index items looked at while making room. */
  get examined(): number {
    return this.expiry.examined;
  }

  /** The denial `check` gets at `nowMs` without asking quotad, if one is certain. */
  lookup(check: CheckRequest, nowMs: number): Decision | undefined {
    const entry = this.entries.get(policyId(check.policy, check.key));
    if (entry === undefined) return undefined;
    const cost = check.cost ?? 1;
    // A cost above the capacity is quotad's cost_exceeds_capacity, which no
    // wait cures: never a cached limit_exceeded.
    if (nowMs >= entry.untilMs || cost < entry.cost || cost > entry.limit) return undefined;
    const retryAfterMs = Math.max(0, entry.retryUntilMs - nowMs);
    return {
      allowed: false,
      limit: entry.limit,
      remaining: entry.remaining,
      retryAfterMs,
      resetAfterMs: Math.max(Math.max(0, entry.resetUntilMs - nowMs), retryAfterMs),
      reason: "limit_exceeded",
    };
  }

  /** Marks a check as sent at `nowMs`. */
  sent(nowMs: number): Sent {
    return { atMs: nowMs, epoch: this.epoch };
  }

  /** Learns from quotad's answer to `check`, sent at `sent` and received at `receivedMs`. */
  record(check: CheckRequest, decision: Decision, sent: Sent, receivedMs: number): void {
    if (sent.epoch !== this.epoch) return;
    const id = policyId(check.policy, check.key);
    const cost = check.cost ?? 1;
    const m = margin(decision.retryAfterMs);
    const holdMs = Math.max(0, decision.retryAfterMs - m);
    const cacheable = !decision.allowed && decision.reason === "limit_exceeded" && holdMs > 0;
    const old = this.entries.get(id);
    if (!cacheable) {
      // quotad answering with another limit (a reload) or admitting a cost
      // the entry denies (a reset elsewhere) proves room came early.
      if (old !== undefined && (old.limit !== decision.limit || (decision.allowed && cost >= old.cost))) {
        this.entries.delete(id);
      }
      return;
    }
    const entry: Entry = {
      id,
      cost,
      untilMs: sent.atMs + holdMs,
      retryUntilMs: receivedMs + decision.retryAfterMs + m,
      resetUntilMs: receivedMs + decision.resetAfterMs + m,
      limit: decision.limit,
      remaining: decision.remaining,
    };
    if (old !== undefined && old.cost <= entry.cost && old.untilMs >= entry.untilMs && old.limit === entry.limit) {
      // The entry already denies more, for longer.
      return;
    }
    this.purge(receivedMs);
    if (this.entries.size >= this.capacity && !this.entries.has(id)) {
      // Full of live denials: keep them; this one goes uncached.
      return;
    }
    this.entries.set(id, entry);
    this.expiry.push(entry.untilMs, id);
    this.compact();
  }

  /** Drops what is known of `key` under `policy`, and every denial in flight: its budget was reset. */
  forget(policy: CheckRequest["policy"], key: string): void {
    this.epoch += 1;
    this.entries.delete(policyId(policy, key));
  }

  /** Drops every entry whose window has ended by `nowMs`; each index item leaves once. */
  private purge(nowMs: number): void {
    for (;;) {
      const top = this.expiry.peek();
      if (top === undefined) return;
      this.expiry.examined += 1;
      const [untilMs, id] = top;
      const live = this.entries.get(id);
      if (live !== undefined && live.untilMs === untilMs) {
        if (untilMs > nowMs) return;
        this.entries.delete(id);
      }
      // Either expired, or a stale index item of an overwritten or dropped entry.
      this.expiry.pop();
    }
  }

  /** Index items of overwritten or dropped entries are skipped lazily; rebuild when they outnumber the live ones. */
  private compact(): void {
    if (this.expiry.length <= 2 * this.entries.size + 64) return;
    this.expiry.clear();
    for (const e of this.entries.values()) this.expiry.push(e.untilMs, e.id);
  }
}
