// The client: checks with a deadline and a failure policy, answered from
// the deny cache where exactness allows, with the Rust client's answers
// (crates/quotad-client/src/client.rs).
import { performance } from "node:perf_hooks";
import * as grpc from "@grpc/grpc-js";
import { DenyCache, DEFAULT_DENY_CACHE_CAPACITY } from "./denyCache.js";
import { QuotadError } from "./errors.js";
import { services, type WireDecision } from "./grpc.js";
import { keyText, policyFields, policyLabel, units } from "./policy.js";
import { Lessee, type LeaseOptions, type LeaseStats } from "./lease.js";
import { AbortedInQueue, Coalescer, MalformedBatch, closedError, type CoalescingOptions } from "./coalesce.js";
import type {
  BatchMode,
  CallOptions,
  CheckRequest,
  Decision,
  FailurePolicy,
  PolicyRef,
  Reason,
} from "./types.js";

/** The default deadline of one call, connecting included. */
export const DEFAULT_DEADLINE_MS = 250;
/** How often an outage is logged: one line per interval, with the count kept quiet. */
export const OUTAGE_LOG_INTERVAL_MS = 10_000;

/** TLS for an `https://` address: PEM contents, as `tls.connect` takes them. */
export interface TlsOptions {
  /** The CA certificates to trust; the system's roots when absent. */
  ca?: string | Buffer;
  /** A client certificate chain, for mTLS (with `key`). */
  cert?: string | Buffer;
  /** The client certificate's private key, for mTLS (with `cert`). */
  key?: string | Buffer;
  /** The name quotad's certificate must carry, when it differs from the address's host. */
  serverName?: string;
}

/** Where failures are logged; nothing is logged without one. */
export interface Logger {
  warn(message: string, fields: Record<string, unknown>): void;
}

/** How a client is built. */
export interface ClientOptions {
  /** Per call, connecting included; 250 ms by default. */
  deadlineMs?: number;
  /** What a check answers when quotad cannot be reached in time; `error` by default. */
  onUnavailable?: FailurePolicy;
  /** Keys the deny cache holds (10,000 by default); 0 turns it off. */
  denyCache?: number;
  /** TLS settings for an `https://` address. */
  tls?: TlsOptions;
  /** Leases for policies that allow them; off by default. */
  leases?: LeaseOptions;
  /**
   * Concurrent checks coalesced into one `CheckBatch` while every in-flight
   * slot is busy (as the Rust client); on by default, `false` turns it off.
   */
  coalescing?: CoalescingOptions | false;
  /** Receives `quotad unavailable` warnings (at most one per 10 s). */
  logger?: Logger;
  /** Extra `@grpc/grpc-js` channel options. */
  channelOptions?: grpc.ChannelOptions;
  /** A monotonic clock in milliseconds (tests); `performance.now()` by default. */
  clock?: () => number;
}

/** What a client has done, counted since it was built. */
export interface ClientStats {
  /** `Check` calls sent to quotad. */
  checkCalls: number;
  /** `CheckBatch` calls sent, coalesced ones included. */
  batchCalls: number;
  /** Batches that coalesced concurrent checks, and the checks they carried. */
  coalescedBatches: number;
  coalescedChecks: number;
  /** `Lease` calls sent. */
  leaseCalls: number;
  /** Checks answered from the deny cache, without a call. */
  localDenials: number;
  /** Calls answered by the failure policy (or failed with `error`), by outcome. */
  unavailable: { fail_open: number; fail_closed: number; error: number };
}

type UnaryMethod = (
  request: unknown,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response: unknown) => void,
) => grpc.ClientUnaryCall;

/** What every handle of one client shares: the channel, the cache, the counters. */
export interface Shared {
  quota: grpc.Client;
  leases: grpc.Client;
  cache: DenyCache | undefined;
  clock: () => number;
  stats: ClientStats;
  logger: Logger | undefined;
  lastLogMs: number | undefined;
  quiet: number;
  lessee: Lessee | undefined;
  coalescer: Coalescer | undefined;
  /** Calls in flight outside the coalescer, and who waits for them to end (closing). */
  calls: number;
  idle: Array<() => void>;
  closed: boolean;
  /** The first close's work: every later close returns it. */
  closing: Promise<void> | undefined;
}

