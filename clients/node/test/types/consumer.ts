// Compiled (never run) by `npm test` with `tsc --strict`: the types the
// package ships, as an application imports them by the package's name.
import { Client, IpPrefixes, KeyExtractor, QuotadError, type Decision, type Reason } from "@quotad/client";
import { rateLimit as expressRateLimit } from "@quotad/client/express";
import { rateLimit as fastifyRateLimit } from "@quotad/client/fastify";
import express from "express";
import Fastify from "fastify";

export async function first(): Promise<Reason> {
  const client = new Client("http://127.0.0.1:50051", { deadlineMs: 100, onUnavailable: "fail_open", leases: { want: 10 } });
  const d: Decision = await client.check({ policy: "login", key: "alice" }, { signal: AbortSignal.timeout(50) });
  const batch: Decision[] = await client.checkBatch(
    [{ policy: { algorithm: "token_bucket", limit: 5, windowMs: 1_000, burst: 10 }, key: "a", cost: 2 }],
    { mode: "all_or_nothing" },
  );
  try {
    await client.reset({ policy: "login", key: "alice" });
  } catch (e) {
    if (e instanceof QuotadError && e.kind === "rejected") console.log(e.code, e.codeName, e.field);
  }
  const app = express();
  app.use(expressRateLimit({ client, policy: "api", key: { header: "x-api-key" }, windowSecs: 60 }));
  app.use(expressRateLimit({ client, policy: "api", key: (req) => req.get("x-tenant"), ipPrefixes: new IpPrefixes(24, 48) }));
  const f = Fastify();
  f.addHook("onRequest", fastifyRateLimit({ client, policy: "api", key: KeyExtractor.forwardedFor({ trusted: ["10.0.0.0/8"] }) }));
  await client.close();
  return batch[0]?.reason ?? d.reason;
}
