/**
 * Express middleware: rate-limits each request through quotad, answering
 * as the Rust `RateLimitLayer` does (429 with `Retry-After` and the
 * `RateLimit` fields; 400 without a key; 503 when quotad is unavailable
 * and the client fails closed or errors).
 *
 * ```ts
 * import { rateLimit } from "@quotad/client/express";
 * app.use("/api", rateLimit({ client, policy: "api", key: { header: "x-api-key" }, windowSecs: 60 }));
 * ```
 */
import type { NextFunction, Request, RequestHandler, Response } from "express";
import { Limiter, type RateLimitOptions } from "./http.js";
import type { Decision } from "./types.js";

/** The Express middleware's options: the shared ones, and a handler for the 429. */
export interface ExpressRateLimitOptions extends RateLimitOptions<Request> {
  /**
   * Answers a denied request instead of the plain `429 too many requests`
   * (the rate-limit headers, and `Retry-After` when there is a wait, are
   * already set), as express-rate-limit's `handler`.
   */
  handler?: (req: Request, res: Response, next: NextFunction, decision: Decision) => void;
}

export type { RateLimitOptions } from "./http.js";
export { retryAfterSecs, rateLimitHeaders } from "./http.js";

/** Middleware checking every request it sees under `options.policy`. */
export function rateLimit(options: ExpressRateLimitOptions): RequestHandler {
  const limiter = new Limiter<Request>(options);
  return (req: Request, res: Response, next: NextFunction): void => {
    limiter
      .decide({ peer: req.socket.remoteAddress, rawHeaders: req.rawHeaders }, req)
      .then((outcome) => {
        for (const [name, value] of outcome.headers) res.setHeader(name, value);
        if (outcome.pass) {
          next();
        } else if (outcome.status === 429 && options.handler !== undefined && outcome.decision !== undefined) {
          res.removeHeader("content-type");
          options.handler(req, res.status(429), next, outcome.decision);
        } else {
          res.status(outcome.status).send(outcome.body);
        }
      })
      // A throwing handler (or setHeader/send) goes to Express's error
      // handling like any middleware's error, never an unhandled rejection.
      .catch(next);
  };
}
