// Which key a request counts under: its peer's network, a trusted proxy's
// `X-Forwarded-For`, a header, or a function. The same rules as the Rust
// layer's (crates/quotad-client/src/layer/key.rs).
import { isIPv4, isIPv6 } from "node:net";

/** An IP address as a family and a number. */
interface Ip {
  v6: boolean;
  n: bigint;
}

function parseV4(text: string): bigint {
  return text.split(".").reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
}

/** Parses an IPv4 or IPv6 address (no zone, no brackets); undefined for anything else. */
function parseIp(text: string): Ip | undefined {
  if (isIPv4(text)) return { v6: false, n: parseV4(text) };
  if (!isIPv6(text) || text.includes("%")) return undefined;
  let t = text;
  const lastColon = t.lastIndexOf(":");
  const last = t.slice(lastColon + 1);
  if (last.includes(".")) {
    // A dotted quad stands for the last two groups.
    const v4 = parseV4(last);
    t = `${t.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  let groups: string[];
  const gap = t.indexOf("::");
  if (gap < 0) {
    groups = t.split(":");
  } else {
    const l = t.slice(0, gap) === "" ? [] : t.slice(0, gap).split(":");
    const r = t.slice(gap + 2) === "" ? [] : t.slice(gap + 2).split(":");
    groups = [...l, ...Array<string>(8 - l.length - r.length).fill("0"), ...r];
  }
  let n = 0n;
  for (const g of groups) n = (n << 16n) | BigInt(parseInt(g, 16));
  return { v6: true, n };
}

/** IPv4-mapped IPv6 (`::ffff:a.b.c.d`) counts as IPv4. */
function canonical(ip: Ip): Ip {
  if (ip.v6 && ip.n >> 32n === 0xffffn) return { v6: false, n: ip.n & 0xffffffffn };
  return ip;
}

function formatIp(ip: Ip): string {
  if (!ip.v6) {
    return [24n, 16n, 8n, 0n].map((s) => String((ip.n >> s) & 0xffn)).join(".");
  }
  const groups: number[] = [];
  for (let i = 7n; i >= 0n; i--) groups.push(Number((ip.n >> (i * 16n)) & 0xffffn));
  if (groups.slice(0, 6).join(",") === "0,0,0,0,0,65535") {
    return `::ffff:${formatIp({ v6: false, n: ip.n & 0xffffffffn })}`;
  }
  // RFC 5952: the longest run of two or more zero groups (the first of equals) becomes `::`.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestStart < 0) return hex.join(":");
  return `${hex.slice(0, bestStart).join(":")}::${hex.slice(bestStart + bestLen).join(":")}`;
}

function truncate(ip: Ip, prefix: number): Ip {
  const bits = ip.v6 ? 128n : 32n;
  const host = bits - BigInt(prefix);
  return { v6: ip.v6, n: (ip.n >> host) << host };
}

/** A network, `10.0.0.0/8` or a single address. */
interface Net {
  ip: Ip;
  prefix: number;
}

function parseNet(text: string): Net {
  const [addr, len] = text.split("/", 2);
  const ip = parseIp((addr ?? "").trim());
  if (ip === undefined) throw new TypeError(`trusted proxy ${JSON.stringify(text)}: not an IP address or network`);
  const full = ip.v6 ? 128 : 32;
  const prefix = len === undefined ? full : Number(len);
  if (!/^\d+$/.test(len ?? String(full)) || prefix > full) {
    throw new TypeError(`trusted proxy ${JSON.stringify(text)}: prefix must be 0 to ${full}`);
  }
  return { ip, prefix };
}

function contains(net: Net, ip: Ip): boolean {
  if (net.ip.v6 !== ip.v6) return false;
  return truncate(net.ip, net.prefix).n === truncate(ip, net.prefix).n;
}

/**
 * How much of an IP address makes its key: IPv4 by address (/32) and IPv6
 * by /64 by default, since one IPv6 host usually holds a whole /64. A key
 * shorter than the full length is written in CIDR form (`2001:db8:1:2::/64`).
 */
export class IpPrefixes {
  /** @throws {RangeError} when `v4 > 32` or `v6 > 128`. */
  constructor(
    readonly v4: number = 32,
    readonly v6: number = 64,
  ) {
    if (!Number.isInteger(v4) || v4 < 0 || v4 > 32) throw new RangeError(`ipv4 prefix: must be at most 32 (got ${v4})`);
    if (!Number.isInteger(v6) || v6 < 0 || v6 > 128) throw new RangeError(`ipv6 prefix: must be at most 128 (got ${v6})`);
  }

  /** The key of an address as text (`203.0.113.9`, `::ffff:10.0.0.1`, `2001:db8::1`); undefined when it is none. */
  key(address: string): string | undefined {
    const ip = parseIp(address);
    return ip === undefined ? undefined : this.keyOf(canonical(ip));
  }

  /** @internal */
  keyOf(ip: Ip): string {
    const prefix = ip.v6 ? this.v6 : this.v4;
    if (prefix === (ip.v6 ? 128 : 32)) return formatIp(ip);
    return `${formatIp(truncate(ip, prefix))}/${prefix}`;
  }
}

/** What key extraction reads of a request: the peer's address and the raw header lines. */
export interface RequestHead {
  /** The TCP peer's address (`socket.remoteAddress`), if known. */
  peer: string | undefined;
  /** Node's `rawHeaders`: names and values alternating, in the order received. */
  rawHeaders: string[];
}

/** Where the key of a request comes from, for middleware options. */
export type KeySource<R> =
  | KeyExtractor<R>
  | "peer_ip"
  | { header: string }
  | { forwardedFor: { trusted: string[] } }
  | ((request: R) => string | undefined | null);

/** Visible ASCII and tab, as an HTTP header value must be to read as text. */
function isText(value: string): boolean {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c !== 9 && (c < 0x20 || c > 0x7e)) return false;
  }
  return true;
}

function headerValues(head: RequestHead, name: string): string[] {
  const values: string[] = [];
  const raw = head.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() === name) values.push(raw[i + 1]!);
  }
  return values;
}

/** The address of one `X-Forwarded-For` hop, with or without a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`). */
function hopAddress(hop: string): Ip | undefined {
  const text = hop.trim();
  const direct = parseIp(text);
  if (direct !== undefined) return direct;
  const bracketed = /^\[([^\]]+)\]:(\d{1,5})$/.exec(text);
  if (bracketed !== null && Number(bracketed[2]) <= 65535) {
    const ip = parseIp(bracketed[1]!);
    return ip?.v6 ? ip : undefined;
  }
  const v4 = /^([0-9.]+):(\d{1,5})$/.exec(text);
  if (v4 !== null && Number(v4[2]) <= 65535 && isIPv4(v4[1]!)) return parseIp(v4[1]!);
  return undefined;
}

