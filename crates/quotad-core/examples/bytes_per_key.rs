//! Measures the memory a `MemoryStore` spends per live key.
//!
//! Inserts N distinct 16-byte keys (default 1,000,000) under a policy named
//! `api`, then prints the growth of the heap (every byte the allocator
//! handed out and did not get back, counted by a wrapping global allocator)
//! and of resident memory (`VmRSS`), each divided by the live keys.
//!
//! ```text
//! cargo run --release -p quotad-core --example bytes_per_key -- [ALGORITHM] [KEYS]
//! ```
//!
//! ALGORITHM is one of fixed_window (default), sliding_window, token_bucket,
//! leaky_bucket, sliding_log.
#![allow(
    clippy::print_stdout,
    reason = "a measuring binary: its output is the report"
)]

use std::alloc::System;
use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use compact_str::CompactString;
use quotad_core::{
    Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, State, StoreConfig,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const DEFAULT_KEYS: usize = 1_000_000;
/// Shards of the measured store, as in the benches.
const SHARDS: usize = 64;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let algorithm: Algorithm = args.next().as_deref().unwrap_or("fixed_window").parse()?;
    let keys: usize = match args.next() {
        Some(n) => n.parse()?,
        None => DEFAULT_KEYS,
    };

    // One request per key leaves every key holding live state: 1 of 1,000
    // units spent in a minute-long window (or a 1 s log of one entry).
    let window = match algorithm {
        Algorithm::SlidingLog => Duration::from_secs(1),
        _ => Duration::from_secs(60),
    };
    let policy = Policy::try_new(algorithm, 1_000, window, None)?;
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    // Room for every key, with 5% headroom for uneven hashing across shards
    // (the bound is kept per shard). Shards allocate their whole share up
    // front, so the measurement starts before the store exists.
    let config = StoreConfig::try_new(keys + keys / 20, SHARDS, OnFull::Deny)?;
    let mut key = String::with_capacity(16);

    let rss_before = rss_bytes()?;
    let region = Region::new(GLOBAL);
    let store = MemoryStore::new(config, clock);
    for i in 0..keys as u64 {
        key.clear();
        write!(key, "{:016x}", mix(i))?;
        let item = CheckItem::new("api", policy, &key, 1)?;
        if !store.check_one(&item).allowed {
            return Err(format!("key {i} was denied; the store must admit all").into());
        }
    }
    let heap = region.change();
    let rss_after = rss_bytes()?;

    let live = store.live_keys();
    if live != keys {
        return Err(format!("{live} live keys, expected {keys}").into());
    }
    let heap_net = heap.bytes_allocated as f64 - heap.bytes_deallocated as f64;
    let rss_net = rss_after as f64 - rss_before as f64;
    let per_key = |bytes: f64| bytes / live as f64;

    println!("algorithm        {algorithm}");
    println!("live keys        {live}");
    println!("key              16 bytes (+ \"api\\0\" prefix = 20 bytes, inline)");
    println!("heap bytes/key   {:.1}", per_key(heap_net));
    println!("rss bytes/key    {:.1}", per_key(rss_net));
    println!(
        "heap detail      {} allocations, {} reallocations, {} frees; {:.1} MiB live",
        heap.allocations,
        heap.reallocations,
        heap.deallocations,
        heap_net / 1_048_576.0
    );
    println!(
        "rss              {:.1} MiB -> {:.1} MiB",
        rss_before as f64 / 1_048_576.0,
        rss_after as f64 / 1_048_576.0
    );
    println!(
        "type sizes       CompactString {} B, Option<State> {} B",
        size_of::<CompactString>(),
        size_of::<Option<State>>()
    );
    Ok(())
}

/// A bijective mix of `i` (splitmix64's finalizer): distinct keys that do
/// not arrive in hash order.
fn mix(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Resident set size of this process, from `/proc/self/status`.
fn rss_bytes() -> Result<u64, Box<dyn Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .ok_or("no VmRSS line in /proc/self/status")?
        .trim()
        .parse::<u64>()?;
    Ok(kib * 1024)
}
