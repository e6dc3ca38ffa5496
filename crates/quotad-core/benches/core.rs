//! Criterion benches for quotad-core: `decide()` per algorithm and
//! `MemoryStore::check_one` for one hot key, over 1M keys, and from 2 threads.
//!
//! Run with `cargo bench -p quotad-core --bench core`; BENCHMARKS.md at the
//! repository root records the figures and the machine. The whole run is
//! bounded to a couple of minutes by the group config below.
//!
//! Conventions shared by every bench:
//! - steady state: the key's state is in use and fed back each iteration,
//!   time advances by [`STEP_MS`] per request, cost is 1;
//! - "allowed" policies have limits far above what a run can spend, so every
//!   measured call takes the admit path; "denied" policies are exhausted
//!   before measuring and use a window longer than the run can cross, so
//!   every measured call is a denial;
//! - keys and check items are built before measuring, so key formatting is
//!   never timed.

use std::cell::OnceCell;
use std::hint::black_box;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use quotad_core::{
    Algorithm, BatchMode, CheckItem, Clock, MemoryStore, OnFull, Policy, State, StoreConfig,
    SystemClock, decide,
};

/// Time between two requests of one key: a hot key at 1,000 requests/s.
const STEP_MS: u64 = 1;
/// An instant in 2023; windows are epoch-aligned, so any large value will do.
const T0: u64 = 1_700_000_000_000;
/// "Large" limit for the allowed path: no run can spend it in one window.
const BIG_LIMIT: u64 = 1_000_000_000;
/// Limit for the denied path: spent before measuring.
const SMALL_LIMIT: u64 = 10;
/// The denied path's window: 365 days, so 1 ms steps cannot reach the next
/// window (or refill a token) within a run of a few billion calls.
const LONG_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);
/// Distinct keys of the many-keys benches: a table far larger than the
/// last-level cache.
const MANY_KEYS: usize = 1_000_000;
/// Distinct keys of a table that fits in the last-level cache, to show
/// where the cost of `MANY_KEYS` comes from.
const CACHED_KEYS: usize = 100_000;
/// Threads of the contended benches: one per core of the reference machine.
const THREADS: usize = 2;
/// Items of the batch benches: a `CheckBatch` of the size the gRPC bench sends.
const BATCH: usize = 100;
/// Items of the small all-or-nothing batch bench: an Envoy request's
/// descriptors.
const DESCRIPTORS: usize = 3;
/// Seed of the order the many-keys benches visit keys in.
const SEED: u64 = 0x5eed;
/// Shards of the benched store (a power of two, well above the core count).
const SHARDS: usize = 64;

fn policy(algorithm: Algorithm, limit: u64, window: Duration) -> Policy {
    Policy::try_new(algorithm, limit, window, None).expect("bench policies are valid")
}

/// The allowed-path policy of each algorithm. The sliding log's limit is
/// capped at 10,000; with a 1 s window and 1 ms steps it holds ~1,000
/// entries, far below the limit.
fn allowed_policy(algorithm: Algorithm) -> Policy {
    match algorithm {
        Algorithm::SlidingLog => policy(algorithm, 10_000, Duration::from_secs(1)),
        _ => policy(algorithm, BIG_LIMIT, Duration::from_secs(60)),
    }
}

/// Runs `policy` from fresh for `requests` requests, `STEP_MS` apart,
/// starting at the window boundary at or before [`T0`], returning the state
/// and the last instant.
fn warm_state(policy: &Policy, requests: u64) -> (Option<State>, u64) {
    let mut state = None;
    let mut now = T0 - T0 % policy.window_ms();
    for _ in 0..requests {
        now += STEP_MS;
        state = decide(policy, state, now, NonZeroU64::MIN).0;
    }
    (state, now)
}

fn bench_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for algorithm in Algorithm::RATES {
        for denied in [false, true] {
            let policy = if denied {
                policy(algorithm, SMALL_LIMIT, LONG_WINDOW)
            } else {
                allowed_policy(algorithm)
            };
            // Allowed: a state in use (the sliding log at its steady ~1,000
            // entries). Denied: the budget spent.
            let (mut state, mut now) =
                warm_state(&policy, if denied { SMALL_LIMIT } else { 2_000 });
            assert!(state.is_some(), "the benched state is in use");
            let probe = decide(&policy, state.clone(), now + STEP_MS, NonZeroU64::MIN).1;
            assert_eq!(
                probe.allowed, !denied,
                "{algorithm} takes the intended path"
            );

            let path = if denied { "denied" } else { "allowed" };
            group.bench_function(BenchmarkId::new(algorithm.as_str(), path), |b| {
                b.iter(|| {
                    now += STEP_MS;
                    let (next, decision) = decide(
                        black_box(&policy),
                        state.take(),
                        black_box(now),
                        NonZeroU64::MIN,
                    );
                    state = next;
                    black_box(decision)
                });
            });
            // The path must not have changed under the run.
            let last = decide(&policy, state, now + STEP_MS, NonZeroU64::MIN).1;
            assert_eq!(last.allowed, !denied, "{algorithm} stayed on its path");
        }
    }
    group.finish();
}

