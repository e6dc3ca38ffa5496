import type { Algorithm, InlinePolicy, PolicyRef } from "./types.js";

const ALGORITHMS: Record<Algorithm, string> = {
  fixed_window: "ALGORITHM_FIXED_WINDOW",
  sliding_window: "ALGORITHM_SLIDING_WINDOW",
  token_bucket: "ALGORITHM_TOKEN_BUCKET",
  leaky_bucket: "ALGORITHM_LEAKY_BUCKET",
  sliding_log: "ALGORITHM_SLIDING_LOG",
};

/** The wire form of an inline policy (field names as in quota.proto). */
export function inlineToProto(p: InlinePolicy): Record<string, unknown> {
  const wire: Record<string, unknown> = {
    // An unknown name goes as ALGORITHM_UNSPECIFIED, which quotad refuses naming the field.
    algorithm: ALGORITHMS[p.algorithm] ?? "ALGORITHM_UNSPECIFIED",
    limit: p.limit,
    window_ms: p.windowMs,
  };
  if (p.burst !== undefined && p.burst !== null) wire.burst = p.burst;
  return wire;
}

/** The policy oneof of a request: `policy_name` or `inline_policy`. */
export function policyFields(policy: PolicyRef): Record<string, unknown> {
  return typeof policy === "string" ? { policy_name: policy } : { inline_policy: inlineToProto(policy) };
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
