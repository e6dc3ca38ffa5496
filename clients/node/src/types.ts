/** The rate-limit algorithms quotad counts with (`quota.proto`'s `Algorithm`). */
export type Algorithm =
  | "fixed_window"
  | "sliding_window"
  | "token_bucket"
  | "leaky_bucket"
  | "sliding_log";

/** A policy given with the request instead of a name from quotad's configuration. */
export interface InlinePolicy {
  algorithm: Algorithm;
  /** Units admitted per window (or refilled / drained per window for the buckets). */
  limit: number;
  /** The window, in whole milliseconds. */
  windowMs: number;
  /** Bucket capacity (bucket algorithms only); defaults to `limit`. */
  burst?: number | null;
}

/** A policy: the name of one in quotad's configuration, or an inline one. */
export type PolicyRef = string | InlinePolicy;

/** One request: `cost` units (1 by default) of `key` under `policy`. */
export interface CheckRequest {
  key: string;
  policy: PolicyRef;
  /** Units this request spends; 1 when absent. */
  cost?: number;
  /** How quotad may lease an inline policy's budget to a client with leases on (ignored for a named policy). */
  leaseTerms?: LeaseTerms;
}

/** The lease terms of an inline policy (a named policy's are quotad's). */
export interface LeaseTerms {
  maxUnits: number;
  minUnits: number;
  maxTtlMs: number;
}

/** Why a decision came out the way it did (`quota.proto`'s `Reason`, as the Rust client spells it). */
export type Reason =
  | "within_limit"
  | "limit_exceeded"
  | "cost_exceeds_capacity"
  | "capacity"
  | "batch_rejected"
  | "fail_open"
  | "fail_closed"
  | "unavailable"
  | "local_fallback";

/** The outcome of one check. A denial is a decision, never an error. */
export interface Decision {
  allowed: boolean;
  /** The capacity: the largest cost ever admitted at once. */
  limit: number;
  /** Unit-cost requests that would be allowed now, after this decision. */
  remaining: number;
  /** 0 when allowed; for `limit_exceeded`, the wait after which the same cost fits. */
  retryAfterMs: number;
  /** Time until the key's state is fresh again. */
  resetAfterMs: number;
  reason: Reason;
}

/** How the items of a batch affect each other. */
export type BatchMode = "independent" | "all_or_nothing";

/** What a call answers when quotad cannot be reached within its deadline. */
export type FailurePolicy = "error" | "fail_open" | "fail_closed";

/** Options of one call. */
export interface CallOptions {
  /** This call's deadline in milliseconds, connecting included; the client's by default. */
  deadlineMs?: number;
  /** Stops waiting: the call rejects with the signal's reason (not subject to the failure policy). */
  signal?: AbortSignal;
}