/// A sliding log at its cap: 10,000 entries of cost 1, one per millisecond.
/// `allowed`: a 10,000 ms window, so each check lets the oldest entry go and
/// adds one (the log stays full). `denied_cost_1` and `denied_cost_10000`:
/// a 365-day window, so nothing leaves and every check is denied; the exact
/// retry time needs the oldest entry to leave for a cost of 1, and the whole
/// log for a cost of 10,000 (the case a hostile caller would pick).
fn bench_full_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide_full_log");
    let cap = quotad_core::SLIDING_LOG_MAX_LIMIT;
    let cases = [
        ("allowed", Duration::from_millis(cap), 1),
        ("denied_cost_1", LONG_WINDOW, 1),
        ("denied_cost_10000", LONG_WINDOW, cap),
    ];
    for (path, window, cost) in cases {
        let denied = path != "allowed";
        let cost = NonZeroU64::new(cost).expect("costs are >= 1");
        let policy = policy(Algorithm::SlidingLog, cap, window);
        let (mut state, mut now) = warm_state(&policy, cap);
        let entries = |s: &Option<State>| match s {
            Some(State::SlidingLog { log, .. }) => log.len() as u64,
            _ => 0,
        };
        assert_eq!(entries(&state), cap, "the log is full");
        group.bench_function(BenchmarkId::new("sliding_log_10000", path), |b| {
            b.iter(|| {
                now += STEP_MS;
                let (next, decision) =
                    decide(black_box(&policy), state.take(), black_box(now), cost);
                state = next;
                black_box(decision)
            });
        });
        assert_eq!(entries(&state), cap, "the log stayed full");
        let last = decide(&policy, state, now + STEP_MS, cost).1;
        assert_eq!(last.allowed, !denied, "stayed on the {path} path");
    }
    group.finish();
}

/// A small deterministic generator (xorshift64*), so the benches need no
/// extra dependency and every run visits keys in the same order.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        // n < 2^26 here, so the modulo bias is negligible.
        (self.next() % n as u64) as usize
    }
}

/// Key `i`: 16 hex digits of a bijective mix of `i`, so keys are distinct
/// and unrelated to their index.
fn key_of(i: u64) -> String {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{:016x}", x ^ (x >> 31))
}

/// Keys `0..n` ([`key_of`]) laid out contiguously in a shuffled visiting
/// order: reading key `j` touches the arena sequentially, so the only random
/// memory traffic measured is the store's own.
#[derive(Debug)]
struct Keys {
    n: usize,
    arena: String,
}

impl Keys {
    const WIDTH: usize = 16;

    fn new(n: usize, seed: u64) -> Self {
        let mut order: Vec<u64> = (0..n as u64).collect();
        let mut rng = Rng(seed);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut arena = String::with_capacity(n * Self::WIDTH);
        for &i in &order {
            arena.push_str(&key_of(i));
        }
        Self { n, arena }
    }

    fn get(&self, j: usize) -> &str {
        &self.arena[j * Self::WIDTH..(j + 1) * Self::WIDTH]
    }

    fn items<'a>(&'a self, name: &'a str, policy: Policy) -> Vec<CheckItem<'a>> {
        (0..self.n)
            .map(|j| CheckItem::new(name, policy, self.get(j), 1).expect("valid item"))
            .collect()
    }
}

/// A store on the real clock, as the server runs it, with room for twice
/// `MANY_KEYS` so no bench meets the capacity path.
fn new_store() -> MemoryStore {
    let config = StoreConfig::try_new(2 * MANY_KEYS, SHARDS, OnFull::Deny).expect("valid config");
    MemoryStore::new(config, Arc::new(SystemClock))
}

/// A store holding every key of a [`Keys`], with the items that visit them.
#[derive(Debug)]
struct Populated<'k> {
    store: MemoryStore,
    items: Vec<CheckItem<'k>>,
}

impl<'k> Populated<'k> {
    /// Inserts keys `0..n` in that order (not the visiting order, so the
    /// table's entry order does not match the benches' order).
    fn new(keys: &'k Keys, policy: Policy) -> Self {
        let store = new_store();
        for i in 0..keys.n as u64 {
            let key = key_of(i);
            let item = CheckItem::new("api", policy, &key, 1).expect("valid item");
            assert!(store.check_one(&item).allowed, "populating admits");
        }
        assert_eq!(store.live_keys(), keys.n);
        Self {
            store,
            items: keys.items("api", policy),
        }
    }
}

