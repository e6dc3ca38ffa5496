// The Node client's cost per check above a bare @grpc/grpc-js stub, against
// the same quotad: both send `Check` for an inline policy that always
// admits, one call at a time and then 32 at once, alternating in rounds so
// drift hits both alike. Reports wall time per check and the Node process's
// CPU time per check (user + system), which is where the client's own cost
// shows; the server's is the same for both. Rounds are short and paired
// (bare, then client) and the overhead is the median of the per-round
// differences, with the interquartile range: on a shared machine the
// spread between rounds is far larger than the difference within a pair.
//
//   cargo build --release --bin quotad
//   QUOTAD_BIN=target/release/quotad node clients/node/bench/overhead.mjs [checks-per-round] [rounds]
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { cpus } from "node:os";
import { Client, checkToWire, fromWire } from "../dist/client.js";
import { DenyCache } from "../dist/denyCache.js";
import { LOADER_OPTIONS } from "../dist/grpc.js";
import { quotadBinary, startQuotad } from "../test/support.mjs";

const perRound = Number(process.argv[2] ?? 1_000);
const rounds = Number(process.argv[3] ?? 21);
const CONCURRENCY = 32;
const policy = { algorithm: "fixed_window", limit: 1_000_000, windowMs: 3_600_000 };

const quotad = await startQuotad({ args: ["--worker-threads", "1"] });
const definition = protoLoader.loadSync(["quotad/v1/quota.proto"], LOADER_OPTIONS);
const { Quota } = grpc.loadPackageDefinition(definition).quotad.v1;
const stub = new Quota(quotad.addr, grpc.credentials.createInsecure());
const client = new Client(quotad.url, { deadlineMs: 1_000 });

let n = 0;
const bare = () =>
  new Promise((resolve, reject) =>
    stub.Check(
      {
        key: `b${n++ % 1000}`,
        cost: 1,
        inline_policy: { algorithm: "ALGORITHM_FIXED_WINDOW", limit: policy.limit, window_ms: policy.windowMs },
      },
      { deadline: Date.now() + 1_000 },
      (e, r) => (e ? reject(e) : resolve(r.decision)),
    ),
  );
const viaClient = () => client.check({ policy, key: `c${n++ % 1000}` });

async function measure(call, concurrency) {
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  let left = perRound;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (left-- > 0) {
        const d = await call();
        if (!d.allowed) throw new Error("denied: the bench's policy must always admit");
      }
    }),
  );
  const wallNs = Number(process.hrtime.bigint() - t0);
  const cpu = process.cpuUsage(cpu0);
  return { wallUs: wallNs / 1_000 / perRound, cpuUs: (cpu.user + cpu.system) / perRound };
}

// Warm both paths (connections, JIT).
for (const call of [bare, viaClient]) await measure(call, 8);

const quantile = (xs, q) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) * q)];
const median = (xs) => quantile(xs, 0.5);
console.log(`quotad: ${quotadBinary()} (--worker-threads 1); node ${process.version}; ${cpus().length} cpus; ${new Date().toISOString()}`);
console.log(`${rounds} paired rounds of ${perRound} checks each; medians across rounds, overhead = median of the paired differences [interquartile range]`);
console.log("| in flight | bare stub: wall us/check | client: wall us/check | bare stub: Node CPU us/check | client: Node CPU us/check | client overhead: Node CPU us/check | client overhead: wall us/check |");
console.log("|---|---|---|---|---|---|---|");
for (const concurrency of [1, CONCURRENCY]) {
  const results = { bare: [], client: [] };
  for (let r = 0; r < rounds; r++) {
    results.bare.push(await measure(bare, concurrency));
    results.client.push(await measure(viaClient, concurrency));
  }
  const m = (side, f) => median(results[side].map((x) => x[f]));
  const row = [m("bare", "wallUs"), m("client", "wallUs"), m("bare", "cpuUs"), m("client", "cpuUs")];
  const diff = (f) => {
    const d = results.client.map((c, i) => c[f] - results.bare[i][f]);
    return `${median(d).toFixed(1)} [${quantile(d, 0.25).toFixed(1)}, ${quantile(d, 0.75).toFixed(1)}]`;
  };
  console.log(`| ${concurrency} | ${row.map((x) => x.toFixed(1)).join(" | ")} | ${diff("cpuUs")} | ${diff("wallUs")} |`);
}
stub.close();
await client.close();
await quotad.stop();

// What the client does per check besides the call, without the network:
// the request's validation and wire form, the deny cache's lookup, send
// mark and record, the decision's conversion, and the call's own deadline
// timer and metadata.
{
  const cache = new DenyCache(10_000);
  const answer = { allowed: true, limit: 1_000_000, remaining: 5, retry_after_ms: 0, reset_after_ms: 100, reason: "REASON_WITHIN_LIMIT" };
  const N = 200_000;
  const samples = [];
  for (let r = 0; r < 5; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < N; i++) {
      const c = { policy, key: `c${i % 1000}` };
      checkToWire(c);
      cache.lookup(c, i);
      const sent = cache.sent(i);
      cache.record(c, fromWire(answer), sent, i);
      clearTimeout(setTimeout(() => {}, 1_000));
      new grpc.Metadata();
    }
    samples.push(Number(process.hrtime.bigint() - t0) / N / 1_000);
  }
  console.log(`the client's own work per check, without the network: ${median(samples).toFixed(2)} us (median of 5 x ${N})`);
}