/** A gRPC call that ended before an answer: the status, or the caller's abort. */
class Aborted {
  constructor(readonly reason: unknown) {}
}

const REASONS: Record<string, Reason> = {
  REASON_WITHIN_LIMIT: "within_limit",
  REASON_LIMIT_EXCEEDED: "limit_exceeded",
  REASON_COST_EXCEEDS_CAPACITY: "cost_exceeds_capacity",
  REASON_CAPACITY: "capacity",
  REASON_BATCH_REJECTED: "batch_rejected",
  REASON_FAIL_OPEN: "fail_open",
  REASON_FAIL_CLOSED: "fail_closed",
  REASON_UNAVAILABLE: "unavailable",
  REASON_LOCAL_FALLBACK: "local_fallback",
};

/** Codes that mean quotad was not reached (or did not answer) in time: the failure policy's. */
const UNREACHED = new Set<number>([
  grpc.status.UNAVAILABLE,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.CANCELLED,
  grpc.status.UNKNOWN,
]);

function invalidAddress(field: string, message: string): QuotadError {
  return new QuotadError("invalid_address", grpc.status.INVALID_ARGUMENT, `${field}: ${message}`, { field });
}

/** The gRPC target and credentials of an address. */
function target(address: string, tls: TlsOptions | undefined): {
  target: string;
  credentials: grpc.ChannelCredentials;
  options: grpc.ChannelOptions;
} {
  const options: grpc.ChannelOptions = {};
  if (address.startsWith("unix:")) {
    if (tls !== undefined) throw invalidAddress("tls", "TLS is not used on a unix: address");
    return { target: address, credentials: grpc.credentials.createInsecure(), options };
  }
  let rest = address;
  let secure = false;
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(address);
  if (scheme !== null) {
    const name = scheme[1]!.toLowerCase();
    if (name !== "http" && name !== "https") {
      throw invalidAddress("address", `unsupported scheme ${JSON.stringify(name)} (http, https or unix)`);
    }
    secure = name === "https";
    rest = address.slice(scheme[0].length).replace(/\/+$/, "");
  }
  if (rest === "" || rest.includes("/")) throw invalidAddress("address", `expected host:port, got ${JSON.stringify(address)}`);
  if (!secure) {
    if (tls !== undefined) throw invalidAddress("tls", "TLS settings need an https:// address");
    return { target: rest, credentials: grpc.credentials.createInsecure(), options };
  }
  const t = tls ?? {};
  if ((t.cert === undefined) !== (t.key === undefined)) {
    throw invalidAddress(t.cert === undefined ? "tls.cert" : "tls.key", "mTLS needs both cert and key");
  }
  const pem = (v: string | Buffer | undefined): Buffer | null =>
    v === undefined ? null : Buffer.isBuffer(v) ? v : Buffer.from(v);
  const ca = pem(t.ca);
  if (ca !== null && !ca.toString("latin1").includes("-----BEGIN CERTIFICATE-----")) {
    throw invalidAddress("tls.ca", "holds no PEM certificate");
  }
  let credentials: grpc.ChannelCredentials;
  try {
    credentials = grpc.credentials.createSsl(ca, pem(t.key), pem(t.cert));
  } catch (error) {
    throw invalidAddress("tls", error instanceof Error ? error.message : String(error));
  }
  if (t.serverName !== undefined) {
    options["grpc.ssl_target_name_override"] = t.serverName;
    options["grpc.default_authority"] = t.serverName;
  }
  return { target: rest, credentials, options };
}

function failureDecision(reason: Reason): Decision {
  return { allowed: reason === "fail_open", limit: 0, remaining: 0, retryAfterMs: 0, resetAfterMs: 0, reason };
}

