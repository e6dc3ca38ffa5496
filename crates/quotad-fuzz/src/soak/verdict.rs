//! The soak's pass criteria, as pure functions of what a phase recorded.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Backend, Sample, Tally, WINDOW_MS};

/// How far resident memory may move from its first sample after warm-up.
pub const RSS_TOLERANCE: f64 = 0.10;

/// `UNAVAILABLE` is expected from this long before Redis is stopped to
/// this long after it answers again (quotad reconnects meanwhile).
pub const RESTART_MARGIN_S: (f64, f64) = (1.0, 10.0);

/// One answer to the checker key.
#[derive(Clone, Debug, Serialize)]
pub struct CheckerAnswer {
    /// When it arrived, ms since the Unix epoch.
    pub received_ms: u64,
    /// Whether the call failed (a gRPC error, `reason` is its code).
    pub failed: bool,
    /// Whether it admitted.
    pub allowed: bool,
    /// Until the window's end (a fixed window's state is fresh then).
    pub reset_after_ms: u64,
    /// The reason, by its protobuf name.
    pub reason: String,
}

/// The checker's admissions in one window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckerWindow {
    /// The window's start, ms since the Unix epoch.
    pub start_ms: u64,
    /// Calls admitted in it.
    pub admitted: u64,
    /// Calls that failed in it: each may have been counted by the store
    /// with its answer lost (Redis stopping after running the script).
    pub failed: u64,
    /// Whether the checker asked during the whole window (the first and
    /// last windows of a phase are partial and not judged).
    pub complete: bool,
}

/// Groups the checker's answers by fixed window of `window_ms`. An
/// admission is placed by the window end it reports (`received +
/// reset_after`, within a round trip of the server's own), rounded to the
/// nearest window boundary; every answer, admitted or not, marks its
/// window as asked.
pub fn checker_windows(answers: &[CheckerAnswer], window_ms: u64) -> Vec<CheckerWindow> {
    let mut windows: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for a in answers {
        let start = if a.allowed && a.reset_after_ms > 0 {
            let end = (a.received_ms + a.reset_after_ms + window_ms / 2) / window_ms * window_ms;
            end - window_ms
        } else {
            a.received_ms / window_ms * window_ms
        };
        let (admitted, failed) = windows.entry(start).or_default();
        *admitted += u64::from(a.allowed);
        *failed += u64::from(a.failed);
    }
    let (Some(first), Some(last)) = (
        answers.iter().map(|a| a.received_ms).min(),
        answers.iter().map(|a| a.received_ms).max(),
    ) else {
        return Vec::new();
    };
    windows
        .into_iter()
        .map(|(start_ms, (admitted, failed))| CheckerWindow {
            start_ms,
            admitted,
            failed,
            complete: start_ms > first && start_ms + window_ms < last,
        })
        .collect()
}

/// The value of the metric line `name` (with its labels) in a Prometheus
/// text exposition.
pub fn metric(exposition: &str, name: &str) -> Option<u64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// What a phase recorded, for [`PhaseVerdict::judge`].
#[derive(Debug)]
pub struct Evidence<'a> {
    /// The backend.
    pub backend: Backend,
    /// Seconds at the start not judged for memory.
    pub warmup_s: f64,
    /// RSS samples.
    pub rss: &'a [Sample],
    /// Calls, errors and decisions.
    pub tally: &'a Tally,
    /// The checker's windows.
    pub checker: &'a [CheckerWindow],
    /// The checker's limit per window.
    pub checker_limit: u64,
    /// When Redis went down and came back, seconds into the phase.
    pub redis_restart_s: Option<(f64, f64)>,
    /// When the phase started, ms since the Unix epoch.
    pub started_ms: u64,
    /// Config rewrites.
    pub reloads_written: u64,
    /// Reloads the server counted, (ok, error).
    pub reloads_seen: (u64, u64),
}

/// Each criterion's outcome: `None` when it held, else why not.
#[derive(Debug, Default, Serialize)]
pub struct PhaseVerdict {
    /// RSS within ±10% of its first sample after warm-up.
    pub rss: Option<String>,
    /// No error but `UNAVAILABLE` around the Redis restart.
    pub errors: Option<String>,
    /// Every rewrite reloaded, none rejected.
    pub reloads: Option<String>,
    /// Exactly the limit admitted in every complete window.
    pub budget: Option<String>,
    /// Memory store: it filled, and refused keys (`on_full = "deny"`).
    pub store_full: Option<String>,
    /// The reference RSS (KiB) and the range seen after warm-up.
    pub rss_range_kib: Option<(u64, u64, u64)>,
    /// Complete windows judged.
    pub windows_judged: usize,
    /// The last expected `UNAVAILABLE`, seconds after Redis answered again.
    pub recovered_after_s: Option<f64>,
}

