//! The checker: every answer to a tracked key is kept, and the rules are
//! pure functions of them. Each answer carries when its request was sent
//! and when the answer arrived (ms since the Unix epoch, the clock Redis's
//! `TIME` reads on this machine), so the store decided it in between; the
//! bounds below use that interval the way that can only make them looser,
//! never stricter, than the truth:
//!
//! | algorithm | rule (admissions counted: allowed, and not `FAIL_OPEN`) |
//! |---|---|
//! | fixed_window, sliding_window | at most `limit` in each epoch-aligned window; an admission is placed by its send and receive times when both fall in one window, else (fixed windows) by `reset_after_ms`, else left out and counted as unplaced |
//! | leases (on a fixed window) | units granted + admissions, per window, at most `limit`; grants are never settled, so no unit comes back |
//! | token_bucket, leaky_bucket | for each admission `i` and the admissions sent no earlier and received by `t`: their count <= `burst + limit x (t - sent_i) / window` |
//! | sliding_log | the admissions sent no earlier than `sent_i` and received before `sent_i + window`: at most `limit` (they lie in one window-long interval) |
//! | concurrency | at every instant, slots surely held (from the acquire's answer to the earlier of the release's send and the acquire's send + TTL) <= `limit` |
//!
//! An excess is a failure unless its interval overlaps a loss event (a
//! primary's SIGKILL, whose last second of unsynced append-only file is
//! lost, or a failover, whose unreplicated writes are lost): then it is
//! reported as the measured async-replication loss, never dropped.

use std::collections::BTreeMap;

use serde::Serialize;

/// The gRPC codes documented for faults (docs/chaos.md); any other fails
/// the run.
pub const FAULT_CODES: &[&str] = &["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"];

/// How a tracked policy counts, as the checker needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// At most `limit` per aligned window.
    Window,
    /// `burst + limit x t / window` in any interval `t`.
    Bucket,
    /// At most `limit` in any window-long interval.
    Log,
    /// At most `limit` slots held at once.
    Slots,
}

/// A tracked policy.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Tracked {
    pub name: &'static str,
    /// As the config writes it (`fixed_window`, ...).
    pub algorithm: &'static str,
    pub rule: Rule,
    pub limit: u64,
    pub window_ms: u64,
    pub burst: u64,
    /// The policy's `on_error`.
    pub on_error: &'static str,
}

/// What an answer said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Said {
    /// A decision (a Check, a batch item, an Acquire).
    Decision {
        allowed: bool,
        reason: String,
        reset_after_ms: u64,
        /// The slot's TTL (an allowed Acquire), else 0.
        slot_ttl_ms: u64,
        /// The slot id (an allowed Acquire), else empty.
        slot: String,
    },
    /// A lease of `units` (0: direct, no lease).
    Lease { units: u64, reset_after_ms: u64 },
    /// A Release of `slot` was sent (whatever the answer).
    Release { slot: String },
    /// A gRPC error; its message kept for codes not in [`FAULT_CODES`].
    Failed { code: String, message: String },
}

/// One answer to a tracked (policy, key).
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    pub policy: usize,
    pub key: u32,
    pub sent_ms: u64,
    pub recv_ms: u64,
    /// The quotad replica asked.
    pub replica: usize,
    pub said: Said,
}

/// Whether an admission with this reason was counted by the store. The
/// one place that knows which reasons are decided without it: a
/// `local`-fallback reason, once that policy exists, is one more arm here.
pub fn counted_by_store(reason: &str) -> bool {
    !matches!(reason, "REASON_FAIL_OPEN")
}

