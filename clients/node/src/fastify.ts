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

export type { RateLimitOptions } from "./http.js";
export { retryAfterSecs, rateLimitHeaders } from "./http.js";

/** An `onRequest` hook checking every request it sees under `options.policy`. */
export function rateLimit(options: RateLimitOptions<FastifyRequest>): onRequestAsyncHookHandler {
  const limiter = new Limiter<FastifyRequest>(options);
  return async function quotadRateLimit(request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const outcome = await limiter.decide(
      { peer: request.raw.socket.remoteAddress, rawHeaders: request.raw.rawHeaders },
      request,
    );
    for (const [name, value] of outcome.headers) reply.header(name, value);
    if (outcome.pass) return undefined;
    // An async hook that answers returns the reply, so Fastify stops there.
    return reply.code(outcome.status).send(outcome.body);
  };
}