/** The decision of a wire answer. */
export function fromWire(d: WireDecision | null | undefined): Decision {
  if (d === null || d === undefined) throw new QuotadError("bad_response", grpc.status.INTERNAL, "decision missing");
  const reason = REASONS[d.reason];
  if (reason === undefined) throw new QuotadError("bad_response", grpc.status.INTERNAL, "unknown reason");
  return {
    allowed: d.allowed,
    limit: Number(d.limit),
    remaining: Number(d.remaining),
    retryAfterMs: Number(d.retry_after_ms),
    resetAfterMs: Number(d.reset_after_ms),
    reason,
  };
}

/** The wire form of a check. */
export function checkToWire(check: CheckRequest, prefix = ""): Record<string, unknown> {
  return {
    key: keyText(check.key, `${prefix}key`),
    cost: units(check.cost ?? 1, `${prefix}cost`),
    ...policyFields(check.policy, prefix),
  };
}

/**
 * A handle to one quotad. Handles made with {@link Client.withDeadline} and
 * {@link Client.withFailurePolicy} share its connection and deny cache.
 *
 * ```ts
 * const client = new Client("http://127.0.0.1:50051", { deadlineMs: 100, onUnavailable: "fail_open" });
 * const d = await client.check({ policy: "login", key: "alice" });
 * if (!d.allowed) console.log(`retry in ${d.retryAfterMs} ms`);
 * ```
 */
export class Client {
  /** @internal */
  readonly shared: Shared;
  /** This handle's deadline, in milliseconds. */
  readonly deadlineMs: number;
  /** This handle's failure policy. */
  readonly onUnavailable: FailurePolicy;

  /**
   * A client of quotad at `address`: `http://host:port` (or `host:port`),
   * `https://host:port` (with `options.tls`), or `unix:///path/quotad.sock`.
   * Connects on first use and again by itself after quotad restarts.
   *
   * @throws {QuotadError} `invalid_address` when the address or its TLS settings are unusable.
   */
  constructor(address: string, options?: ClientOptions);
  /** @internal */
  constructor(shared: Shared, deadlineMs: number, onUnavailable: FailurePolicy);
  constructor(addressOrShared: string | Shared, optionsOrDeadline?: ClientOptions | number, policy?: FailurePolicy) {
    if (typeof addressOrShared !== "string") {
      this.shared = addressOrShared;
      this.deadlineMs = optionsOrDeadline as number;
      this.onUnavailable = policy as FailurePolicy;
      return;
    }
    const options = (optionsOrDeadline as ClientOptions | undefined) ?? {};
    const deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    if (!Number.isFinite(deadlineMs) || deadlineMs < 1) throw invalidAddress("deadlineMs", "must be at least 1");
    const onUnavailable = options.onUnavailable ?? "error";
    if (!["error", "fail_open", "fail_closed"].includes(onUnavailable)) {
      throw invalidAddress("onUnavailable", `must be error, fail_open or fail_closed (got ${String(onUnavailable)})`);
    }
    const t = target(addressOrShared, options.tls);
    const { Quota, Leases } = services();
    const channelOptions: grpc.ChannelOptions = {
      // A connection that stops answering is found by keepalive and dropped
      // (10 s without a frame, then 5 s for the ping's answer), as the Rust client does.
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 5_000,
      "grpc.keepalive_permit_without_calls": 1,
      // After an outage, connect again within a second or two, not grpc-js's two minutes.
      "grpc.initial_reconnect_backoff_ms": 250,
      "grpc.max_reconnect_backoff_ms": 2_000,
      ...t.options,
      ...options.channelOptions,
    };
    const quota = new Quota(t.target, t.credentials, channelOptions);
    const leases = new Leases(t.target, t.credentials, { ...channelOptions, channelOverride: quota.getChannel() });
    const capacity = options.denyCache ?? DEFAULT_DENY_CACHE_CAPACITY;
    const clock = options.clock ?? (() => Math.floor(performance.now()));
    this.shared = {
      quota,
      leases,
      cache: capacity > 0 ? new DenyCache(capacity) : undefined,
      clock,
      stats: {
        checkCalls: 0,
        batchCalls: 0,
        coalescedBatches: 0,
        coalescedChecks: 0,
        leaseCalls: 0,
        localDenials: 0,
        unavailable: { fail_open: 0, fail_closed: 0, error: 0 },
      },
      logger: options.logger,
      lastLogMs: undefined,
      quiet: 0,
      lessee: undefined,
      coalescer: undefined,
      calls: 0,
      idle: [],
      closed: false,
      closing: undefined,
    };
    this.deadlineMs = deadlineMs;
    this.onUnavailable = onUnavailable;
    if (options.coalescing !== false) {
      const stats = this.shared.stats;
      this.shared.coalescer = new Coalescer(
        options.coalescing ?? {},
        (method, request, ms, signal) => {
          if (method === "Check") stats.checkCalls += 1;
          else stats.batchCalls += 1;
          return this.unary(quota, method, request, { deadlineMs: ms, signal }, false);
        },
        () => performance.now(),
        clock,
      );
    }
    if (options.leases !== undefined) {
      const stats = this.shared.stats;
      this.shared.lessee = new Lessee(
        options.leases,
        leases,
        (stub, method, request, o) => this.unary(stub, method, request, o),
        clock,
        deadlineMs,
        () => (stats.leaseCalls += 1),
      );
    }
  }

