//! The fault schedule: drawn from the seed before the run starts, printed
//! one line per fault (`t=12.3s SIGSTOP redis-primary for 1.8s`), then
//! played in order. The same seed, seconds and topology give the same
//! schedule, so a failure replays.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Which Redis deployment a phase runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// A primary, one replica and three sentinels; quotad finds the
    /// primary through the sentinels and reaches every node through a
    /// proxy the driver controls.
    Sentinel,
    /// Three masters, each with one replica.
    Cluster,
}

/// A Redis node named by its role when the fault is played (the roles
/// move with failovers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The node the sentinels name as master (Sentinel), or master `n` of
    /// the Cluster's three in slot order.
    Primary(usize),
    /// The replica of that primary.
    Replica(usize),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Primary(0) => f.write_str("redis-primary"),
            Role::Replica(0) => f.write_str("redis-replica"),
            Role::Primary(n) => write!(f, "redis-primary-{n}"),
            Role::Replica(n) => write!(f, "redis-replica-{n}"),
        }
    }
}

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "fault")]
pub enum Fault {
    /// SIGSTOP, then SIGCONT after `for_ms`.
    Stop { node: Role, for_ms: u64 },
    /// SIGSTOP long enough to matter, under the full load: quotad's
    /// resident memory is sampled throughout and must stay flat.
    Stall { node: Role, for_ms: u64 },
    /// SIGKILL, then a restart on the same port and append-only file
    /// after `down_ms`.
    Kill { node: Role, down_ms: u64 },
    /// SIGKILL of quotad replica `replica`, restarted after `down_ms`; then
    /// every quotad key in Redis has its TTL checked.
    KillQuotad { replica: usize, down_ms: u64 },
    /// SIGKILL of sentinel `sentinel`, restarted after `down_ms`.
    KillSentinel { sentinel: usize, down_ms: u64 },
    /// `SENTINEL FAILOVER` (Sentinel) or `CLUSTER FAILOVER` on the
    /// replica of master `n` (Cluster).
    Failover { primary: usize },
    /// The proxy in front of `node` stops forwarding on every connection,
    /// open or opened, for `for_ms`, closing none; connections made after
    /// that pass.
    Blackhole { node: Role, for_ms: u64 },
    /// Every quotad's config rewritten (a policy's limit changes) and
    /// SIGHUP sent.
    Reload,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |ms: &u64| *ms as f64 / 1_000.0;
        match self {
            Fault::Stop { node, for_ms } => write!(f, "SIGSTOP {node} for {:.1}s", s(for_ms)),
            Fault::Stall { node, for_ms } => {
                write!(
                    f,
                    "SIGSTOP {node} for {:.1}s (stall: RSS sampled)",
                    s(for_ms)
                )
            }
            Fault::Kill { node, down_ms } => {
                write!(f, "SIGKILL {node}, restart after {:.1}s", s(down_ms))
            }
            Fault::KillQuotad { replica, down_ms } => {
                write!(
                    f,
                    "SIGKILL quotad-{replica}, restart after {:.1}s",
                    s(down_ms)
                )
            }
            Fault::KillSentinel { sentinel, down_ms } => {
                write!(
                    f,
                    "SIGKILL sentinel-{sentinel}, restart after {:.1}s",
                    s(down_ms)
                )
            }
            Fault::Failover { primary: 0 } => f.write_str("failover redis-primary"),
            Fault::Failover { primary } => write!(f, "failover redis-primary-{primary}"),
            Fault::Blackhole { node, for_ms } => {
                write!(f, "blackhole {node} for {:.1}s", s(for_ms))
            }
            Fault::Reload => f.write_str("config reload"),
        }
    }
}

impl Fault {
    /// How long the fault lasts once started.
    pub fn lasts_ms(&self) -> u64 {
        match *self {
            Fault::Stop { for_ms, .. }
            | Fault::Stall { for_ms, .. }
            | Fault::Blackhole { for_ms, .. } => for_ms,
            Fault::Kill { down_ms, .. }
            | Fault::KillQuotad { down_ms, .. }
            | Fault::KillSentinel { down_ms, .. } => down_ms,
            Fault::Failover { .. } | Fault::Reload => 0,
        }
    }
}

/// A fault and when it starts, ms into the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Start, ms since the phase's load started.
    pub at_ms: u64,
    /// What happens.
    pub fault: Fault,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:.1}s {}", self.at_ms as f64 / 1_000.0, self.fault)
    }
}

/// Load before the first fault, so every window has a baseline.
pub const WARMUP_MS: u64 = 3_000;
/// Load after the last fault ends: failovers settle and the last windows
/// close under a healthy store.
pub const SETTLE_MS: u64 = 6_000;

