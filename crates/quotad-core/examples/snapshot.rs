//! Measures a memory-store snapshot: bytes per key on disk, and the time to
//! write it to a file and to load it back into a new store.
//!
//! ```text
//! cargo run --release -p quotad-core --example snapshot -- [ALGORITHM] [KEYS] [RUNS]
//! ```
//!
//! Fills a store of 64 shards with KEYS (default 1,000,000) distinct 16-byte
//! keys under the policy `api`, one request each (a log of one entry for
//! sliding_log), then RUNS times (default 3) writes the snapshot through a
//! `BufWriter` to a file in the temporary directory (synced to disk) and
//! loads it through a `BufReader`. The file is removed at the end.
#![allow(
    clippy::print_stdout,
    reason = "a measuring binary: its output is the report"
)]

use std::error::Error;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotad_core::{
    Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, SnapshotReader, StoreConfig,
};

const SHARDS: usize = 64;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let algorithm: Algorithm = args.next().as_deref().unwrap_or("fixed_window").parse()?;
    let keys: usize = args.next().map_or(Ok(1_000_000), |n| n.parse())?;
    let runs: usize = args.next().map_or(Ok(3), |n| n.parse())?;

    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let config = StoreConfig::try_new(keys + keys / 10 + SHARDS * 64, SHARDS, OnFull::Deny)?;
    let store = MemoryStore::new(config, clock.clone());
    let policy = Policy::try_new(algorithm, 1_000, Duration::from_secs(3_600), None)?;
    let mut key = String::with_capacity(16);
    for i in 0..keys as u64 {
        key.clear();
        write!(key, "{:016x}", mix(i))?;
        if !store
            .check_one(&CheckItem::new("api", policy, &key, 1)?)
            .allowed
        {
            return Err(format!("key {i} was denied").into());
        }
    }

    let path = std::env::temp_dir().join(format!("quotad-snapshot-{}.bin", std::process::id()));
    println!("algorithm        {algorithm}");
    println!("keys             {keys} (16 bytes, policy \"api\")");
    let mut writes = Vec::new();
    let mut loads = Vec::new();
    let mut size = 0;
    for _ in 0..runs {
        let began = Instant::now();
        let file = File::create(&path)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let written = store.export(&mut out, b"")?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        writes.push(began.elapsed());
        size = written.bytes;

        let began = Instant::now();
        let input = BufReader::with_capacity(1 << 20, File::open(&path)?);
        let (loaded, report) =
            SnapshotReader::open(input)?.load(config, clock.clone(), |_| true)?;
        loads.push(began.elapsed());
        if report.total().loaded != keys as u64 || loaded.live_keys() != keys {
            return Err(format!("loaded {:?}", report.total()).into());
        }
    }
    std::fs::remove_file(&path)?;

    println!(
        "file             {size} bytes, {:.1} bytes per key",
        size as f64 / keys as f64
    );
    println!("write (s)        {}", seconds(&writes));
    println!("load (s)         {}", seconds(&loads));
    Ok(())
}

fn seconds(runs: &[Duration]) -> String {
    runs.iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A bijective mix of `i` (splitmix64's finalizer), as in `bytes_per_key`.
fn mix(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
