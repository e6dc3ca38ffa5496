import { status as Status } from "@grpc/grpc-js";

/** Why a call failed. */
export type ErrorKind =
  /** quotad refused the request (bad input, unknown policy): a bug in the caller, never subject to the failure policy. */
  | "rejected"
  /** quotad could not be reached within the deadline and the failure policy is `error`. */
  | "unavailable"
  /** The answer could not be understood (a server from a newer API). */
  | "bad_response"
  /** The address or TLS settings are not usable. */
  | "invalid_address";

/** A field path as quotad writes it first in a message: `key`, `inline_policy.limit`, `items[3].policy_name`. */
const FIELD = /^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*): /;

/** The name of a gRPC status code, e.g. `INVALID_ARGUMENT`. */
export function codeName(code: number): string {
  return (Status as unknown as Record<number, string>)[code] ?? `CODE_${code}`;
}

/**
 * A failed call, with the gRPC status code and, when quotad named one, the
 * request field it refused (`error.field === "cost"`).
 */
export class QuotadError extends Error {
  override readonly name = "QuotadError";
  /** What kind of failure this is. */
  readonly kind: ErrorKind;
  /** The gRPC status code (`@grpc/grpc-js`'s `status`), e.g. 3 for INVALID_ARGUMENT. */
  readonly code: number;
  /** The status code's name, e.g. `INVALID_ARGUMENT`. */
  readonly codeName: string;
  /** The status message as quotad (or the transport) wrote it. */
  readonly details: string;
  /** The field quotad named (`key`, `cost`, `items[1].policy_name`), if any. */
  readonly field: string | undefined;

  constructor(kind: ErrorKind, code: number, details: string, options?: { cause?: unknown; field?: string }) {
    const name = codeName(code);
    const prefix =
      kind === "rejected"
        ? "quotad rejected the request"
        : kind === "unavailable"
          ? "quotad is unavailable"
          : kind === "bad_response"
            ? "unexpected answer from quotad"
            : "invalid quotad address";
    super(`${prefix}: ${name}: ${details}`, options);
    this.kind = kind;
    this.code = code;
    this.codeName = name;
    this.details = details;
    this.field = options?.field ?? (kind === "rejected" ? FIELD.exec(details)?.[1] : undefined);
  }
}