/**
 * The right-most `X-Forwarded-For` hop that is not a trusted proxy; the
 * peer itself when the peer is not trusted or the header says nothing
 * usable. Hops are read from the right, the end the trusted proxies wrote,
 * and reading stops at the first that is not an address: everything left
 * of it came from the client and is never believed over a trusted hop.
 */
function clientIp(peer: Ip, head: RequestHead, trusted: Net[]): Ip {
  const isTrusted = (ip: Ip): boolean => trusted.some((net) => contains(net, ip));
  if (!isTrusted(peer)) return peer;
  const hops = headerValues(head, "x-forwarded-for").flatMap((v) => v.split(","));
  let client = peer;
  for (let i = hops.length - 1; i >= 0; i--) {
    const ip = hopAddress(hops[i]!);
    if (ip === undefined) break;
    client = canonical(ip);
    if (!isTrusted(client)) break;
  }
  return client;
}

/** Where the rate-limit key of a request comes from. */
export class KeyExtractor<R = unknown> {
  private constructor(
    private readonly kind: "peer_ip" | "forwarded_for" | "header" | "custom",
    private readonly trusted: Net[],
    private readonly name: string,
    private readonly fn: ((request: R) => string | undefined | null) | undefined,
  ) {}

  /** The peer's IP network, at the middleware's {@link IpPrefixes}. */
  static peerIp<R = unknown>(): KeyExtractor<R> {
    return new KeyExtractor<R>("peer_ip", [], "", undefined);
  }

  /**
   * The client address in `X-Forwarded-For`, believed only when the peer is
   * one of the `trusted` proxies (`"10.0.0.0/8"`, `"192.0.2.7"`): the
   * right-most address in it that is not a trusted proxy. From any other
   * peer, or when the header has nothing usable, the peer's own network.
   *
   * @throws {TypeError} for an entry that is not an address or network.
   */
  static forwardedFor<R = unknown>(options: { trusted: string[] }): KeyExtractor<R> {
    return new KeyExtractor<R>("forwarded_for", options.trusted.map(parseNet), "", undefined);
  }

  /** The value of a header (its first line), e.g. an API key; absent or empty means no key. */
  static header<R = unknown>(name: string): KeyExtractor<R> {
    return new KeyExtractor<R>("header", [], name.toLowerCase(), undefined);
  }

  /** Whatever `fn` returns for the request; `undefined`, `null` or `""` means no key. */
  static custom<R>(fn: (request: R) => string | undefined | null): KeyExtractor<R> {
    return new KeyExtractor<R>("custom", [], "", fn);
  }

  /** The extractor a middleware option names. */
  static from<R>(source: KeySource<R>): KeyExtractor<R> {
    if (source instanceof KeyExtractor) return source;
    if (source === "peer_ip") return KeyExtractor.peerIp<R>();
    if (typeof source === "function") return KeyExtractor.custom<R>(source);
    if ("header" in source) return KeyExtractor.header<R>(source.header);
    if ("forwardedFor" in source) return KeyExtractor.forwardedFor<R>(source.forwardedFor);
    throw new TypeError("key: expected peer_ip, { header }, { forwardedFor } or a function");
  }

  /** Whether the key comes from the peer's address: a request without one is the app's misconfiguration. */
  get needsPeer(): boolean {
    return this.kind === "peer_ip" || this.kind === "forwarded_for";
  }

  /** The key of a request, if it has one. */
  extract(head: RequestHead, request: R, prefixes: IpPrefixes = new IpPrefixes()): string | undefined {
    switch (this.kind) {
      case "peer_ip":
      case "forwarded_for": {
        const parsed = head.peer === undefined ? undefined : parseIp(head.peer);
        if (parsed === undefined) return undefined;
        const peer = canonical(parsed);
        return prefixes.keyOf(this.kind === "peer_ip" ? peer : clientIp(peer, head, this.trusted));
      }
      case "header": {
        const value = headerValues(head, this.name)[0];
        return value !== undefined && value !== "" && isText(value) ? value : undefined;
      }
      case "custom": {
        const key = this.fn!(request);
        return key === undefined || key === null || key === "" ? undefined : key;
      }
    }
  }
}