/// Fixtures are built on a bench's first run, so that benches a filter
/// skips cost nothing (`cargo bench -p quotad-core --bench core -- decide`).
fn bench_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("store");

    // What reading the clock costs, since every check_one reads it once.
    group.bench_function("system_clock_now_ms", |b| {
        b.iter(|| black_box(SystemClock.now_ms()));
    });

    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let store = new_store();
        let policy = allowed_policy(algorithm);
        let item = CheckItem::new("api", policy, "user-00000000042", 1).expect("valid item");
        group.bench_function(BenchmarkId::new("hot_key", algorithm.as_str()), |b| {
            b.iter(|| black_box(store.check_one(black_box(&item))));
        });
    }

    let keys = OnceCell::new();
    let cached = OnceCell::new();
    let many_keys = [
        ("100k_keys", &cached, CACHED_KEYS, Algorithm::FixedWindow),
        ("1m_keys", &keys, MANY_KEYS, Algorithm::FixedWindow),
        ("1m_keys", &keys, MANY_KEYS, Algorithm::SlidingWindow),
    ];
    for (name, keys, n, algorithm) in many_keys {
        let mut fixture = None;
        let mut j = 0;
        group.bench_function(BenchmarkId::new(name, algorithm.as_str()), |b| {
            let Populated { store, items } = fixture.get_or_insert_with(|| {
                Populated::new(
                    keys.get_or_init(|| Keys::new(n, SEED)),
                    allowed_policy(algorithm),
                )
            });
            b.iter(|| {
                j = if j + 1 == items.len() { 0 } else { j + 1 };
                black_box(store.check_one(black_box(&items[j])))
            });
        });
        if let Some(Populated { store, .. }) = fixture {
            assert_eq!(store.live_keys(), n, "no key was added or lost");
        }
    }

    // [`BATCH`] items in visiting order, decided as one independent batch
    // (which looks 8 keys up together before deciding them) and one by one
    // (each lookup after the last): the time is per batch of 100.
    let mut fixture = None;
    let mut j = 0;
    for batched in [true, false] {
        group.bench_function(BenchmarkId::new("1m_keys_100_items", mode(batched)), |b| {
            let Populated { store, items } = fixture.get_or_insert_with(|| {
                let keys = keys.get_or_init(|| Keys::new(MANY_KEYS, SEED));
                Populated::new(keys, allowed_policy(Algorithm::FixedWindow))
            });
            b.iter(|| {
                j = next_window(j, BATCH, items.len());
                check_items(store, &items[j..j + BATCH], batched);
            });
        });
    }
    drop(fixture);

    // [`DESCRIPTORS`] keys as one all-or-nothing batch, the shape of an
    // Envoy ShouldRateLimit with that many descriptors: over keys that stay
    // in the CPU cache and over 1M keys.
    for (name, keys, n) in [
        ("100k_keys", &cached, CACHED_KEYS),
        ("1m_keys", &keys, MANY_KEYS),
    ] {
        let mut fixture = None;
        let mut j = 0;
        let id = BenchmarkId::new(format!("{name}_{DESCRIPTORS}_items"), "all_or_nothing");
        group.bench_function(id, |b| {
            let Populated { store, items } = fixture.get_or_insert_with(|| {
                let keys = keys.get_or_init(|| Keys::new(n, SEED));
                Populated::new(keys, allowed_policy(Algorithm::FixedWindow))
            });
            b.iter(|| {
                j = next_window(j, DESCRIPTORS, items.len());
                let batch = &items[j..j + DESCRIPTORS];
                black_box(store.check(black_box(batch), BatchMode::AllOrNothing))
            });
        });
    }
    group.finish();

    bench_two_threads(c, &keys);
}

/// Where the window of `size` items after the one at `j` starts, among
/// `len`: the next one, or the first once the next would not fit.
fn next_window(j: usize, size: usize, len: usize) -> usize {
    if j + 2 * size > len { 0 } else { j + size }
}

fn mode(batched: bool) -> &'static str {
    if batched {
        "independent_batch"
    } else {
        "one_by_one"
    }
}