  /** A handle sharing this one's connection and cache, whose calls take at most `deadlineMs`. */
  withDeadline(deadlineMs: number): Client {
    return new Client(this.shared, deadlineMs, this.onUnavailable);
  }

  /** A handle sharing this one's connection and cache, with its own failure policy. */
  withFailurePolicy(policy: FailurePolicy): Client {
    return new Client(this.shared, this.deadlineMs, policy);
  }

  /** What this client has done so far (a copy). */
  stats(): ClientStats {
    const s = this.shared.stats;
    const coalesced = this.shared.coalescer?.counts;
    return {
      ...s,
      coalescedBatches: coalesced?.batches ?? 0,
      coalescedChecks: coalesced?.checks ?? 0,
      unavailable: { ...s.unavailable },
    };
  }

  /** What this client's leases have done (all zero with leases off). */
  leaseStats(): LeaseStats {
    return this.shared.lessee?.stats() ?? Lessee.emptyStats();
  }

  /**
   * Decides and consumes one request. A check that a cached
   * `limit_exceeded` denial covers is answered without a call; with leases
   * on, one that a held lease covers is admitted locally (reason
   * `within_limit`, `remaining` the units left in the lease).
   *
   * @throws {QuotadError} `rejected` for bad input or an unknown policy;
   *   `unavailable` when quotad cannot be reached and the failure policy is `error`.
   */
  async check(check: CheckRequest, options?: CallOptions): Promise<Decision> {
    // Bad input is refused before any local answer, as quotad would refuse it;
    // so is a call whose caller has already stopped waiting.
    const wire = checkToWire(check);
    if (options?.signal?.aborted) throw options.signal.reason;
    if (check.leaseTerms !== undefined && typeof check.policy !== "string") {
      units(check.leaseTerms.maxUnits, "inline_terms.max_units");
      units(check.leaseTerms.minUnits, "inline_terms.min_units");
      units(check.leaseTerms.maxTtlMs, "inline_terms.max_ttl_ms");
    }
    const shared = this.shared;
    // Before any local answer: once closing has begun, no lease is spent, no
    // cached denial answers and no lease call starts.
    if (shared.closed) return this.unavailable(closedError(), 1)[0]!;
    const lessee = shared.lessee;
    if (lessee !== undefined) {
      const local = lessee.spend(check, this.deadlineMs);
      if (local !== undefined) return local;
    }
    const cache = shared.cache;
    if (cache !== undefined) {
      const local = cache.lookup(check, shared.clock());
      if (local !== undefined) {
        shared.stats.localDenials += 1;
        return local;
      }
    }
    const sent = cache?.sent(shared.clock());
    let sentMs = sent?.atMs ?? 0;
    let answer: { decision: WireDecision | null };
    if (shared.coalescer !== undefined) {
      const got = await shared.coalescer.submit(wire, options?.deadlineMs ?? this.deadlineMs, options?.signal);
      if ("error" in got) {
        if (got.error instanceof AbortedInQueue) throw got.error.reason;
        if (got.error instanceof MalformedBatch) {
          throw new QuotadError("bad_response", grpc.status.INTERNAL, "the number of decisions differs from the number of checks");
        }
        return this.unavailable(got.error, 1)[0]!;
      }
      answer = got;
      // Timed from when the check left (in a batch, maybe later than its enqueue).
      sentMs = got.sentMs ?? sentMs;
    } else {
      shared.stats.checkCalls += 1;
      try {
        answer = (await this.unary(shared.quota, "Check", wire, options)) as typeof answer;
      } catch (error) {
        return this.unavailable(error, 1)[0]!;
      }
    }
    const decision = fromWire(answer.decision);
    if (cache !== undefined && sent !== undefined) cache.record(check, decision, { ...sent, atMs: sentMs }, shared.clock());
    return decision;
  }

