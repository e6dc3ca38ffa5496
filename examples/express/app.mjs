// An Express app with one unlimited route and one behind quotad:
//
//   quotad serve --config config/quotad.example.toml
//   node app.mjs http://127.0.0.1:50051 3000
//   for i in $(seq 7); do curl -si -H 'x-api-key: alice' 127.0.0.1:3000/api/limited | head -1; done
import express from "express";
import { Client } from "@quotad/client";
import { rateLimit } from "@quotad/client/express";

/** The app: `/api/demo` unlimited, `/api/limited` under the `login` policy (5 a minute), keyed by `x-api-key`. */
export function createApp(client) {
  const app = express();
  app.get("/api/demo", (_req, res) => res.send("unlimited\n"));
  app.get(
    "/api/limited",
    rateLimit({ client, policy: "login", key: { header: "x-api-key" }, windowSecs: 60 }),
    (_req, res) => res.send("ok\n"),
  );
  return app;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [quotad = "http://127.0.0.1:50051", port = "3000"] = process.argv.slice(2);
  const client = new Client(quotad, { deadlineMs: 100, onUnavailable: "fail_open" });
  createApp(client).listen(Number(port), "127.0.0.1", () => {
    console.log(`listening on http://127.0.0.1:${port} (quotad at ${quotad})`);
  });
}
