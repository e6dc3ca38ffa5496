// Key extraction on synthetic request heads: the same rules as the Rust
// layer's key.rs (peer network, trusted X-Forwarded-For, header).
import assert from "node:assert/strict";
import { test } from "node:test";
import { IpPrefixes, KeyExtractor } from "../dist/index.js";

const head = (peer, xff) => ({ peer, rawHeaders: xff === undefined ? [] : ["X-Forwarded-For", xff] });
const ff = (trusted) => KeyExtractor.forwardedFor({ trusted });
const key = (extractor, h, prefixes) => extractor.extract(h, undefined, prefixes);

test("the peer ip is the key by default", () => {
  assert.equal(key(KeyExtractor.peerIp(), head("203.0.113.9", "198.51.100.1")), "203.0.113.9");
});

test("forwarded-for is ignored from an untrusted peer", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("203.0.113.9", "198.51.100.1")), "203.0.113.9");
});

test("forwarded-for from a trusted proxy gives the right-most untrusted hop", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "1.2.3.4, 198.51.100.7, 10.0.0.1")), "198.51.100.7");
});

test("a forged left-most entry cannot hide the hops the proxies wrote", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "garbage, 198.51.100.7")), "198.51.100.7");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "unknown, 10.0.0.9")), "10.0.0.9", "the last trusted hop, not the proxy");
});

test("a byte that is not text on the client's line does not drop the proxy's hop", () => {
  // Node reads header bytes as latin1: 0xff is one character, not a split.
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "\u00ff, 198.51.100.7")), "198.51.100.7");
});

test("several X-Forwarded-For lines are read in order, the last line last", () => {
  const h = { peer: "10.0.0.2", rawHeaders: ["x-forwarded-for", "198.51.100.7", "X-Forwarded-For", "10.0.0.1"] };
  assert.equal(key(ff(["10.0.0.0/8"]), h), "198.51.100.7");
});

test("hops written with a port count by their address", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "198.51.100.7:4711")), "198.51.100.7");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "[2001:db8:1:2::7]:4711")), "2001:db8:1:2::/64");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "198.51.100.7:99999")), "10.0.0.2", "not a port");
});

test("mapped ipv6 hops and peers are matched against ipv4 proxies", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "198.51.100.7, ::ffff:10.0.0.1")), "198.51.100.7");
  assert.equal(key(ff(["10.0.0.0/8"]), head("::ffff:10.0.0.2", "198.51.100.7")), "198.51.100.7");
});

test("forwarded-for with nothing usable falls back to the peer", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "garbage")), "10.0.0.2");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2")), "10.0.0.2");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "fe80::1%eth0")), "10.0.0.2", "a zone is not an address");
});

test("ipv6 peers are keyed by their /64 by default", () => {
  const a = key(KeyExtractor.peerIp(), head("2001:db8:1:2:aaaa::1"));
  assert.equal(a, "2001:db8:1:2::/64");
  assert.equal(key(KeyExtractor.peerIp(), head("2001:db8:1:2:bbbb::9")), a, "one /64, one budget");
  assert.notEqual(key(KeyExtractor.peerIp(), head("2001:db8:1:3::1")), a);
});

test("ipv4 peers are keyed by address by default and mapped ones count as ipv4", () => {
  assert.equal(key(KeyExtractor.peerIp(), head("203.0.113.9")), "203.0.113.9");
  assert.equal(key(KeyExtractor.peerIp(), head("::ffff:203.0.113.9")), "203.0.113.9");
});

test("prefix lengths are configurable for both families", () => {
  const p = new IpPrefixes(24, 48);
  assert.equal(key(KeyExtractor.peerIp(), head("203.0.113.9"), p), "203.0.113.0/24");
  assert.equal(key(KeyExtractor.peerIp(), head("2001:db8:1:2::1"), p), "2001:db8:1::/48");
  assert.equal(key(KeyExtractor.peerIp(), head("2001:db8:1:2::1"), new IpPrefixes(32, 128)), "2001:db8:1:2::1");
  assert.throws(() => new IpPrefixes(33, 64), /ipv4 prefix: must be at most 32 \(got 33\)/);
  assert.throws(() => new IpPrefixes(32, 129), /ipv6 prefix: must be at most 128 \(got 129\)/);
});

test("the trusted forwarded-for address is keyed by its prefix too", () => {
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "2001:db8:7:7:1:2:3:4, 10.0.0.1")), "2001:db8:7:7::/64");
  assert.equal(key(ff(["10.0.0.0/8"]), head("10.0.0.2", "198.51.100.7"), new IpPrefixes(16, 64)), "198.51.0.0/16");
});

test("ipv6 keys are written as RFC 5952 text", () => {
  const full = new IpPrefixes(32, 128);
  for (const [input, out] of [
    ["2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"],
    ["2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"],
    ["2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"],
    ["::", "::"],
    ["::1.2.3.4", "::102:304"],
  ]) {
    assert.equal(full.key(input), out, input);
  }
});

test("a header key must be present, non-empty and text", () => {
  const h = KeyExtractor.header("X-Api-Key");
  assert.equal(key(h, { peer: undefined, rawHeaders: ["x-api-key", "k-123"] }), "k-123");
  assert.equal(key(h, { peer: undefined, rawHeaders: ["x-api-key", ""] }), undefined);
  assert.equal(key(h, { peer: undefined, rawHeaders: [] }), undefined);
  assert.equal(key(h, { peer: undefined, rawHeaders: ["x-api-key", "caf\u00e9"] }), undefined);
  assert.equal(key(h, { peer: undefined, rawHeaders: ["X-API-KEY", "first", "x-api-key", "second"] }), "first");
});

test("peer keys need a peer, and a trusted proxy list must parse", () => {
  assert.equal(key(KeyExtractor.peerIp(), head(undefined)), undefined);
  assert.ok(KeyExtractor.peerIp().needsPeer);
  assert.ok(!KeyExtractor.header("x").needsPeer);
  assert.throws(() => ff(["10.0.0.0/33"]), /prefix must be 0 to 32/);
  assert.throws(() => ff(["proxy.internal"]), /not an IP address/);
  assert.equal(key(ff(["10.0.0.2"]), head("10.0.0.2", "198.51.100.7")), "198.51.100.7", "a bare address is one host");
});
