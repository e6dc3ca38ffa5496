// Coalescing, with the Rust client's rules (crates/quotad-client/src/coalesce.rs):
//
// - a check goes out at once, alone, while the client has a free in-flight
//   slot (8 by default), so a lone check never waits;
// - while every slot is busy, new checks queue; when a slot frees, the
//   queue leaves as one INDEPENDENT `CheckBatch` (at most 1,000 items and
//   about 1 MiB a batch; a batch of one is a plain `Check`);
// - each caller keeps its own deadline: a check whose deadline passes in
//   the queue, or whose caller aborts, is never sent; a batch carries the
//   earliest deadline of its checks, so a caller answered with its failure
//   policy at its deadline is never counted after it;
// - a refusal made before anything was decided (INVALID_ARGUMENT,
//   NOT_FOUND, FAILED_PRECONDITION naming `items[i]`, and refusals such as
//   PERMISSION_DENIED) gives the item it names that error, as a lone check
//   would have (without the `items[i].` prefix), and sends every other item
//   again alone; a refusal of `CheckBatch` itself (PERMISSION_DENIED,
//   UNAUTHENTICATED, UNIMPLEMENTED naming no item) also sends checks alone
//   for 30 s;
// - an outage (UNAVAILABLE, DEADLINE_EXCEEDED, ...) gives every caller its
//   own failure policy, and nothing is sent again (quotad may have decided
//   some items already); anything else, every caller gets that error;
// - an item quotad could not decide (REASON_UNAVAILABLE) while it decided
//   others is sent again alone (at most 8 of a batch), so its caller learns
//   why; when none was decided, every caller gets its failure policy.
import * as grpc from "@grpc/grpc-js";
import type { WireDecision } from "./grpc.js";

/** How concurrent checks are coalesced, as `ClientOptions.coalescing`. */
export interface CoalescingOptions {
  /** Requests (a `Check` or a `CheckBatch`) in flight before checks queue; 8 by default. */
  maxInFlight?: number;
  /** Checks in one batch, 1 to 1,000; 1,000 by default. */
  maxBatchItems?: number;
  /** A batch's encoded size, about; 1 MiB by default (a larger single check still goes, alone). */
  maxBatchBytes?: number;
}

export const DEFAULT_MAX_IN_FLIGHT = 8;
export const DEFAULT_MAX_BATCH_BYTES = 1 << 20;
/** How long checks go out alone after quotad refused a `CheckBatch` as such. */
export const BATCH_REFUSAL_BACKOFF_MS = 30_000;
/** The most undecided checks of one batch that are sent again, each alone. */
export const MAX_RESENT_ALONE = 8;
const MAX_BATCH_ITEMS = 1_000;

/**
 * What quotad answered one check: a decision, or the error of the call
 * (before the failure policy), with when the check was sent on the client's
 * clock (absent when it never was): the deny cache times a denial from it.
 */
export type Answer = ({ decision: WireDecision } | { error: unknown }) & { sentMs?: number };

/** One unary call within `deadlineMs` (the client's, with its abort signal). */
export type Send = (method: string, request: unknown, deadlineMs: number, signal?: AbortSignal) => Promise<unknown>;

interface Queued {
  request: Record<string, unknown>;
  bytes: number;
  /** The caller's deadline, on the client's clock. */
  deadlineAt: number;
  signal: AbortSignal | undefined;
  done: boolean;
  deliver: (answer: Answer) => void;
  /** Told when this caller stops waiting, once its check is in a batch in flight. */
  onGone?: () => void;
}

/** The codes with which quotad refuses a batch for what it is, not for an item. */
const REFUSED_AS_A_WHOLE = new Set<number>([
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.UNIMPLEMENTED,
]);
/** The codes with which quotad refuses a request before deciding anything. */
const REFUSED_BEFORE_DECIDING = new Set<number>([
  grpc.status.INVALID_ARGUMENT,
  grpc.status.NOT_FOUND,
  grpc.status.FAILED_PRECONDITION,
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.RESOURCE_EXHAUSTED,
  grpc.status.UNIMPLEMENTED,
]);

const deadlineExceeded = (): { code: number; details: string } => ({
  code: grpc.status.DEADLINE_EXCEEDED,
  details: "no answer from quotad within the deadline",
});

/** The checks waiting for an in-flight slot, and the slots. */
export class Coalescer {
  private inFlight = 0;
  private queue: Queued[] = [];
  private refusedUntilMs = 0;
  /** Callers in `submit`, and batches being sent (with their re-sends): what closing waits for. */
  private active = 0;
  private batches = 0;
  private idle: Array<() => void> = [];
  private closed = false;
  private readonly maxInFlight: number;
  private readonly maxItems: number;
  private readonly maxBytes: number;
  /** Batches sent, and the checks they carried. */
  readonly counts = { batches: 0, checks: 0 };