/// A time in which the store may have lost acknowledged writes.
#[derive(Clone, Debug, Serialize)]
pub struct LossEvent {
    pub what: String,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// Admitted beyond the bound.
#[derive(Clone, Debug, Serialize)]
pub struct Excess {
    pub policy: &'static str,
    pub key: u32,
    /// The interval judged (a window, or the span of the admissions).
    pub from_ms: u64,
    pub to_ms: u64,
    pub admitted: u64,
    pub bound: u64,
    /// The loss event it overlaps, if any.
    pub during: Option<String>,
}

/// The checker's findings.
#[derive(Debug, Default, Serialize)]
pub struct Findings {
    /// Excess overlapping no loss event: failures.
    pub over_admitted: Vec<Excess>,
    /// Excess inside a loss event: the measured loss.
    pub lost_in_failover: Vec<Excess>,
    /// Answers with a code not in [`FAULT_CODES`] (first 20).
    pub bad_codes: Vec<Answer>,
    /// How many answers had such a code.
    pub bad_code_count: u64,
    /// Answers whose reason their policy's `on_error` cannot give (first 20).
    pub wrong_fallback: Vec<Answer>,
    /// Admissions of window policies that could not be placed in a window.
    pub unplaced: u64,
    /// Intervals judged, all rules.
    pub intervals_judged: u64,
    /// Admissions seen (counted by the store), all rules.
    pub admissions: u64,
}

/// Judges every answer. `margin_ms` widens each loss event on both sides
/// (a write acknowledged just before a SIGKILL, a failover noticed late).
pub fn judge(
    policies: &[Tracked],
    answers: &[Answer],
    losses: &[LossEvent],
    margin_ms: u64,
) -> Findings {
    let mut f = Findings::default();
    let mut by_key: BTreeMap<(usize, u32), Vec<&Answer>> = BTreeMap::new();
    for a in answers {
        let p = &policies[a.policy];
        match &a.said {
            Said::Failed { code, .. } if !FAULT_CODES.contains(&code.as_str()) => {
                f.bad_code_count += 1;
                if f.bad_codes.len() < 20 {
                    f.bad_codes.push(a.clone());
                }
            }
            Said::Decision { reason, .. } => {
                let fine = match reason.as_str() {
                    "REASON_FAIL_OPEN" => p.on_error == "fail_open",
                    "REASON_FAIL_CLOSED" => p.on_error == "fail_closed",
                    _ => true,
                };
                if !fine && f.wrong_fallback.len() < 20 {
                    f.wrong_fallback.push(a.clone());
                }
            }
            _ => {}
        }
        by_key.entry((a.policy, a.key)).or_default().push(a);
    }
    for ((policy, key), list) in by_key {
        let p = &policies[policy];
        let excesses = match p.rule {
            Rule::Window => window(p, &list, &mut f),
            Rule::Bucket => bucket(p, &list, &mut f),
            Rule::Log => log(p, &list, &mut f),
            Rule::Slots => slots(p, &list, &mut f),
        };
        for (from_ms, to_ms, admitted, bound) in excesses {
            let during = losses
                .iter()
                .find(|l| {
                    from_ms <= l.to_ms + margin_ms && l.from_ms.saturating_sub(margin_ms) <= to_ms
                })
                .map(|l| l.what.clone());
            let e = Excess {
                policy: p.name,
                key,
                from_ms,
                to_ms,
                admitted,
                bound,
                during: during.clone(),
            };
            if during.is_some() {
                f.lost_in_failover.push(e);
            } else {
                f.over_admitted.push(e);
            }
        }
    }
    f
}

/// Units an answer admitted that the store counted.
fn admitted(a: &Answer) -> u64 {
    match &a.said {
        Said::Decision {
            allowed: true,
            reason,
            ..
        } if counted_by_store(reason) => 1,
        Said::Lease { units, .. } => *units,
        _ => 0,
    }
}

type Found = Vec<(u64, u64, u64, u64)>;

fn window(p: &Tracked, list: &[&Answer], f: &mut Findings) -> Found {
    let w = p.window_ms;
    let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
    for a in list {
        let units = admitted(a);
        if units == 0 {
            continue;
        }
        f.admissions += 1;
        let reset = match &a.said {
            Said::Decision { reset_after_ms, .. } | Said::Lease { reset_after_ms, .. } => {
                *reset_after_ms
            }
            _ => 0,
        };
        let start = if a.sent_ms / w == a.recv_ms / w {
            Some(a.sent_ms / w * w)
        } else if p.algorithm == "fixed_window" {
            // A fixed window's reset is its end: the one multiple of the
            // window in [sent + reset, recv + reset].
            let (lo, hi) = (a.sent_ms + reset, a.recv_ms + reset);
            let end = hi / w * w;
            (end >= lo && end >= w && (end - w) < lo).then(|| end - w)
        } else {
            None
        };
        match start {
            Some(s) => *windows.entry(s).or_default() += units,
            None => f.unplaced += 1,
        }
    }
    f.intervals_judged += windows.len() as u64;
    windows
        .into_iter()
        .filter(|(_, n)| *n > p.limit)
        .map(|(s, n)| (s, s + w, n, p.limit))
        .collect()
}

fn sorted_admissions<'a>(list: &[&'a Answer], f: &mut Findings) -> Vec<&'a Answer> {
    let mut adm: Vec<&Answer> = list.iter().copied().filter(|a| admitted(a) > 0).collect();
    f.admissions += adm.len() as u64;
    adm.sort_by_key(|a| (a.sent_ms, a.recv_ms));
    adm
}