impl PhaseVerdict {
    /// Judges a phase.
    pub fn judge(e: &Evidence<'_>) -> PhaseVerdict {
        let mut v = PhaseVerdict::default();
        v.judge_rss(e);
        v.judge_errors(e);
        v.judge_reloads(e);
        v.judge_budget(e);
        if e.backend == Backend::Memory && !e.tally.reasons.contains_key("REASON_CAPACITY") {
            v.store_full = Some("the store never filled: no CAPACITY decision".to_owned());
        }
        v
    }

    /// Whether every criterion held.
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// The criteria that failed, with why.
    pub fn failures(&self) -> Vec<&str> {
        [
            &self.rss,
            &self.errors,
            &self.reloads,
            &self.budget,
            &self.store_full,
        ]
        .into_iter()
        .filter_map(|f| f.as_deref())
        .collect()
    }

    fn judge_rss(&mut self, e: &Evidence<'_>) {
        let after: Vec<u64> = e
            .rss
            .iter()
            .filter(|s| s.at_s >= e.warmup_s)
            .map(|s| s.rss_kib)
            .collect();
        let Some(&reference) = after.first() else {
            self.rss = Some("no RSS sample after warm-up".to_owned());
            return;
        };
        let (low, high) = (
            after.iter().copied().min().unwrap_or(reference),
            after.iter().copied().max().unwrap_or(reference),
        );
        self.rss_range_kib = Some((reference, low, high));
        let bound = reference as f64 * RSS_TOLERANCE;
        if (high as f64) > reference as f64 + bound || (low as f64) < reference as f64 - bound {
            self.rss = Some(format!(
                "RSS left ±10% of {reference} KiB after warm-up: {low}..{high} KiB"
            ));
        }
    }

    fn judge_errors(&mut self, e: &Evidence<'_>) {
        let restart = e
            .redis_restart_s
            .map(|(down, up)| (down - RESTART_MARGIN_S.0, up + RESTART_MARGIN_S.1));
        let mut unexpected: BTreeMap<&str, u64> = BTreeMap::new();
        let mut last_expected = None;
        for (at, what) in &e.tally.failures {
            let around_restart = restart.is_some_and(|(from, to)| (from..=to).contains(at));
            let unavailable = matches!(
                what.as_str(),
                "UNAVAILABLE" | "REASON_UNAVAILABLE" | "REASON_FAIL_OPEN" | "REASON_FAIL_CLOSED"
            );
            if unavailable && around_restart {
                last_expected = Some(*at);
            } else {
                *unexpected.entry(what).or_default() += 1;
            }
        }
        self.recovered_after_s = last_expected
            .zip(e.redis_restart_s)
            .map(|(at, (_, up))| at - up);
        if e.tally.failures_not_listed > 0 {
            self.errors = Some(format!(
                "more than 10,000 failures ({} not listed)",
                e.tally.failures_not_listed
            ));
        } else if !unexpected.is_empty() {
            self.errors = Some(format!("unexpected failures: {unexpected:?}"));
        }
        if e.tally.calls.values().sum::<u64>() == 0 {
            self.errors = Some("no call was answered".to_owned());
        }
    }

    fn judge_reloads(&mut self, e: &Evidence<'_>) {
        let (ok, error) = e.reloads_seen;
        if error > 0 || ok < e.reloads_written {
            self.reloads = Some(format!(
                "{} rewrites: {ok} reloads applied, {error} rejected",
                e.reloads_written
            ));
        }
    }