  /**
   * Decides a batch of at most 1,000 items in one round trip. Never answered
   * from the deny cache: the mode decides how the items affect each other.
   *
   * @throws {QuotadError} as {@link Client.check}.
   */
  async checkBatch(
    checks: CheckRequest[],
    options?: CallOptions & { mode?: BatchMode },
  ): Promise<Decision[]> {
    const mode = options?.mode ?? "independent";
    const request = {
      items: checks.map((c, i) => checkToWire(c, `items[${i}].`)),
      mode: mode === "all_or_nothing" ? "BATCH_MODE_ALL_OR_NOTHING" : "BATCH_MODE_INDEPENDENT",
    };
    this.shared.stats.batchCalls += 1;
    let answer: { decisions: WireDecision[] };
    try {
      answer = (await this.unary(this.shared.quota, "CheckBatch", request, options)) as typeof answer;
    } catch (error) {
      return this.unavailable(error, checks.length);
    }
    if (answer.decisions.length !== checks.length) {
      throw new QuotadError(
        "bad_response",
        grpc.status.INTERNAL,
        "the number of decisions differs from the number of checks",
      );
    }
    return answer.decisions.map(fromWire);
  }

  /**
   * What {@link Client.check} would answer now, consuming nothing. Always asks quotad.
   *
   * @throws {QuotadError} as {@link Client.check}.
   */
  async peek(check: CheckRequest, options?: CallOptions): Promise<Decision> {
    const wire = checkToWire(check);
    let answer: { decision: WireDecision | null };
    try {
      answer = (await this.unary(this.shared.quota, "Peek", wire, options)) as typeof answer;
    } catch (error) {
      return this.unavailable(error, 1)[0]!;
    }
    return fromWire(answer.decision);
  }

  /**
   * Forgets the state of `key` under `policy`: its budget starts full. Drops
   * this client's cached denial of the key. Not subject to the failure policy.
   *
   * @throws {QuotadError} `rejected` or `unavailable`.
   */
  async reset(request: { key: string; policy: PolicyRef }, options?: CallOptions): Promise<void> {
    const wire = { key: keyText(request.key, "key"), ...policyFields(request.policy) };
    try {
      await this.unary(this.shared.quota, "Reset", wire, options);
    } catch (error) {
      if (error instanceof Aborted) throw error.reason;
      throw classify(error);
    } finally {
      // Even a reset that timed out may have happened.
      this.shared.cache?.forget(request.policy, request.key);
    }
  }

  /**
   * Drains, returns the leases, then closes the connection, as the Rust
   * client shuts down: checks already taken (in flight, or queued for the
   * next batch) are sent and answered as before, each within its own
   * deadline; then every lease held is returned (its unspent units go back
   * at once, after lease calls in flight, within the deadline) and the
   * connection closed. A call made once `close` has begun answers as an
   * unreachable quotad does (UNAVAILABLE "the client is closed", through the
   * failure policy; `reset` throws it). A second `close` settles when the
   * first does.
   */
  close(): Promise<void> {
    const shared = this.shared;
    shared.closing ??= this.shutdown();
    return shared.closing;
  }

