//! Measures the memory a `MemoryStore` spends per live key.
//!
//! Inserts N distinct keys (default 1,000,000 keys of 16 bytes) under a
//! policy named `api`, then prints the growth of the heap (every byte the
//! allocator handed out and did not get back, counted by a wrapping global
//! allocator) and of resident memory (`VmRSS`), each divided by the live
//! keys, next to the bytes the store's byte budget counts for them.
//!
//! ```text
//! cargo run --release -p quotad-core --example bytes_per_key -- \
//!     [ALGORITHM] [KEYS] [--key-bytes N] [--entries N] [--max-bytes N]
//! ```
//!
//! - ALGORITHM is one of fixed_window (default), sliding_window,
//!   token_bucket, leaky_bucket, sliding_log.
//! - `--key-bytes N`: each key is N bytes long (at least 16; default 16).
//! - `--entries N`: for sliding_log, N admissions per key, each in its own
//!   millisecond, under a limit of N: a full log of N entries (default 1,
//!   under a limit of 1,000).
//! - `--max-bytes N`: give the store a byte budget of N bytes: a flood.
//!   Keys or admissions it has no room for are denied (reason capacity)
//!   and counted; the report shows the heap next to the budget.
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
    Algorithm, CheckItem, ENTRY_BYTES, FakeClock, MemoryStore, OnFull, Policy, Reason, State,
    StoreConfig,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const DEFAULT_KEYS: usize = 1_000_000;
/// Shards of the measured store, as in the benches.
const SHARDS: usize = 64;

#[derive(Debug)]
struct Args {
    algorithm: Algorithm,
    keys: usize,
    key_bytes: usize,
    entries: u64,
    max_bytes: Option<usize>,
}

fn args() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        algorithm: Algorithm::FixedWindow,
        keys: DEFAULT_KEYS,
        key_bytes: 16,
        entries: 1,
        max_bytes: None,
    };
    let mut positional = 0;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--key-bytes" => args.key_bytes = value()?.parse()?,
            "--entries" => args.entries = value()?.parse()?,
            "--max-bytes" => args.max_bytes = Some(value()?.parse()?),
            _ if positional == 0 => {
                args.algorithm = arg.parse()?;
                positional += 1;
            }
            _ if positional == 1 => {
                args.keys = arg.parse()?;
                positional += 1;
            }
            _ => return Err(format!("unexpected argument {arg}").into()),
        }
    }
    if args.key_bytes < 16 {
        return Err("--key-bytes must be at least 16".into());
    }
    if args.entries == 0 || (args.entries > 1 && args.algorithm != Algorithm::SlidingLog) {
        return Err("--entries must be 1, or more for sliding_log".into());
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn Error>> {
    let Args {
        algorithm,
        keys,
        key_bytes,
        entries,
        max_bytes,
    } = args()?;

    // Every key ends holding live state: 1 of 1,000 units spent in a
    // day-long window, or a full log of `entries` entries (limit `entries`).
    let limit = if entries > 1 { entries } else { 1_000 };
    let policy = Policy::try_new(algorithm, limit, Duration::from_secs(86_400), None)?;
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    // Room for every key, with headroom for uneven hashing across shards
    // (the bound is kept per shard): 10%, and 64 keys a shard for small runs.
    let max_keys = keys + keys / 10 + SHARDS * 64;
    let mut config = StoreConfig::try_new(max_keys, SHARDS, OnFull::Deny)?;
    if let Some(max_bytes) = max_bytes {
        config = config.with_max_bytes(max_bytes)?;
    }
    let mut key = String::with_capacity(key_bytes);

    let rss_before = rss_bytes()?;
    let region = Region::new(GLOBAL);
    let store = MemoryStore::new(config, clock.clone());
    let (mut admitted, mut capacity) = (0u64, 0u64);
    for _ in 0..entries {
        clock.advance(Duration::from_millis(1));
        for i in 0..keys as u64 {
            key.clear();
            write!(key, "{:016x}", mix(i))?;
            while key.len() < key_bytes {
                key.push('.');
            }
            let item = CheckItem::new("api", policy, &key, 1)?;
            let d = store.check_one(&item);
            match d.reason {
                Reason::WithinLimit => admitted += 1,
                Reason::Capacity if max_bytes.is_some() => capacity += 1,
                _ => return Err(format!("key {i} was denied: {d:?}").into()),
            }
        }
    }
    let heap = region.change();
    let rss_after = rss_bytes()?;

    let live = store.live_keys();
    if max_bytes.is_none() && live != keys {
        return Err(format!("{live} live keys, expected {keys}").into());
    }
    let heap_net = heap.bytes_allocated as f64 - heap.bytes_deallocated as f64;
    let rss_net = rss_after as f64 - rss_before as f64;
    let per_key = |bytes: f64| bytes / live as f64;
    let mib = |bytes: f64| bytes / 1_048_576.0;

    println!("algorithm        {algorithm}");
    println!("live keys        {live}");
    println!(
        "key              {key_bytes} bytes (+ \"api\\0\" prefix = {} bytes, {})",
        key_bytes + 4,
        if key_bytes + 4 > 24 {
            "on the heap"
        } else {
            "inline"
        }
    );
    if algorithm == Algorithm::SlidingLog {
        println!("log entries      {entries} per key");
    }
    println!("admitted         {admitted}, denied for capacity {capacity}");
    println!("heap bytes/key   {:.1}", per_key(heap_net));
    println!("rss bytes/key    {:.1}", per_key(rss_net));
    println!(
        "counted/key      {:.1} (the byte budget's count; ENTRY_BYTES = {ENTRY_BYTES})",
        per_key(store.used_bytes() as f64)
    );
    if let Some(max_bytes) = max_bytes {
        println!(
            "byte budget      {:.1} MiB; counted {:.1} MiB; heap {:.1} MiB; rss growth {:.1} MiB",
            mib(max_bytes as f64),
            mib(store.used_bytes() as f64),
            mib(heap_net),
            mib(rss_net)
        );
    }
    println!(
        "heap detail      {} allocations, {} reallocations, {} frees; {:.1} MiB live",
        heap.allocations,
        heap.reallocations,
        heap.deallocations,
        mib(heap_net)
    );
    println!(
        "rss              {:.1} MiB -> {:.1} MiB",
        mib(rss_before as f64),
        mib(rss_after as f64)
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
