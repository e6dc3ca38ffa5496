// What the HTTP middleware answers, framework-independent: the same
// statuses, headers and rules as the Rust `RateLimitLayer`
// (crates/quotad-client/src/layer/mod.rs). The Express and Fastify
// adapters only read the request and write what this decides.
import { status as grpc } from "@grpc/grpc-js";
import type { Client } from "./client.js";
import { QuotadError } from "./errors.js";
import { IpPrefixes, KeyExtractor, type KeySource, type RequestHead } from "./keys.js";
import type { Decision } from "./types.js";

/** How a middleware keys, prices and checks each request. */
export interface RateLimitOptions<R> {
  /** The quotad client (its deadline and failure policy apply). */
  client: Client;
  /** The named policy every request is checked under. */
  policy: string;
  /** Where the key comes from: `"peer_ip"` (the default), `{ header }`, `{ forwardedFor: { trusted } }`, a function or a {@link KeyExtractor}. */
  key?: KeySource<R>;
  /** Prices a request; 1 by default. */
  cost?: (request: R) => number;
  /** IP keys by network: IPv4 /32 and IPv6 /64 by default. */
  ipPrefixes?: IpPrefixes;
  /** The policy's window in seconds, advertised as `w` in `RateLimit-Policy` (a decision does not carry it). */
  windowSecs?: number;
  /** The IETF `RateLimit` and `RateLimit-Policy` fields; on by default. */
  standardHeaders?: boolean;
  /** The `X-RateLimit-*` fields; on by default. */
  legacyHeaders?: boolean;
  /** Receives failures (at most one line per 10 s, with the count kept quiet); nothing is logged without it. */
  logger?: { warn(message: string, fields: Record<string, unknown>): void };
}

/** What the middleware does with one request. */
export type Outcome =
  /** Let the request through, adding these headers to its response. */
  | { pass: true; headers: Array<[string, string]>; decision: Decision | undefined }
  /** Answer it here. */
  | { pass: false; status: number; body: string; headers: Array<[string, string]>; decision: Decision | undefined };

/** Whole seconds to wait, rounded up, at least 1: a client that retries after `Retry-After` is never early. */
export function retryAfterSecs(retryAfterMs: number): number {
  return Math.max(1, Math.ceil(retryAfterMs / 1_000));
}

/** The rate-limit fields of a decision. */
export function rateLimitHeaders(
  policy: string,
  d: Decision,
  options: { windowSecs?: number | undefined; standardHeaders?: boolean | undefined; legacyHeaders?: boolean | undefined },
): Array<[string, string]> {
  const reset = Math.ceil(d.resetAfterMs / 1_000);
  const headers: Array<[string, string]> = [];
  if (options.standardHeaders ?? true) {
    const w = options.windowSecs === undefined ? "" : `;w=${options.windowSecs}`;
    headers.push(["ratelimit-policy", `"${policy}";q=${d.limit}${w}`]);
    headers.push(["ratelimit", `"${policy}";r=${d.remaining};t=${reset}`]);
  }
  if (options.legacyHeaders ?? true) {
    headers.push(["x-ratelimit-limit", String(d.limit)]);
    headers.push(["x-ratelimit-remaining", String(d.remaining)]);
    headers.push(["x-ratelimit-reset", String(reset)]);
  }
  return headers;
}

const TEXT: [string, string] = ["content-type", "text/plain; charset=utf-8"];

function plain(status: number, body: string, decision?: Decision): Outcome {
  return { pass: false, status, body, headers: [TEXT], decision };
}

/** The framework-independent limiter an adapter calls once per request. */
export class Limiter<R> {
  private readonly key: KeyExtractor<R>;
  private readonly prefixes: IpPrefixes;
  private lastLogMs: number | undefined;
  private quiet = 0;

  constructor(readonly options: RateLimitOptions<R>) {
    if (typeof options.policy !== "string" || options.policy === "") {
      throw new TypeError("policy: must name a policy");
    }
    this.key = KeyExtractor.from(options.key ?? "peer_ip");
    this.prefixes = options.ipPrefixes ?? new IpPrefixes();
  }

  private log(message: string, fields: Record<string, unknown>): void {
    const logger = this.options.logger;
    if (logger === undefined) return;
    const now = Date.now();
    if (this.lastLogMs !== undefined && now - this.lastLogMs < 10_000) {
      this.quiet += 1;
      return;
    }
    logger.warn(message, { policy: this.options.policy, suppressed: this.quiet, ...fields });
    this.lastLogMs = now;
    this.quiet = 0;
  }

  /** Keys, prices and checks one request. */
  async decide(head: RequestHead, request: R): Promise<Outcome> {
    const o = this.options;
    const key = this.key.extract(head, request, this.prefixes);
    if (key === undefined) {
      if (this.key.needsPeer) {
        this.log("no peer address on the request", {});
        return plain(500, "rate limiter misconfigured\n");
      }
      return plain(400, "no rate-limit key in the request\n");
    }
    const cost = o.cost === undefined ? 1 : o.cost(request);
    let decision: Decision;
    try {
      decision = await o.client.check({ policy: o.policy, key, cost });
    } catch (error) {
      this.log("rate-limit check failed", { error: error instanceof Error ? error.message : String(error) });
      if (error instanceof QuotadError && error.kind === "rejected") {
        // quotad refusing the key (too long: it came from the request) is
        // the caller's fault; refusing anything else (an unknown policy, a
        // bad cost from this app's pricing) is this server's, not an outage.
        if (error.code === grpc.INVALID_ARGUMENT && error.details.startsWith("key:")) {
          return plain(400, "invalid rate-limit key\n");
        }
        return plain(500, "rate limiter misconfigured\n");
      }
      return plain(503, "rate limiter unavailable\n");
    }
    if (decision.reason === "fail_open") return { pass: true, headers: [], decision };
    if (decision.reason === "fail_closed") return plain(503, "rate limiter unavailable\n", decision);
    const headers = rateLimitHeaders(o.policy, decision, o);
    if (decision.allowed) return { pass: true, headers, decision };
    // Only a spent budget has a time after which the same request fits; a
    // cost above the capacity never does.
    if (decision.reason === "limit_exceeded") {
      headers.push(["retry-after", String(retryAfterSecs(decision.retryAfterMs))]);
    }
    return { pass: false, status: 429, body: "too many requests\n", headers: [TEXT, ...headers], decision };
  }
}
