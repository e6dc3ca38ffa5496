//! The prefix lookup of overrides: a key of length L against a policy with
//! a prefix override of every length 1..=L (the worst case for a lookup
//! per prefix length, which hashes L slices of up to L bytes, O(L²)),
//! through the table quotad uses (a trie walked once, O(L)), next to that
//! per-length lookup written out here as the baseline.
//!
//! Run with `cargo bench --bench overrides`; BENCHMARKS.md records figures.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use quotad::PrefixLookup;

/// The lookup quotad did before: one hash lookup per distinct prefix
/// length, longest first.
struct PerLength {
    prefixes: HashMap<String, u64>,
    lens: Vec<usize>,
}

impl PerLength {
    fn new(prefixes: &[String]) -> Self {
        let mut lens: Vec<usize> = prefixes.iter().map(String::len).collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        lens.dedup();
        PerLength {
            prefixes: prefixes.iter().map(|p| (p.clone(), 20)).collect(),
            lens,
        }
    }

    fn find(&self, key: &str) -> Option<u64> {
        self.lens
            .iter()
            .find_map(|&len| key.get(..len).and_then(|p| self.prefixes.get(p)).copied())
    }
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("override_prefix_lookup");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    for len in [16usize, 64, 256, 1024] {
        // Prefixes of every length but the full key, on a key that none
        // matches past its first byte: every length is tried.
        let key: String = "k".repeat(len);
        let prefixes: Vec<String> = (1..len)
            .map(|n| format!("{}x", "k".repeat(n - 1)))
            .collect();
        let trie = PrefixLookup::new(&prefixes);
        let per_length = PerLength::new(&prefixes);
        assert_eq!(trie.find(&key), per_length.find(&key));
        group.bench_with_input(BenchmarkId::new("trie", len), &key, |b, key| {
            b.iter(|| trie.find(black_box(key)));
        });
        group.bench_with_input(BenchmarkId::new("per_length", len), &key, |b, key| {
            b.iter(|| per_length.find(black_box(key)));
        });
    }
    group.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
