// TLS and mTLS against a real quotad, with certificates made here by the
// openssl command line for this run only.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Client, QuotadError } from "../dist/index.js";
import { startQuotad } from "./support.mjs";

const dir = mkdtempSync(join(tmpdir(), "quotad-node-tls-"));
const f = (name) => join(dir, name);
const openssl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });

/** A CA, and a certificate it signs for `cn` with these subjectAltNames. */
function issue(ca, name, cn, san) {
  openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f(`${name}.key`), "-out", f(`${name}.csr`), "-subj", `/CN=${cn}`);
  writeFileSync(f(`${name}.ext`), `subjectAltName=${san}\nbasicConstraints=CA:FALSE\n`);
  openssl("x509", "-req", "-in", f(`${name}.csr`), "-CA", f(`${ca}.pem`), "-CAkey", f(`${ca}.key`), "-CAcreateserial", "-days", "2", "-out", f(`${name}.pem`), "-extfile", f(`${name}.ext`));
}
function makeCa(name) {
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f(`${name}.key`), "-out", f(`${name}.pem`), "-days", "2", "-subj", `/CN=${name}`);
}

let tls;
let mtls;
const read = (name) => readFileSync(f(name));

before(async () => {
  makeCa("ca");
  makeCa("other-ca");
  makeCa("clients-ca");
  issue("ca", "server", "quotad.test", "DNS:quotad.test,IP:127.0.0.1");
  issue("clients-ca", "client", "app", "DNS:app");
  issue("other-ca", "stranger", "stranger", "DNS:stranger");
  const tlsArgs = ["--tls-cert", f("server.pem"), "--tls-key", f("server.key")];
  [tls, mtls] = await Promise.all([
    startQuotad({ args: tlsArgs }),
    startQuotad({ args: [...tlsArgs, "--tls-client-ca", f("clients-ca.pem")] }),
  ]);
});
after(async () => {
  await Promise.all([tls?.stop(), mtls?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

const inline = { algorithm: "fixed_window", limit: 5, windowMs: 3_600_000 };

test("TLS: a client trusting quotad's CA gets decisions", async () => {
  const client = new Client(`https://${tls.addr}`, { tls: { ca: read("ca.pem") } });
  const d = await client.check({ policy: inline, key: "tls-a" });
  assert.deepEqual([d.allowed, d.remaining], [true, 4]);
  client.close();
  const named = new Client(`https://${tls.addr}`, { tls: { ca: read("ca.pem").toString(), serverName: "quotad.test" } });
  assert.equal((await named.check({ policy: inline, key: "tls-a" })).remaining, 3, "serverName names the certificate's DNS name");
  named.close();
});

test("TLS: a CA that did not sign quotad's certificate, or plaintext to a TLS port, is an outage for the failure policy", async () => {
  const wrong = new Client(`https://${tls.addr}`, { tls: { ca: read("other-ca.pem") }, onUnavailable: "fail_open" });
  assert.equal((await wrong.check({ policy: inline, key: "tls-b" })).reason, "fail_open");
  wrong.close();
  const plain = new Client(`http://${tls.addr}`, { onUnavailable: "fail_closed" });
  assert.equal((await plain.check({ policy: inline, key: "tls-b" })).reason, "fail_closed");
  plain.close();
  const wrongName = new Client(`https://${tls.addr}`, { tls: { ca: read("ca.pem"), serverName: "elsewhere.test" } });
  const e = await wrongName.check({ policy: inline, key: "tls-b" }).catch((x) => x);
  assert.ok(e instanceof QuotadError && e.kind === "unavailable", String(e));
  wrongName.close();
});

test("mTLS: a client certificate from the trusted CA is admitted; none, or a stranger's, is not", async () => {
  const good = new Client(`https://${mtls.addr}`, { tls: { ca: read("ca.pem"), cert: read("client.pem"), key: read("client.key") } });
  assert.equal((await good.check({ policy: inline, key: "mtls" })).remaining, 4);
  good.close();
  for (const identity of [{}, { cert: read("stranger.pem"), key: read("stranger.key") }]) {
    const client = new Client(`https://${mtls.addr}`, { tls: { ca: read("ca.pem"), ...identity } });
    const e = await client.check({ policy: inline, key: "mtls" }).catch((x) => x);
    assert.ok(e instanceof QuotadError && e.kind === "unavailable", String(e));
    client.close();
  }
});