/// The schedule of one phase: faults one after the other, each followed by
/// a pause of 1 to 4 s, from [`WARMUP_MS`] until [`SETTLE_MS`] before the
/// end. One stall (the memory check) comes first, when the phase is long
/// enough for it; then faults are drawn with the weights below.
pub fn schedule(seed: u64, phase: u64, topology: Topology, seconds: u64) -> Vec<Event> {
    // One stream per phase: the Cluster's schedule does not shift when the
    // Sentinel phase's length changes.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ phase.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let end = (seconds * 1_000).saturating_sub(SETTLE_MS);
    let masters = match topology {
        Topology::Sentinel => 1,
        Topology::Cluster => 3,
    };
    let mut events = Vec::new();
    let mut at = WARMUP_MS;
    let stall = Fault::Stall {
        node: Role::Primary(0),
        for_ms: 4_000,
    };
    if at + stall.lasts_ms() <= end {
        events.push(Event {
            at_ms: at,
            fault: stall,
        });
        at += stall.lasts_ms() + rng.random_range(1_000..4_000);
    }
    loop {
        let node = |rng: &mut ChaCha8Rng| {
            let n = rng.random_range(0..masters);
            if rng.random_bool(0.7) {
                Role::Primary(n)
            } else {
                Role::Replica(n)
            }
        };
        let fault = match (topology, rng.random_range(0..100u32)) {
            (_, 0..18) => Fault::Stop {
                node: node(&mut rng),
                for_ms: rng.random_range(200..2_500),
            },
            (_, 18..32) => Fault::Kill {
                node: node(&mut rng),
                down_ms: rng.random_range(200..3_000),
            },
            (_, 32..50) => Fault::KillQuotad {
                replica: rng.random_range(0..3),
                down_ms: rng.random_range(100..2_000),
            },
            (_, 50..62) => Fault::Failover {
                primary: rng.random_range(0..masters),
            },
            (_, 62..75) => Fault::Reload,
            (Topology::Sentinel, 75..88) => Fault::Blackhole {
                node: node(&mut rng),
                for_ms: rng.random_range(300..3_000),
            },
            (Topology::Sentinel, _) => Fault::KillSentinel {
                sentinel: rng.random_range(0..3),
                down_ms: rng.random_range(200..3_000),
            },
            // No proxy and no sentinels in the Cluster: more stops and kills.
            (Topology::Cluster, 75..88) => Fault::Stop {
                node: Role::Primary(rng.random_range(0..masters)),
                for_ms: rng.random_range(200..2_500),
            },
            (Topology::Cluster, _) => Fault::Kill {
                node: Role::Primary(rng.random_range(0..masters)),
                down_ms: rng.random_range(200..3_000),
            },
        };
        if at + fault.lasts_ms() > end {
            break;
        }
        events.push(Event { at_ms: at, fault });
        at += fault.lasts_ms() + rng.random_range(1_000..4_000);
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = schedule(7, 0, Topology::Sentinel, 120);
        assert_eq!(a, schedule(7, 0, Topology::Sentinel, 120));
        assert_ne!(a, schedule(8, 0, Topology::Sentinel, 120));
        assert_ne!(a, schedule(7, 1, Topology::Sentinel, 120));
    }

    #[test]
    fn faults_follow_one_another_inside_the_phase() {
        for seed in 0..50 {
            for topology in [Topology::Sentinel, Topology::Cluster] {
                let events = schedule(seed, 0, topology, 90);
                assert!(matches!(events[0].fault, Fault::Stall { .. }));
                assert!(events[0].at_ms >= WARMUP_MS);
                for pair in events.windows(2) {
                    assert!(pair[0].at_ms + pair[0].fault.lasts_ms() + 1_000 <= pair[1].at_ms);
                }
                let last = events.last().expect("a fault");
                assert!(last.at_ms + last.fault.lasts_ms() + SETTLE_MS <= 90_000);
            }
        }
    }

    #[test]
    fn a_long_run_draws_every_kind_of_fault() {
        let kinds = |topology| {
            let mut seen = std::collections::HashSet::new();
            for e in schedule(1, 0, topology, 600) {
                seen.insert(std::mem::discriminant(&e.fault));
            }
            seen.len()
        };
        assert_eq!(kinds(Topology::Sentinel), 8);
        // No blackhole and no sentinel in a Cluster.
        assert_eq!(kinds(Topology::Cluster), 6);
    }

    #[test]
    fn events_print_as_replayable_lines() {
        let e = Event {
            at_ms: 12_345,
            fault: Fault::Stop {
                node: Role::Primary(0),
                for_ms: 1_800,
            },
        };
        assert_eq!(e.to_string(), "t=12.3s SIGSTOP redis-primary for 1.8s");
        let k = Event {
            at_ms: 1_000,
            fault: Fault::Kill {
                node: Role::Replica(2),
                down_ms: 500,
            },
        };
        assert_eq!(
            k.to_string(),
            "t=1.0s SIGKILL redis-replica-2, restart after 0.5s"
        );
    }
}
