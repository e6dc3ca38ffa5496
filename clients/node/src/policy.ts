import { status } from "@grpc/grpc-js";
import { QuotadError } from "./errors.js";
import type { Algorithm, InlinePolicy, PolicyRef } from "./types.js";

/**
 * A whole number of units for a uint64 field, as quotad reads it: a
 * fraction, a negative number or one past 2^53 would be truncated or
 * wrapped on the wire, so it is refused here as quotad refuses bad input:
 * INVALID_ARGUMENT naming the field, nothing sent.
 */
export function units(value: unknown, field: string): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new QuotadError(
      "rejected",
      status.INVALID_ARGUMENT,
      `${field}: must be a whole number from 0 to 2^53 - 1 (got ${String(value)})`,
    );
  }
  return value;
}

/** A key as quotad reads it: a string. */
export function keyText(value: unknown, field: string): string {
  if (typeof value !== "string") {
    throw new QuotadError("rejected", status.INVALID_ARGUMENT, `${field}: must be a string (got ${typeof value})`);
  }
  return value;
}

const ALGORITHMS: Record<Algorithm, string> = {
  fixed_window: "ALGORITHM_FIXED_WINDOW",
  sliding_window: "ALGORITHM_SLIDING_WINDOW",
  token_bucket: "ALGORITHM_TOKEN_BUCKET",
  leaky_bucket: "ALGORITHM_LEAKY_BUCKET",
  sliding_log: "ALGORITHM_SLIDING_LOG",
};

/** The wire form of an inline policy (field names as in quota.proto). */
export function inlineToProto(p: InlinePolicy, prefix = ""): Record<string, unknown> {
  const at = `${prefix}inline_policy`;
  const wire: Record<string, unknown> = {
    // An unknown name goes as ALGORITHM_UNSPECIFIED, which quotad refuses naming the field.
    algorithm: ALGORITHMS[p.algorithm] ?? "ALGORITHM_UNSPECIFIED",
    limit: units(p.limit, `${at}.limit`),
    window_ms: units(p.windowMs, `${at}.window_ms`),
  };
  if (p.burst !== undefined && p.burst !== null) wire.burst = units(p.burst, `${at}.burst`);
  return wire;
}

/** The policy oneof of a request: `policy_name` or `inline_policy`. */
export function policyFields(policy: PolicyRef, prefix = ""): Record<string, unknown> {
  if (typeof policy === "string") return { policy_name: policy };
  if (policy === null || typeof policy !== "object") {
    throw new QuotadError("rejected", status.INVALID_ARGUMENT, `${prefix}policy: must be a policy name or an inline policy`);
  }
  return { inline_policy: inlineToProto(policy, prefix) };
}

/** An identity of (policy, key) for local tables: equal policies give equal ids. */
export function policyId(policy: PolicyRef, key: string): string {
  const p =
    typeof policy === "string"
      ? `n:${policy}`
      : `i:${policy.algorithm}:${policy.limit}:${policy.windowMs}:${policy.burst ?? policy.limit}`;
  return `${p}\u0000${key}`;
}

/** The label of a policy in logs and metrics: its name, or `inline`; never the key. */
export function policyLabel(policy: PolicyRef): string {
  return typeof policy === "string" ? policy : "inline";
}
