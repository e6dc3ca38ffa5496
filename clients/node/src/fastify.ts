/**
 * Fastify hook: rate-limits each request through quotad, answering as the
 * Rust `RateLimitLayer` does.
 *
 * ```ts
 * import { rateLimit } from "@quotad/client/fastify";
 * app.addHook("onRequest", rateLimit({ client, policy: "api", windowSecs: 60 }));
 * // or per route: app.get("/search", { onRequest: rateLimit({ ... }) }, handler)
 * ```
 */
import type { FastifyReply, FastifyRequest, onRequestAsyncHookHandler } from "fastify";
import { Limiter, type RateLimitOptions } from "./http.js";
import type { Decision } from "./types.js";

/** The Fastify hook's options: the shared ones, and a handler for the 429. */
export interface FastifyRateLimitOptions extends RateLimitOptions<FastifyRequest> {
  /**
   * Answers a denied request instead of the plain `429 too many requests`
   * (status 429 and the rate-limit headers already set on `reply`); returns
   * what the hook returns, e.g. `reply.send(...)`.
   */
  handler?: (request: FastifyRequest, reply: FastifyReply, decision: Decision) => unknown;
}

export type { RateLimitOptions } from "./http.js";
export { retryAfterSecs, rateLimitHeaders } from "./http.js";

/** An `onRequest` hook checking every request it sees under `options.policy`. */
export function rateLimit(options: FastifyRateLimitOptions): onRequestAsyncHookHandler {
  const limiter = new Limiter<FastifyRequest>(options);
  return async function quotadRateLimit(request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const outcome = await limiter.decide(
      { peer: request.raw.socket.remoteAddress, rawHeaders: request.raw.rawHeaders },
      request,
    );
    for (const [name, value] of outcome.headers) reply.header(name, value);
    if (outcome.pass) return undefined;
    if (outcome.status === 429 && options.handler !== undefined && outcome.decision !== undefined) {
      reply.removeHeader("content-type");
      await options.handler(request, reply.code(429), outcome.decision);
      return reply;
    }
    // An async hook that answers returns the reply, so Fastify stops there.
    return reply.code(outcome.status).send(outcome.body);
  };
}