  constructor(
    options: CoalescingOptions,
    private readonly send: Send,
    /** Real time (deadlines are), in ms. */
    private readonly clock: () => number,
    /** The client's clock (the batch-refusal back-off and send times are on it), in ms. */
    private readonly clientClock: () => number = clock,
  ) {
    const whole = (v: number | undefined, d: number, min: number, max: number, field: string): number => {
      const n = v ?? d;
      if (!Number.isSafeInteger(n) || n < min || n > max) {
        throw new RangeError(`coalescing.${field}: must be a whole number from ${min} to ${max} (got ${n})`);
      }
      return n;
    };
    this.maxInFlight = whole(options.maxInFlight, DEFAULT_MAX_IN_FLIGHT, 1, Number.MAX_SAFE_INTEGER, "max_in_flight");
    this.maxItems = whole(options.maxBatchItems, MAX_BATCH_ITEMS, 1, MAX_BATCH_ITEMS, "max_batch_items");
    this.maxBytes = whole(options.maxBatchBytes, DEFAULT_MAX_BATCH_BYTES, 1, Number.MAX_SAFE_INTEGER, "max_batch_bytes");
  }

  /** Checks waiting for an in-flight slot, to leave as the next batch. */
  get queued(): number {
    return this.queue.filter((q) => !q.done).length;
  }

  /**
   * Takes no more checks (they get UNAVAILABLE "the client is closed") and
   * resolves once every check taken is answered, each within its own
   * deadline: queued ones leave as batches as slots free, as before.
   */
  close(): Promise<void> {
    this.closed = true;
    return new Promise((resolve) => {
      this.idle.push(resolve);
      this.settle();
    });
  }

  private settle(): void {
    if (this.active === 0 && this.batches === 0) for (const wake of this.idle.splice(0)) wake();
  }

  /** Sends `request` now if a slot is free, or queues it for the next batch; answers within `deadlineMs`. */
  async submit(request: Record<string, unknown>, deadlineMs: number, signal: AbortSignal | undefined): Promise<Answer> {
    if (this.closed) return { error: closedError() };
    this.active += 1;
    try {
      return await this.take1(request, deadlineMs, signal);
    } finally {
      this.active -= 1;
      this.settle();
    }
  }

  private take1(request: Record<string, unknown>, deadlineMs: number, signal: AbortSignal | undefined): Promise<Answer> {
    if (this.clientClock() < this.refusedUntilMs) return this.alone(request, deadlineMs, signal);
    if (this.inFlight < this.maxInFlight) {
      this.inFlight += 1;
      return this.alone(request, deadlineMs, signal).finally(() => this.release());
    }
    return new Promise<Answer>((resolve) => {
      const entry: Queued = {
        request,
        bytes: estimate(request),
        deadlineAt: this.clock() + deadlineMs,
        signal,
        done: false,
        deliver: (answer) => {
          if (entry.done) return;
          entry.done = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          resolve(answer);
          entry.onGone?.();
        },
      };
      // Past its deadline in the queue, or its caller gone: never sent.
      const timer = setTimeout(() => entry.deliver({ error: deadlineExceeded() }), deadlineMs);
      const onAbort = (): void => entry.deliver({ error: new AbortedInQueue(signal?.reason) });
      signal?.addEventListener("abort", onAbort, { once: true });
      this.queue.push(entry);
    });
  }

  /** One check as a `Check` call. */
  private async alone(request: unknown, deadlineMs: number, signal: AbortSignal | undefined): Promise<Answer> {
    const sentMs = this.clientClock();
    try {
      const answer = (await this.send("Check", request, deadlineMs, signal)) as { decision: WireDecision };
      return { decision: answer.decision, sentMs };
    } catch (error) {
      return { error, sentMs };
    }
  }

  /** The next batch off the queue: waiting checks in order, within the bounds. */
  private take(): Queued[] {
    const batch: Queued[] = [];
    let bytes = 0;
    while (this.queue.length > 0 && batch.length < this.maxItems) {
      const next = this.queue[0]!;
      if (next.done) {
        this.queue.shift();
        continue;
      }
      if (batch.length > 0 && bytes + next.bytes > this.maxBytes) break;
      this.queue.shift();
      batch.push(next);
      bytes += next.bytes;
    }
    return batch;
  }

  /** A slot came free: the queue's next batch takes it, or it is given back. */
  private release(): void {
    const batch = this.take();
    if (batch.length === 0) {
      this.inFlight -= 1;
      return;
    }
    // The slot passes to the batch without being given back.
    this.batches += 1;
    void this.sendBatch(batch)
      .catch((error: unknown) => {
        // A fault of the client's own: every caller still waiting hears it,
        // none waits for ever.
        const sentMs = this.clientClock();
        for (const q of batch) q.deliver({ error, sentMs });
      })
      .finally(() => {
        this.batches -= 1;
        this.release();
        this.settle();
      });
  }