fn bucket(p: &Tracked, list: &[&Answer], f: &mut Findings) -> Found {
    let adm = sorted_admissions(list, f);
    let w = u128::from(p.window_ms);
    // Beyond this, the refill alone covers anything sent: no need to look.
    let horizon = p.window_ms * (p.burst / p.limit.max(1) + 2) * 2;
    let mut found = Vec::new();
    for (i, first) in adm.iter().enumerate() {
        let mut recvs: Vec<u64> = adm[i..]
            .iter()
            .take_while(|a| a.sent_ms <= first.sent_ms + horizon)
            .map(|a| a.recv_ms)
            .collect();
        recvs.sort_unstable();
        f.intervals_judged += 1;
        let mut worst: Option<(u64, u64, u64)> = None;
        for (m, t) in recvs.iter().enumerate() {
            let count = m as u128 + 1;
            let span = u128::from(t.saturating_sub(first.sent_ms));
            let bound = u128::from(p.burst) * w + u128::from(p.limit) * span;
            if count * w > bound {
                let b = u64::try_from(bound / w).unwrap_or(u64::MAX);
                worst = Some((*t, m as u64 + 1, b));
            }
        }
        if let Some((t, count, b)) = worst {
            found.push((first.sent_ms, t, count, b));
        }
    }
    merge(found)
}

fn log(p: &Tracked, list: &[&Answer], f: &mut Findings) -> Found {
    let adm = sorted_admissions(list, f);
    let mut found = Vec::new();
    for (i, first) in adm.iter().enumerate() {
        let end = first.sent_ms + p.window_ms;
        let count = adm[i..]
            .iter()
            .take_while(|a| a.sent_ms < end)
            .filter(|a| a.recv_ms < end)
            .count() as u64;
        f.intervals_judged += 1;
        if count > p.limit {
            found.push((first.sent_ms, end, count, p.limit));
        }
    }
    merge(found)
}

fn slots(p: &Tracked, list: &[&Answer], f: &mut Findings) -> Found {
    // Slot id -> (surely held from, the earliest it can have ended).
    let mut held: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for a in list {
        match &a.said {
            Said::Decision {
                allowed: true,
                slot,
                slot_ttl_ms,
                ..
            } if !slot.is_empty() => {
                f.admissions += 1;
                held.insert(slot.as_str(), (a.recv_ms, a.sent_ms + slot_ttl_ms));
            }
            _ => {}
        }
    }
    for a in list {
        if let Said::Release { slot } = &a.said
            && let Some(h) = held.get_mut(slot.as_str())
        {
            h.1 = h.1.min(a.sent_ms);
        }
    }
    // Sweep: +1 at a start, -1 at an end; ends first at equal times.
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for (from, to) in held.values() {
        if from < to {
            edges.push((*from, 1));
            edges.push((*to, -1));
        }
    }
    edges.sort_unstable();
    let mut found = Vec::new();
    let mut level: i64 = 0;
    let mut over_since: Option<(u64, i64)> = None;
    for (t, d) in edges {
        level += d;
        f.intervals_judged += 1;
        if level > i64::try_from(p.limit).unwrap_or(i64::MAX) {
            let peak = over_since.map_or(level, |(_, m)| m.max(level));
            over_since = Some((over_since.map_or(t, |(s, _)| s), peak));
        } else if let Some((s, peak)) = over_since.take() {
            found.push((s, t, u64::try_from(peak).unwrap_or(0), p.limit));
        }
    }
    found
}

