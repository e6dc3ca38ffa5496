//! The integration tests, as one binary: each module starts real servers
//! (quotad on `127.0.0.1:0`, Redis processes, the built `quotad` binary)
//! and talks to them as a client would. One binary links the server once.

mod common;

mod admin;
mod auth;
mod bad_bytes;
mod bad_input;
mod calendar;
mod cli;
mod cli_client;
mod client;
mod client_coalescing;
mod client_deny_cache;
mod client_slots;
mod client_tls;
mod concurrency;
mod decisions;
mod demo;
mod global_budget;
mod http_layer;
mod inline_limits;
mod lease_faults;
mod leases;
mod lifecycle;
mod overrides;
mod overrides_redis;
mod pki;
mod python_client;
mod redis;
mod reload;
mod rlqs;
mod rlqs_envoy;
mod rls;
mod rls_counting;
mod rls_redis;
mod rls_reload;
mod shed;
mod shutdown;
mod snapshot;
mod tls;
mod trace;
mod transport;
mod unix;
