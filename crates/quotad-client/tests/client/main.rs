//! quotad-client against a small in-process quotad ([`fake`]): TLS, mTLS
//! and unix sockets; coalescing; the deny cache; leases. And the shared
//! conformance cases (`tests/clients/`) against a real quotad binary.

mod coalescing;
mod conformance;
mod deny_cache;
mod fake;
mod keepalive;
mod leases;
#[cfg(feature = "tls")]
mod tls;
mod unix;