/// Decides `items` as one independent batch, or each with `check_one`.
fn check_items(store: &MemoryStore, items: &[CheckItem<'_>], batched: bool) {
    if batched {
        black_box(store.check(black_box(items), BatchMode::Independent));
    } else {
        for item in items {
            black_box(store.check_one(black_box(item)));
        }
    }
}

/// [`THREADS`] threads calling `check_one` at once. Each thread runs `iters`
/// checks; the time reported is wall time / (`THREADS` x iters): the inverse
/// of the combined throughput. One thread's own time per check is
/// `THREADS` times that.
fn bench_two_threads(c: &mut Criterion, keys: &OnceCell<Keys>) {
    let mut group = c.benchmark_group("store_2_threads");
    let policy = allowed_policy(Algorithm::FixedWindow);

    // Uniform over the 1M keys: each thread walks its own part of the
    // shuffled order, so the two meet on a shard only by chance.
    let mut fixture = None;
    // Each thread resumes where its last sample stopped, so no sample
    // starts on keys the previous one left in cache.
    let cursors: [AtomicUsize; THREADS] = Default::default();
    group.bench_function("1m_keys_uniform/fixed_window", |b| {
        let Populated { store, items } = fixture.get_or_insert_with(|| {
            Populated::new(keys.get_or_init(|| Keys::new(MANY_KEYS, SEED)), policy)
        });
        b.iter_custom(|iters| {
            walk_parts(iters, items, &cursors, 1, |item| {
                black_box(store.check_one(black_box(&item[0])));
            })
        });
    });

    // Both threads deciding batches of [`BATCH`] items over the 1M keys: an
    // independent batch holds up to 8 shards at once, where checking one by
    // one holds one; the time is per batch.
    for batched in [true, false] {
        let id = BenchmarkId::new("1m_keys_uniform_100_items", mode(batched));
        group.bench_function(id, |b| {
            let Populated { store, items } = fixture.get_or_insert_with(|| {
                Populated::new(keys.get_or_init(|| Keys::new(MANY_KEYS, SEED)), policy)
            });
            b.iter_custom(|iters| {
                walk_parts(iters, items, &cursors, BATCH, |batch| {
                    check_items(store, batch, batched);
                })
            });
        });
    }
    drop(fixture);

    // Both threads on one key: every check contends for the same shard lock.
    let store = new_store();
    let item = CheckItem::new("api", policy, "user-00000000042", 1).expect("valid item");
    group.bench_function("same_hot_key/fixed_window", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, |_, iters| {
                for _ in 0..iters {
                    black_box(store.check_one(black_box(&item)));
                }
            })
        });
    });
    group.finish();
}

/// The physical floor of a lookup in a table larger than the cache: one
/// dependent load from a random place in 128 MiB (a single-cycle random
/// permutation followed link by link, so no load can start before the
/// previous one ends).
fn bench_floor(c: &mut Criterion) {
    const LINKS: usize = 128 * 1024 * 1024 / size_of::<u32>();
    let mut group = c.benchmark_group("floor");
    let mut next: Option<Vec<u32>> = None;
    let mut at = 0u32;
    group.bench_function("dram_random_load_128mib", |b| {
        let next = next.get_or_insert_with(|| {
            // Sattolo's shuffle: the result is one cycle through every slot.
            let mut next: Vec<u32> = (0..LINKS as u32).collect();
            let mut rng = Rng(SEED);
            for i in (1..LINKS).rev() {
                next.swap(i, rng.below(i));
            }
            next
        });
        b.iter(|| {
            at = next[at as usize];
            at
        });
    });
    group.finish();
}

/// [`THREADS`] threads, each walking its own part of `items` in the
/// shuffled order, `step` items a call to `decide`, from where its last
/// sample stopped (so no sample starts on keys the previous one left in
/// cache); the wall time divided by the thread count.
fn walk_parts(
    iters: u64,
    items: &[CheckItem<'_>],
    cursors: &[AtomicUsize; THREADS],
    step: usize,
    decide: impl Fn(&[CheckItem<'_>]) + Sync,
) -> Duration {
    let part = items.len() / THREADS;
    run_threads(iters, |t, iters| {
        let mine = &items[t * part..(t + 1) * part];
        let mut j = cursors[t].load(Ordering::Relaxed);
        for _ in 0..iters {
            j = next_window(j, step, part);
            decide(&mine[j..j + step]);
        }
        cursors[t].store(j, Ordering::Relaxed);
    })
}

/// Starts [`THREADS`] threads together on `work(thread, iters)` and returns
/// the wall time divided by the thread count.
fn run_threads(iters: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (start, work) = (&start, &work);
                s.spawn(move || {
                    start.wait();
                    work(t, iters);
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for h in handles {
            h.join().expect("bench thread does not panic");
        }
        began.elapsed() / THREADS as u32
    })
}

fn config() -> Criterion {
    // Bounded: 27 benches x (1 s warm-up + 3 s measuring + analysis) plus
    // building the populated stores keeps the run near two minutes.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        .nresamples(20_000)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_decide, bench_full_log, bench_store, bench_floor
}
criterion_main!(benches);
