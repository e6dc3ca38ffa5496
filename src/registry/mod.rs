//! What is in force at run time: the named policies and the RLS rules the
//! hot path reads (each an atomically swapped, immutable set), and the
//! reloads that swap them when their files change. Built from the
//! configuration (`crate::config`) over the models of `crate::policy`.
//!
//! # What a reload does to existing state
//!
//! State is kept per (policy name, key) and survives a reload. One rule,
//! kept alike by the memory store and by Redis, reconciles it with the new
//! parameters on the key's next request: **state is read only under the
//! algorithm and the window that wrote it.**
//!
//! - a changed **algorithm** or **window** starts every key fresh (Redis
//!   names its keys by both; quotad-core keeps the window in each state and
//!   reads a state of another algorithm or window as fresh);
//! - a changed **limit** or **burst** keeps the counts, and the new limit
//!   applies immediately: a key that spent 8 of 10 in a window has 2 left,
//!   12 if the limit becomes 20, or none if it becomes 5; a token bucket
//!   keeps its tokens capped at the new burst, a leaky bucket its level;
//! - a policy **changed back** finds what each store kept: the memory
//!   store holds one state per key (the old one was replaced), Redis the
//!   old key until its TTL;
//! - a **removed** policy's state stays until it is fresh and swept; if
//!   the name comes back before that, the keys carry on from it.
//!
//! Inline policies are not affected: their state is namespaced by all of
//! their parameters, so a changed inline policy is a different state.

pub(crate) mod overrides;
mod policies;
mod reload;
mod rlqs_reload;
mod rls;
mod rls_reload;

pub(crate) use policies::{PolicyRegistry, PolicySet, PutError};
pub(crate) use reload::Reloader;
pub(crate) use rlqs_reload::start as start_rlqs;
pub(crate) use rls::{RlsRegistry, RlsSet};
pub(crate) use rls_reload::start as start_rls;