  private async sendBatch(batch: Queued[]): Promise<void> {
    // Stamped when the batch leaves: the deny cache times a denial from the
    // send, never from the enqueue.
    const sentMs = this.clientClock();
    const now = this.clock();
    if (batch.every((q) => q.done)) return;
    // Once every caller has stopped waiting, the call is cancelled, so
    // quotad stops working on it.
    const gone = new AbortController();
    for (const q of batch) q.onGone = () => batch.every((b) => b.done) && gone.abort();
    if (batch.length === 1) {
      const only = batch[0]!;
      const answer = await this.alone(only.request, Math.max(1, only.deadlineAt - now), gone.signal);
      if (!gone.signal.aborted) only.deliver({ ...answer, sentMs });
      return;
    }
    // The earliest deadline of the batch: a caller answered with its
    // failure policy at its deadline is never counted after it.
    const deadlineMs = Math.max(1, Math.min(...batch.map((q) => q.deadlineAt)) - now);
    this.counts.batches += 1;
    this.counts.checks += batch.length;
    let answer: { decisions: WireDecision[] };
    try {
      answer = (await this.send(
        "CheckBatch",
        { items: batch.map((q) => q.request), mode: "BATCH_MODE_INDEPENDENT" },
        deadlineMs,
        gone.signal,
      )) as typeof answer;
    } catch (error) {
      if (gone.signal.aborted) return;
      await this.failed(batch, error, sentMs);
      return;
    }
    if (answer.decisions.length !== batch.length) {
      const error = new MalformedBatch();
      for (const q of batch) q.deliver({ error, sentMs });
      return;
    }
    const undecided = (d: WireDecision): boolean => d.reason === "REASON_UNAVAILABLE";
    const anyDecided = !answer.decisions.every(undecided);
    const resent: Array<Promise<void>> = [];
    const answeredAt = this.clock();
    batch.forEach((q, i) => {
      const d = answer.decisions[i]!;
      if (!undecided(d)) return q.deliver({ decision: d, sentMs });
      // A caller that has left (aborted, or past its deadline) is sent
      // nothing, and takes no place among the re-sent.
      if (q.done || q.signal?.aborted || q.deadlineAt <= answeredAt) return;
      if (anyDecided && resent.length < MAX_RESENT_ALONE) {
        // The failure may be this item's own: alone, it says what went wrong.
        resent.push(this.resend(q));
      } else {
        q.deliver({
          error: { code: grpc.status.UNAVAILABLE, details: "quotad could not decide this check (REASON_UNAVAILABLE)" },
          sentMs,
        });
      }
    });
    await Promise.all(resent);
  }

  /** Gives each caller of a failed batch its own outcome. */
  private async failed(batch: Queued[], error: unknown, sentMs: number): Promise<void> {
    const code = (error as { code?: unknown })?.code;
    const details = String((error as { details?: unknown })?.details ?? "");
    const offender =
      typeof code === "number" &&
      [grpc.status.INVALID_ARGUMENT, grpc.status.NOT_FOUND, grpc.status.FAILED_PRECONDITION].includes(code)
        ? /^items\[(\d+)\]\.(.*)$/s.exec(details)
        : null;
    const index = offender === null ? undefined : Number(offender[1]);
    const named = index !== undefined && index < batch.length ? index : undefined;
    if (typeof code === "number" && REFUSED_AS_A_WHOLE.has(code) && named === undefined) {
      this.refusedUntilMs = this.clientClock() + BATCH_REFUSAL_BACKOFF_MS;
    }
    if (typeof code !== "number" || !REFUSED_BEFORE_DECIDING.has(code)) {
      for (const q of batch) q.deliver({ error, sentMs });
      return;
    }
    const resent: Array<Promise<void>> = [];
    batch.forEach((q, i) => {
      if (i === named) q.deliver({ error: { code, details: offender![2] }, sentMs });
      else resent.push(this.resend(q));
    });
    await Promise.all(resent);
  }

  /** Sends one check of a batch again, alone, within its caller's deadline. */
  private async resend(q: Queued): Promise<void> {
    const left = q.deadlineAt - this.clock();
    if (q.done || left <= 0 || q.signal?.aborted) return;
    q.deliver(await this.alone(q.request, left, q.signal));
  }
}

/** What a check gets from a closed client: quotad cannot be reached through it. */
export function closedError(): { code: number; details: string } {
  return { code: grpc.status.UNAVAILABLE, details: "the client is closed" };
}

/** A check taken off the queue because its caller aborted. */
export class AbortedInQueue {
  constructor(readonly reason: unknown) {}
}

/** A batch answered with a different number of decisions. */
export class MalformedBatch {}

/** About the encoded size of a check: its text fields and a few bytes for the rest. */
function estimate(request: Record<string, unknown>): number {
  let bytes = 32;
  for (const v of Object.values(request)) {
    if (typeof v === "string") bytes += Buffer.byteLength(v);
    else if (typeof v === "object" && v !== null) bytes += 48;
  }
  return bytes;
}