  private async shutdown(): Promise<void> {
    const shared = this.shared;
    shared.closed = true;
    // No lease call starts once closing has begun.
    shared.lessee?.close();
    await shared.coalescer?.close();
    if (shared.calls > 0) await new Promise<void>((resolve) => shared.idle.push(resolve));
    await this.shared.lessee?.shutdown();
    this.shared.leases.close();
    this.shared.quota.close();
  }

  /** @internal One unary call within the deadline, cancelled when the caller aborts; refused once the client is closing. */
  unary(
    stub: grpc.Client,
    method: string,
    request: unknown,
    options: CallOptions | undefined,
    /** Counted as the client's own call, for closing to wait for. */
    own = true,
  ): Promise<unknown> {
    const deadlineMs = options?.deadlineMs ?? this.deadlineMs;
    const signal = options?.signal;
    const shared = this.shared;
    // The coalescer's calls are counted by it, the lease calls by the lessee.
    const counted = own && stub === shared.quota;
    if (counted && shared.closed) return Promise.reject(closedError());
    if (counted) shared.calls += 1;
    const pending = new Promise<unknown>((resolve, reject) => {
      if (signal?.aborted) {
        reject(new Aborted(signal.reason));
        return;
      }
      let done = false;
      let call: grpc.ClientUnaryCall | undefined;
      const finish = (f: () => void): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      const onAbort = (): void => {
        finish(() => reject(new Aborted(signal?.reason)));
        call?.cancel();
      };
      // The deadline is sent to quotad as the gRPC timeout and enforced here
      // too, so the answer comes within it whatever the connection does.
      const timer = setTimeout(() => {
        finish(() =>
          reject({ code: grpc.status.DEADLINE_EXCEEDED, details: "no answer from quotad within the deadline" }),
        );
        call?.cancel();
      }, deadlineMs);
      signal?.addEventListener("abort", onAbort, { once: true });
      const fn = (stub as unknown as Record<string, UnaryMethod>)[method]!.bind(stub);
      call = fn(request, new grpc.Metadata(), { deadline: Date.now() + deadlineMs }, (error, response) => {
        finish(() => (error ? reject(error) : resolve(response)));
      });
    });
    if (!counted) return pending;
    return pending.finally(() => {
      shared.calls -= 1;
      if (shared.calls === 0) for (const wake of shared.idle.splice(0)) wake();
    });
  }

  /** A failed call: the caller's abort and quotad's refusal pass through; an unreachable quotad becomes `count` decisions as the failure policy says, or an error. */
  private unavailable(error: unknown, count: number): Decision[] {
    if (error instanceof Aborted) throw error.reason;
    const classified = classify(error);
    if (classified.kind !== "unavailable") throw classified;
    const shared = this.shared;
    const outcome = this.onUnavailable;
    shared.stats.unavailable[outcome] += 1;
    if (outcome === "error") throw classified;
    const now = shared.clock();
    if (shared.logger !== undefined) {
      if (shared.lastLogMs === undefined || now - shared.lastLogMs >= OUTAGE_LOG_INTERVAL_MS) {
        shared.logger.warn("quotad unavailable", {
          code: classified.codeName,
          error: classified.details,
          outcome,
          suppressed: shared.quiet,
        });
        shared.lastLogMs = now;
        shared.quiet = 0;
      } else {
        shared.quiet += 1;
      }
    }
    return Array.from({ length: count }, () => failureDecision(outcome));
  }
}

/** A failed call's error: unreached-style codes are `unavailable`, anything else quotad refusing the request. */
export function classify(error: unknown): QuotadError {
  if (error instanceof QuotadError) return error;
  const e = error as { code?: unknown; details?: unknown; message?: unknown };
  if (typeof e?.code !== "number") {
    return new QuotadError("unavailable", grpc.status.UNKNOWN, String(e?.message ?? error), { cause: error });
  }
  const details = typeof e.details === "string" ? e.details : String(e.message ?? "");
  const kind = UNREACHED.has(e.code) ? "unavailable" : "rejected";
  return new QuotadError(kind, e.code, details, { cause: error });
}

export { policyLabel };