/// Joins overlapping intervals of excess (one burst reported once, at
/// its worst).
fn merge(mut found: Found) -> Found {
    found.sort_unstable();
    let mut out: Found = Vec::new();
    for e in found {
        match out.last_mut() {
            Some(last) if e.0 <= last.1 => {
                last.1 = last.1.max(e.1);
                if e.2.saturating_sub(e.3) > last.2.saturating_sub(last.3) {
                    (last.2, last.3) = (e.2, e.3);
                }
            }
            _ => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FW: Tracked = Tracked {
        name: "fw_error",
        algorithm: "fixed_window",
        rule: Rule::Window,
        limit: 2,
        window_ms: 1_000,
        burst: 2,
        on_error: "error",
    };
    const TB: Tracked = Tracked {
        name: "tb",
        algorithm: "token_bucket",
        rule: Rule::Bucket,
        limit: 1,
        window_ms: 1_000,
        burst: 2,
        on_error: "fail_closed",
    };
    const LOG: Tracked = Tracked {
        name: "log",
        algorithm: "sliding_log",
        rule: Rule::Log,
        limit: 2,
        window_ms: 1_000,
        burst: 2,
        on_error: "error",
    };
    const SLOTS: Tracked = Tracked {
        name: "conc",
        algorithm: "concurrency",
        rule: Rule::Slots,
        limit: 1,
        window_ms: 1_000,
        burst: 1,
        on_error: "error",
    };

    fn allow(policy: usize, at: u64, reset: u64) -> Answer {
        Answer {
            policy,
            key: 0,
            sent_ms: at,
            recv_ms: at + 1,
            replica: 0,
            said: Said::Decision {
                allowed: true,
                reason: "REASON_OK".to_owned(),
                reset_after_ms: reset,
                slot_ttl_ms: 0,
                slot: String::new(),
            },
        }
    }

    #[test]
    fn a_window_over_its_limit_fails_and_one_at_it_passes() {
        let at_limit = [
            allow(0, 10_100, 900),
            allow(0, 10_500, 500),
            allow(0, 11_000, 1_000),
        ];
        let f = judge(&[FW], &at_limit, &[], 0);
        assert!(f.over_admitted.is_empty(), "{f:?}");
        assert_eq!(f.intervals_judged, 2);
        let mut over = at_limit.to_vec();
        over.push(allow(0, 10_900, 100));
        let f = judge(&[FW], &over, &[], 0);
        assert_eq!(f.over_admitted.len(), 1);
        assert_eq!(
            (f.over_admitted[0].from_ms, f.over_admitted[0].admitted),
            (10_000, 3)
        );
    }

    #[test]
    fn an_answer_across_a_boundary_is_placed_by_its_reset() {
        let mut a = allow(0, 10_998, 0);
        a.recv_ms = 11_003;
        // Decided at 11_001: the window [11_000, 12_000), 999 ms left.
        if let Said::Decision { reset_after_ms, .. } = &mut a.said {
            *reset_after_ms = 999;
        }
        let list = [a.clone(), allow(0, 11_100, 900), allow(0, 11_200, 800)];
        let f = judge(&[FW], &list, &[], 0);
        assert_eq!(f.over_admitted.len(), 1, "{f:?}");
        assert_eq!(f.unplaced, 0);
    }

    #[test]
    fn fail_open_admissions_are_not_counted_and_only_fail_open_policies_give_them() {
        let mut open = allow(0, 10_100, 0);
        if let Said::Decision { reason, .. } = &mut open.said {
            *reason = "REASON_FAIL_OPEN".to_owned();
        }
        let list = [allow(0, 10_100, 900), allow(0, 10_200, 800), open];
        let f = judge(&[FW], &list, &[], 0);
        assert!(f.over_admitted.is_empty());
        assert_eq!(f.wrong_fallback.len(), 1, "fw_error's on_error is error");
    }

    #[test]
    fn an_excess_inside_a_loss_event_is_reported_as_loss_not_failure() {
        let list = [
            allow(0, 10_100, 900),
            allow(0, 10_200, 800),
            allow(0, 10_300, 700),
        ];
        let loss = LossEvent {
            what: "SIGKILL redis-primary".to_owned(),
            from_ms: 10_250,
            to_ms: 10_260,
        };
        let f = judge(&[FW], &list, &[loss], 0);
        assert!(f.over_admitted.is_empty());
        assert_eq!(f.lost_in_failover.len(), 1);
        let far = LossEvent {
            what: "x".to_owned(),
            from_ms: 20_000,
            to_ms: 20_001,
        };
        assert_eq!(judge(&[FW], &list, &[far], 1_000).over_admitted.len(), 1);
    }

    #[test]
    fn a_bucket_allows_its_burst_and_its_rate_and_no_more() {
        // Burst 2, then one a second.
        let ok: Vec<Answer> = [0, 1, 1_002, 2_004, 3_006]
            .iter()
            .map(|t| allow(0, 10_000 + t, 0))
            .collect();
        assert!(judge(&[TB], &ok, &[], 0).over_admitted.is_empty());
        let mut over = ok.clone();
        over.push(allow(0, 10_500, 0));
        let f = judge(&[TB], &over, &[], 0);
        assert_eq!(f.over_admitted.len(), 1, "{f:?}");
    }

    #[test]
    fn a_log_allows_its_limit_in_any_window_long_interval() {
        let ok: Vec<Answer> = [0, 10, 1_020, 1_030]
            .iter()
            .map(|t| allow(0, 10_000 + t, 0))
            .collect();
        assert!(judge(&[LOG], &ok, &[], 0).over_admitted.is_empty());
        let over: Vec<Answer> = [0, 600, 990]
            .iter()
            .map(|t| allow(0, 10_000 + t, 0))
            .collect();
        assert_eq!(judge(&[LOG], &over, &[], 0).over_admitted.len(), 1);
    }

    #[test]
    fn slots_held_at_once_beyond_the_limit_fail() {
        let acquire = |slot: &str, at: u64| Answer {
            said: Said::Decision {
                allowed: true,
                reason: "REASON_OK".to_owned(),
                reset_after_ms: 0,
                slot_ttl_ms: 2_000,
                slot: slot.to_owned(),
            },
            ..allow(0, at, 0)
        };
        let release = |slot: &str, at: u64| Answer {
            said: Said::Release {
                slot: slot.to_owned(),
            },
            ..allow(0, at, 0)
        };
        let ok = [
            acquire("a", 100),
            release("a", 200),
            acquire("b", 250),
            release("b", 300),
        ];
        assert!(judge(&[SLOTS], &ok, &[], 0).over_admitted.is_empty());
        // b taken while a is surely held.
        let over = [
            acquire("a", 100),
            acquire("b", 150),
            release("a", 200),
            release("b", 300),
        ];
        let f = judge(&[SLOTS], &over, &[], 0);
        assert_eq!(f.over_admitted.len(), 1, "{f:?}");
        // Never released: a ends by its TTL, then b may be taken.
        let ttl = [acquire("a", 100), acquire("b", 2_200)];
        assert!(judge(&[SLOTS], &ttl, &[], 0).over_admitted.is_empty());
    }

    #[test]
    fn codes_outside_the_documented_ones_fail() {
        let failed = |code: &str| Answer {
            said: Said::Failed {
                code: code.to_owned(),
                message: String::new(),
            },
            ..allow(0, 1, 0)
        };
        let list = [
            failed("UNAVAILABLE"),
            failed("DEADLINE_EXCEEDED"),
            failed("INTERNAL"),
        ];
        let f = judge(&[FW], &list, &[], 0);
        assert_eq!(f.bad_codes.len(), 1);
    }
}
