/**
 * The quotad client for Node.js: `check`, `checkBatch`, `peek` and `reset`
 * against quotad's gRPC API, with a per-call deadline, a failure policy and
 * a deny cache, answering as the Rust client does. HTTP middleware lives in
 * `@quotad/client/express` and `@quotad/client/fastify`.
 *
 * ```ts
 * import { Client } from "@quotad/client";
 * const client = new Client("http://127.0.0.1:50051");
 * const decision = await client.check({ policy: "login", key: "alice" });
 * ```
 */
export { Client, DEFAULT_DEADLINE_MS, OUTAGE_LOG_INTERVAL_MS, classify } from "./client.js";
export type { ClientOptions, ClientStats, Logger, TlsOptions } from "./client.js";
export { DEFAULT_DENY_CACHE_CAPACITY } from "./denyCache.js";
export { QuotadError, codeName } from "./errors.js";
export type { ErrorKind } from "./errors.js";
export { PROTO_ROOT } from "./grpc.js";
export { IpPrefixes, KeyExtractor } from "./keys.js";
export type { KeySource, RequestHead } from "./keys.js";
export type {
  Algorithm,
  BatchMode,
  CallOptions,
  CheckRequest,
  Decision,
  FailurePolicy,
  InlinePolicy,
  PolicyRef,
  Reason,
} from "./types.js";
export { NOT_LEASABLE_RECHECK_MS } from "./lease.js";
export { BATCH_REFUSAL_BACKOFF_MS, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_IN_FLIGHT, MAX_RESENT_ALONE } from "./coalesce.js";
export type { CoalescingOptions } from "./coalesce.js";
export type { LeaseOptions, LeaseStats, LeaseTerms } from "./lease.js";
