//! quotad-client against a small in-process quotad ([`fake`]): TLS, mTLS
//! and unix sockets; coalescing; the deny cache.

mod coalescing;
mod deny_cache;
mod fake;
mod keepalive;
#[cfg(feature = "tls")]
mod tls;
mod unix;