    /// Exactly the limit in every complete window; in a window around the
    /// Redis restart, never more, and fewer only by calls that failed (a
    /// script Redis ran whose answer was lost as it stopped).
    fn judge_budget(&mut self, e: &Evidence<'_>) {
        let complete: Vec<&CheckerWindow> = e.checker.iter().filter(|w| w.complete).collect();
        self.windows_judged = complete.len();
        let restart = e.redis_restart_s.map(|(down, up)| {
            let ms = |s: f64| e.started_ms + (s.max(0.0) * 1_000.0) as u64;
            (ms(down - RESTART_MARGIN_S.0), ms(up + RESTART_MARGIN_S.1))
        });
        let limit = e.checker_limit;
        let wrong: Vec<(u64, u64)> = complete
            .iter()
            .filter(|w| {
                let near_restart = restart
                    .is_some_and(|(from, to)| w.start_ms < to && w.start_ms + WINDOW_MS > from);
                if near_restart {
                    w.admitted > limit || w.admitted + w.failed < limit
                } else {
                    w.admitted != limit
                }
            })
            .map(|w| (w.start_ms, w.admitted))
            .collect();
        if complete.is_empty() {
            self.budget = Some("no complete window to judge".to_owned());
        } else if !wrong.is_empty() {
            self.budget = Some(format!(
                "{} of {} windows did not admit exactly {}: (start ms, admitted) {:?}",
                wrong.len(),
                complete.len(),
                e.checker_limit,
                &wrong[..wrong.len().min(10)]
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(received_ms: u64, allowed: bool, window: u64) -> CheckerAnswer {
        CheckerAnswer {
            received_ms,
            failed: false,
            allowed,
            reset_after_ms: if allowed {
                window - received_ms % window
            } else {
                0
            },
            reason: String::new(),
        }
    }

    /// A checker asking every 100 ms from `from` to `to`, admitted `limit`
    /// times per window.
    fn steady(from: u64, to: u64, window: u64, limit: u64) -> Vec<CheckerAnswer> {
        let mut used: BTreeMap<u64, u64> = BTreeMap::new();
        (from..to)
            .step_by(100)
            .map(|at| {
                let count = used.entry(at / window).or_default();
                *count += 1;
                answer(at, *count <= limit, window)
            })
            .collect()
    }

    fn evidence<'a>(
        rss: &'a [Sample],
        tally: &'a Tally,
        checker: &'a [CheckerWindow],
    ) -> Evidence<'a> {
        Evidence {
            backend: Backend::Memory,
            warmup_s: 20.0,
            rss,
            tally,
            checker,
            checker_limit: 5,
            redis_restart_s: None,
            started_ms: 0,
            reloads_written: 3,
            reloads_seen: (3, 0),
        }
    }

    fn samples(kib: &[u64]) -> Vec<Sample> {
        kib.iter()
            .enumerate()
            .map(|(i, &rss_kib)| Sample {
                at_s: i as f64 * 10.0,
                rss_kib,
            })
            .collect()
    }

    fn answered() -> Tally {
        let mut tally = Tally::default();
        tally.calls.insert("check".to_owned(), 10);
        tally.reasons.insert("REASON_CAPACITY".to_owned(), 1);
        tally
    }

    #[test]
    fn counts_admissions_per_window_and_judges_only_complete_ones() {
        let windows = checker_windows(&steady(1_000, 20_000, 5_000, 5), 5_000);
        let starts: Vec<u64> = windows.iter().map(|w| w.start_ms).collect();
        assert_eq!(starts, [0, 5_000, 10_000, 15_000]);
        assert!(windows.iter().all(|w| w.admitted == 5));
        let complete: Vec<u64> = windows
            .iter()
            .filter(|w| w.complete)
            .map(|w| w.start_ms)
            .collect();
        assert_eq!(complete, [5_000, 10_000]);
    }

    #[test]
    fn an_admission_late_in_a_window_counts_in_that_window() {
        // Received 30 ms after the boundary, but the server decided before it.
        let late = CheckerAnswer {
            received_ms: 10_030,
            failed: false,
            allowed: true,
            reset_after_ms: 10,
            reason: String::new(),
        };
        let windows = checker_windows(&[answer(5_100, true, 5_000), late], 5_000);
        assert_eq!(windows[0].start_ms, 5_000);
        assert_eq!(windows[0].admitted, 2);
    }

    #[test]
    fn a_steady_phase_passes() {
        let rss = samples(&[10_000, 30_000, 40_000, 41_000, 39_000, 42_000]);
        let tally = answered();
        let windows = checker_windows(&steady(0, 30_000, 5_000, 5), 5_000);
        let verdict = PhaseVerdict::judge(&evidence(&rss, &tally, &windows));
        assert!(verdict.passed(), "{verdict:?}");
        assert_eq!(verdict.rss_range_kib, Some((40_000, 39_000, 42_000)));
        assert!(verdict.windows_judged >= 4);
    }

    #[test]
    fn memory_growing_past_ten_percent_fails() {
        let rss = samples(&[10_000, 30_000, 40_000, 42_000, 44_500]);
        let tally = answered();
        let windows = checker_windows(&steady(0, 30_000, 5_000, 5), 5_000);
        let verdict = PhaseVerdict::judge(&evidence(&rss, &tally, &windows));
        assert!(verdict.rss.is_some(), "{verdict:?}");
    }

    #[test]
    fn one_window_over_its_limit_fails() {
        let rss = samples(&[1, 1, 1, 1]);
        let tally = answered();
        let mut answers = steady(0, 30_000, 5_000, 5);
        answers.push(answer(12_000, true, 5_000));
        let windows = checker_windows(&answers, 5_000);
        let verdict = PhaseVerdict::judge(&evidence(&rss, &tally, &windows));
        let why = verdict.budget.expect("a window admitted 6");
        assert!(why.contains("(10000, 6)"), "{why}");
    }

    #[test]
    fn unavailable_passes_only_around_the_redis_restart() {
        let rss = samples(&[1, 1, 1, 1]);
        let windows = checker_windows(&steady(0, 30_000, 5_000, 5), 5_000);
        let mut tally = answered();
        tally.failures = vec![
            (100.5, "UNAVAILABLE".to_owned()),
            (103.0, "REASON_UNAVAILABLE".to_owned()),
        ];
        let mut e = evidence(&rss, &tally, &windows);
        e.backend = Backend::Redis;
        e.redis_restart_s = Some((100.0, 101.0));
        let verdict = PhaseVerdict::judge(&e);
        assert!(verdict.passed(), "{verdict:?}");
        assert_eq!(verdict.recovered_after_s, Some(2.0));

        tally.failures.push((150.0, "UNAVAILABLE".to_owned()));
        tally.failures.push((150.0, "INTERNAL".to_owned()));
        let mut e = evidence(&rss, &tally, &windows);
        e.redis_restart_s = Some((100.0, 101.0));
        let why = PhaseVerdict::judge(&e)
            .errors
            .expect("errors after recovery");
        assert!(
            why.contains("\"INTERNAL\": 1") && why.contains("\"UNAVAILABLE\": 1"),
            "{why}"
        );
    }

    #[test]
    fn a_failed_call_around_the_restart_may_have_been_counted_but_nothing_more() {
        let rss = samples(&[1, 1, 1, 1]);
        let tally = answered();
        let mut answers = steady(0, 30_000, 5_000, 5);
        // In the window of the restart, one admission's answer was lost.
        let lost = answers
            .iter()
            .position(|a| a.allowed && (10_000..15_000).contains(&a.received_ms))
            .expect("an admission in that window");
        answers[lost] = CheckerAnswer {
            received_ms: answers[lost].received_ms,
            failed: true,
            allowed: false,
            reset_after_ms: 0,
            reason: "UNAVAILABLE".to_owned(),
        };
        let windows = checker_windows(&answers, 5_000);
        let mut e = evidence(&rss, &tally, &windows);
        e.backend = Backend::Redis;
        e.redis_restart_s = Some((11.0, 11.5));
        assert!(PhaseVerdict::judge(&e).budget.is_none());
        // The same shortfall away from the restart fails.
        e.redis_restart_s = Some((25.0, 25.5));
        assert!(PhaseVerdict::judge(&e).budget.is_some());
    }

    #[test]
    fn a_memory_phase_whose_store_never_filled_fails() {
        let rss = samples(&[1, 1, 1, 1]);
        let mut tally = answered();
        tally.reasons.clear();
        let windows = checker_windows(&steady(0, 30_000, 5_000, 5), 5_000);
        assert!(
            PhaseVerdict::judge(&evidence(&rss, &tally, &windows))
                .store_full
                .is_some()
        );
    }

    #[test]
    fn a_rejected_or_missed_reload_fails() {
        let rss = samples(&[1, 1, 1, 1]);
        let tally = answered();
        let windows = checker_windows(&steady(0, 30_000, 5_000, 5), 5_000);
        let mut e = evidence(&rss, &tally, &windows);
        e.reloads_seen = (2, 1);
        assert!(PhaseVerdict::judge(&e).reloads.is_some());
    }

    #[test]
    fn reads_a_labelled_metric() {
        let text = "# TYPE x counter\nquotad_policy_reloads_total{outcome=\"ok\"} 7\nquotad_live_keys 1234\n";
        assert_eq!(
            metric(text, "quotad_policy_reloads_total{outcome=\"ok\"}"),
            Some(7)
        );
        assert_eq!(metric(text, "quotad_live_keys"), Some(1_234));
        assert_eq!(metric(text, "quotad_live"), None);
    }
}
