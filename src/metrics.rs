//! Prometheus metrics, rendered by the admin server's `/metrics`.
//!
//! Each [`crate::run`] owns its own recorder instead of installing a
//! process-global one, so several servers (integration tests) can run in one
//! process without sharing counts. Handles are registered once and kept:
//! the hot path increments a counter it already holds, and decision counters
//! are cached per policy, algorithm, outcome and reason.
//!
//! Labels are policy **names** (or `inline`), algorithms, outcomes, reasons,
//! methods and status codes: never keys.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `quotad_decisions_total` | counter | `policy`, `algorithm`, `outcome` (`allowed`/`denied`), `reason` |
//! | `quotad_request_errors_total` | counter | `method`, `code` (`Cancelled` for a call dropped unanswered) |
//! | `quotad_decision_duration_seconds` | histogram | `method` |
//! | `quotad_store_operations_total` | counter | `backend`, `op` |
//! | `quotad_live_keys` | gauge | |
//! | `quotad_max_keys` | gauge (memory store only) | |
//! | `quotad_build_info` | gauge, always 1 | `version` |
//! | `quotad_evictions_total` | counter | |
//! | `quotad_reclaimed_keys_total` | counter | |
//! | `quotad_policy_reloads_total` | counter | `outcome` (`ok`/`error`) |
//! | `quotad_snapshot_writes_total` | counter | `outcome` (`ok`/`error`) |
//! | `quotad_snapshot_last_write_seconds`, `_bytes`, `_timestamp_seconds` | gauge | |
//! | `quotad_snapshot_loaded_entries_total` | counter | `outcome` (`loaded`, `expired`, `over_capacity`, `policy_removed`, `policy_changed`) |
//! | `quotad_snapshot_load_failures_total` | counter | |
//! | `quotad_redis_connection_attempts_total` | counter | `outcome` (`ok`/`error`) |
//! | `quotad_redis_late_scripts_total` | counter | `outcome` (`refused`/`counted`) |
//! | `quotad_redis_corrupt_state_total` | counter | |
//! | `quotad_connections_rejected_total` | counter | `port` (`grpc`/`admin`) |
//! | `quotad_calls_shed_total` | counter | |
//! | `quotad_local_fallback_decisions_total` | counter | `outcome` (`allowed`/`denied`) |
//! | `quotad_store_breaker_state` | gauge: 0 closed, 1 open, 2 half-open (Redis only) | |
//! | `quotad_store_breaker_transitions_total` | counter | `to` (`open`/`half_open`/`closed`) |
//! | `quotad_auth_denied_total` | counter | `method` (the `[auth]` group: `check`, `peek`, `reset`, `should_rate_limit`) |
//! | `quotad_rls_reloads_total` | counter | `outcome` (`ok`/`error`) |
//! | `quotad_rls_rules` | gauge | |
//! | `quotad_rls_shadow_denials_total` | counter | `policy` (the rule's namespace) |
//! | `quotad_rls_no_limit_total` | counter | `reason` |
//! | `quotad_leases_total` | counter | `policy`, `outcome` (`granted`, `direct`, `returned`, `ended`, `refused`) |
//! | `quotad_lease_units_granted_total`, `quotad_lease_units_returned_total` | counter | `policy` |
//! | `quotad_overrides` | gauge | `policy`, `source` (`file`/`runtime`) |
//! | `quotad_overrides_in_sync` | gauge, 1 or 0 | |
//!
//! The `quotad_redis_*` series stay at 0 with the memory backend.
//!
//! RLS decisions go to `quotad_decisions_total` too, labelled with the
//! rule's state namespace (`rls:<domain>/<key>[=<value>]...`, from the
//! rules files) or `rls:<domain>#<unit>` for limits sent by Envoy: never
//! a request's values.
//!
//! Every series quotad exports is declared here, once, with its help text
//! and labels next to the table above, so adding a metric touches one file
//! and the dashboard's and alerts' names can be checked against one place.
//! The per-method series follow the method table (`crate::methods`): a
//! method added there is timed and counted without a change here.
//! What each series means to an operator is `docs/metrics.md`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder as _};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusRecorder};
use quotad_core::{Algorithm, Decision, Reason};

use crate::methods::AuthGroup;

/// The label used for every inline policy, whatever its parameters.
pub(crate) const INLINE_POLICY_LABEL: &str = "inline";

const DECISIONS: &str = "quotad_decisions_total";
const REQUEST_ERRORS: &str = "quotad_request_errors_total";
const DURATION: &str = "quotad_decision_duration_seconds";
const STORE_OPERATIONS: &str = "quotad_store_operations_total";
const LIVE_KEYS: &str = "quotad_live_keys";
const MAX_KEYS: &str = "quotad_max_keys";
const BUILD_INFO: &str = "quotad_build_info";
const EVICTIONS: &str = "quotad_evictions_total";
const RECLAIMED: &str = "quotad_reclaimed_keys_total";
const SLOTS_HELD: &str = "quotad_concurrency_slots_held";
const SLOTS_EXPIRED: &str = "quotad_concurrency_slots_expired_total";
const RELOADS: &str = "quotad_policy_reloads_total";
const SNAPSHOT_WRITES: &str = "quotad_snapshot_writes_total";
const SNAPSHOT_SECONDS: &str = "quotad_snapshot_last_write_seconds";
const SNAPSHOT_BYTES: &str = "quotad_snapshot_last_write_bytes";
const SNAPSHOT_TIMESTAMP: &str = "quotad_snapshot_last_write_timestamp_seconds";
const SNAPSHOT_LOADED: &str = "quotad_snapshot_loaded_entries_total";
const SNAPSHOT_LOAD_FAILURES: &str = "quotad_snapshot_load_failures_total";
const REDIS_CONNECTS: &str = "quotad_redis_connection_attempts_total";
const REDIS_LATE: &str = "quotad_redis_late_scripts_total";
const REDIS_CORRUPT: &str = "quotad_redis_corrupt_state_total";
const CONNECTIONS_REJECTED: &str = "quotad_connections_rejected_total";
const CALLS_SHED: &str = "quotad_calls_shed_total";
/// Counted by the local fallback of `on_error = "local"`, as a figure of
/// its backend (`crate::backend::fallback`).
pub(crate) const LOCAL_FALLBACK: &str = "quotad_local_fallback_decisions_total";
/// The local fallback's breaker (`crate::backend::breaker`): its state, and
/// its transitions as a figure of its backend.
const BREAKER_STATE: &str = "quotad_store_breaker_state";
pub(crate) const BREAKER_TRANSITIONS: &str = "quotad_store_breaker_transitions_total";
const AUTH_DENIED: &str = "quotad_auth_denied_total";
const RLS_RELOADS: &str = "quotad_rls_reloads_total";
const RLS_RULES: &str = "quotad_rls_rules";
const RLS_SHADOW: &str = "quotad_rls_shadow_denials_total";
const RLS_NO_LIMIT: &str = "quotad_rls_no_limit_total";
const LEASES: &str = "quotad_leases_total";
const LEASE_UNITS_GRANTED: &str = "quotad_lease_units_granted_total";
const LEASE_UNITS_RETURNED: &str = "quotad_lease_units_returned_total";
const OVERRIDES: &str = "quotad_overrides";
const OVERRIDES_IN_SYNC: &str = "quotad_overrides_in_sync";

/// Histogram buckets for request handling time: 10 µs to 100 ms.
const DURATION_BUCKETS: [f64; 13] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1,
];

/// The gRPC methods, whose `as_str` is their `method` label: declared in
/// the method table, which every per-method series follows.
pub(crate) use crate::methods::Method;

/// One server's metrics registry and the handles it hands out.
#[derive(Debug)]
pub(crate) struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    durations: [Histogram; Method::COUNT],
    live_keys: Gauge,
    max_keys: Gauge,
    evictions: Counter,
    reclaimed: Counter,
    reloads_ok: Counter,
    reloads_error: Counter,
    inline: [Arc<DecisionCounters>; 6],
    inline_leases: Arc<LeaseCounters>,
    rls_reloads_ok: Counter,
    rls_reloads_error: Counter,
    rls_rules: Gauge,
    rls_no_limit: [Counter; 4],
    slots_expired: Counter,
    /// The policy labels `quotad_concurrency_slots_held` was set for, so
    /// that a policy whose slots are all gone is set back to 0.
    slots_held_labels: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The (policy, source) labels `quotad_overrides` was set for, so that
    /// a policy whose overrides are all gone is set back to 0.
    override_labels: std::sync::Mutex<std::collections::BTreeSet<(String, &'static str)>>,
    overrides_in_sync: Gauge,
}

/// Why an RLS descriptor had no limit to check, as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoLimitReason {
    /// No rules file names the request's domain.
    UnknownDomain,
    /// The domain has no rule for the descriptor.
    NoMatch,
    /// The rule matched is replaced by another rule of the request.
    Replaced,
    /// The rule is `unlimited: true`.
    Unlimited,
}

impl NoLimitReason {
    const ALL: [NoLimitReason; 4] = [
        NoLimitReason::UnknownDomain,
        NoLimitReason::NoMatch,
        NoLimitReason::Replaced,
        NoLimitReason::Unlimited,
    ];

    fn as_str(self) -> &'static str {
        match self {
            NoLimitReason::UnknownDomain => "unknown_domain",
            NoLimitReason::NoMatch => "no_match",
            NoLimitReason::Replaced => "replaced",
            NoLimitReason::Unlimited => "unlimited",
        }
    }
}

impl Metrics {
    /// A fresh registry with every metric described.
    ///
    /// # Errors
    ///
    /// [`BuildError`] if the histogram buckets are rejected (they are fixed,
    /// so this does not happen in practice).
    pub(crate) fn new() -> Result<Self, BuildError> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(DURATION.to_owned()), &DURATION_BUCKETS)?
            .build_recorder();
        let recorder = Arc::new(recorder);
        describe(&recorder);
        let counter =
            |name: &'static str, labels: Vec<Label>| register_counter(&recorder, name, labels);
        let gauge = recorder.register_gauge(&Key::from_static_name(LIVE_KEYS), &metadata());
        recorder
            .register_gauge(
                &Key::from_parts(
                    BUILD_INFO,
                    vec![Label::new("version", env!("CARGO_PKG_VERSION"))],
                ),
                &metadata(),
            )
            .set(1.0);
        let durations = Method::ALL.map(|m| {
            recorder.register_histogram(
                &Key::from_parts(DURATION, vec![Label::new("method", m.as_str())]),
                &metadata(),
            )
        });
        let inline = Algorithm::ALL.map(|algorithm| {
            Arc::new(DecisionCounters::new(
                &recorder,
                INLINE_POLICY_LABEL,
                algorithm,
            ))
        });
        // Exported at 0 from the start, so alerts on them work (and are
        // checked against a scrape) whether or not snapshots are on.
        for outcome in ["ok", "error"] {
            let _ = counter(SNAPSHOT_WRITES, vec![Label::new("outcome", outcome)]);
        }
        let _ = counter(SNAPSHOT_LOAD_FAILURES, vec![]);
        // The Redis backend's own figures, at 0 whatever the backend.
        for (name, outcome) in [
            (REDIS_CONNECTS, "ok"),
            (REDIS_CONNECTS, "error"),
            (REDIS_LATE, "refused"),
            (REDIS_LATE, "counted"),
            (LOCAL_FALLBACK, "allowed"),
            (LOCAL_FALLBACK, "denied"),
        ] {
            let _ = counter(name, vec![Label::new("outcome", outcome)]);
        }
        for to in ["open", "half_open", "closed"] {
            let _ = counter(BREAKER_TRANSITIONS, vec![Label::new("to", to)]);
        }
        let _ = counter(REDIS_CORRUPT, vec![]);
        Ok(Metrics {
            durations,
            live_keys: gauge,
            max_keys: recorder.register_gauge(&Key::from_static_name(MAX_KEYS), &metadata()),
            evictions: counter(EVICTIONS, vec![]),
            reclaimed: counter(RECLAIMED, vec![]),
            reloads_ok: counter(RELOADS, vec![Label::new("outcome", "ok")]),
            reloads_error: counter(RELOADS, vec![Label::new("outcome", "error")]),
            inline,
            inline_leases: Arc::new(LeaseCounters::new(&recorder, INLINE_POLICY_LABEL)),
            rls_reloads_ok: counter(RLS_RELOADS, vec![Label::new("outcome", "ok")]),
            rls_reloads_error: counter(RLS_RELOADS, vec![Label::new("outcome", "error")]),
            rls_rules: recorder.register_gauge(&Key::from_static_name(RLS_RULES), &metadata()),
            rls_no_limit: NoLimitReason::ALL
                .map(|r| counter(RLS_NO_LIMIT, vec![Label::new("reason", r.as_str())])),
            slots_expired: counter(SLOTS_EXPIRED, vec![]),
            slots_held_labels: std::sync::Mutex::default(),
            override_labels: std::sync::Mutex::default(),
            overrides_in_sync: {
                let g =
                    recorder.register_gauge(&Key::from_static_name(OVERRIDES_IN_SYNC), &metadata());
                g.set(1.0);
                g
            },
            recorder,
        })
    }

    /// The text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let handle = self.recorder.handle();
        handle.run_upkeep();
        handle.render()
    }

    /// Drains histogram samples into their buckets; call it regularly, or
    /// samples pile up between scrapes.
    pub(crate) fn run_upkeep(&self) {
        self.recorder.handle().run_upkeep();
    }

    /// The decision counters of a named policy.
    pub(crate) fn named_policy(&self, name: &str, algorithm: Algorithm) -> Arc<DecisionCounters> {
        if algorithm == Algorithm::Concurrency {
            // Exported from the start (at 0 until a scrape of the store
            // says otherwise), as every series is.
            let mut labels = self
                .slots_held_labels
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if labels.insert(name.to_owned()) {
                self.recorder
                    .register_gauge(
                        &Key::from_parts(SLOTS_HELD, vec![Label::new("policy", name.to_owned())]),
                        &metadata(),
                    )
                    .set(0.0);
            }
        }
        Arc::new(DecisionCounters::new(&self.recorder, name, algorithm))
    }

    /// The decision counters shared by every inline policy of `algorithm`.
    pub(crate) fn inline_policy(&self, algorithm: Algorithm) -> &Arc<DecisionCounters> {
        &self.inline[algorithm as usize]
    }

    /// Sets `quotad_overrides` to `counts` (in force, by policy and
    /// source); series no longer in it go to 0.
    pub(crate) fn overrides_in_force(
        &self,
        counts: impl IntoIterator<Item = ((String, &'static str), u64)>,
    ) {
        let mut labels = self
            .override_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let counts: std::collections::BTreeMap<_, _> = counts.into_iter().collect();
        labels.extend(counts.keys().cloned());
        for label in labels.iter() {
            let (policy, source) = label;
            #[allow(clippy::cast_precision_loss)]
            let value = counts.get(label).copied().unwrap_or(0) as f64;
            self.recorder
                .register_gauge(
                    &Key::from_parts(
                        OVERRIDES,
                        vec![
                            Label::new("policy", policy.clone()),
                            Label::new("source", *source),
                        ],
                    ),
                    &metadata(),
                )
                .set(value);
        }
    }

    /// Sets `quotad_overrides_in_sync`: whether the last read of the
    /// store's overrides succeeded.
    pub(crate) fn overrides_in_sync(&self, in_sync: bool) {
        self.overrides_in_sync.set(if in_sync { 1.0 } else { 0.0 });
    }

    /// The lease counters of a named policy.
    pub(crate) fn named_leases(&self, name: &str) -> Arc<LeaseCounters> {
        Arc::new(LeaseCounters::new(&self.recorder, name))
    }

    /// The lease counters shared by every inline policy.
    pub(crate) fn inline_leases(&self) -> &Arc<LeaseCounters> {
        &self.inline_leases
    }

    /// Records how long a request took.
    pub(crate) fn request_duration(&self, method: Method, elapsed: Duration) {
        self.durations[method.index()].record(elapsed.as_secs_f64());
    }

    /// Counts a failed request. Not on the hot path, so the handle is looked
    /// up each time.
    pub(crate) fn request_error(&self, method: Method, code: tonic::Code) {
        let labels = vec![
            Label::new("method", method.as_str()),
            Label::new("code", format!("{code:?}")),
        ];
        register_counter(&self.recorder, REQUEST_ERRORS, labels).increment(1);
    }

    /// A counter of `op` calls to the store `backend`.
    pub(crate) fn store_operation(&self, backend: &'static str, op: &'static str) -> Counter {
        let labels = vec![Label::new("backend", backend), Label::new("op", op)];
        register_counter(&self.recorder, STORE_OPERATIONS, labels)
    }

    /// A counter of the connections refused on `port` because it was full.
    pub(crate) fn connections_rejected(&self, port: &'static str) -> Counter {
        register_counter(
            &self.recorder,
            CONNECTIONS_REJECTED,
            vec![Label::new("port", port)],
        )
    }

    /// A counter of the gRPC calls shed at `transport.max_in_flight`.
    pub(crate) fn calls_shed(&self) -> Counter {
        register_counter(&self.recorder, CALLS_SHED, vec![])
    }

    /// A counter of the calls of the `[auth]` group `group` denied.
    pub(crate) fn auth_denied(&self, group: AuthGroup) -> Counter {
        register_counter(
            &self.recorder,
            AUTH_DENIED,
            vec![Label::new("method", group.setting())],
        )
    }

    /// Counts a policy reload.
    pub(crate) fn policy_reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.increment(1);
        } else {
            self.reloads_error.increment(1);
        }
    }

    /// A snapshot written in `elapsed`, `bytes` long, at `at` (since the
    /// Unix epoch).
    pub(crate) fn snapshot_written(&self, elapsed: Duration, bytes: u64, at: Duration) {
        let recorder = &self.recorder;
        let gauge =
            |name: &'static str| recorder.register_gauge(&Key::from_static_name(name), &metadata());
        gauge(SNAPSHOT_SECONDS).set(elapsed.as_secs_f64());
        gauge(SNAPSHOT_BYTES).set(bytes as f64);
        gauge(SNAPSHOT_TIMESTAMP).set(at.as_secs_f64());
        register_counter(recorder, SNAPSHOT_WRITES, vec![Label::new("outcome", "ok")]).increment(1);
    }

    /// A snapshot that could not be written.
    pub(crate) fn snapshot_failed(&self) {
        register_counter(
            &self.recorder,
            SNAPSHOT_WRITES,
            vec![Label::new("outcome", "error")],
        )
        .increment(1);
    }

    /// What a snapshot load did with its entries, by outcome.
    pub(crate) fn snapshot_loaded(&self, counts: &[(&'static str, u64)]) {
        for &(outcome, count) in counts {
            register_counter(
                &self.recorder,
                SNAPSHOT_LOADED,
                vec![Label::new("outcome", outcome)],
            )
            .increment(count);
        }
    }

    /// A snapshot that could not be read, replaced by an empty store.
    pub(crate) fn snapshot_load_failed(&self) {
        register_counter(&self.recorder, SNAPSHOT_LOAD_FAILURES, vec![]).increment(1);
    }

    /// The counters of one RLS rule (or of the limits Envoy sends for one
    /// domain and unit), labelled with its state namespace.
    pub(crate) fn rls_rule(&self, namespace: &str, algorithm: Algorithm) -> RlsRuleCounters {
        RlsRuleCounters {
            decisions: DecisionCounters::new(&self.recorder, namespace, algorithm),
            shadow: OnceLock::new(),
        }
    }

    /// Counts an RLS rules reload, and the rules in force after it.
    pub(crate) fn rls_reload(&self, ok: bool, rules: usize) {
        if ok {
            self.rls_reloads_ok.increment(1);
        } else {
            self.rls_reloads_error.increment(1);
        }
        self.rls_rules.set(rules as f64);
    }

    /// Sets the number of RLS rules in force.
    pub(crate) fn rls_rules(&self, rules: usize) {
        self.rls_rules.set(rules as f64);
    }

    /// Counts an RLS descriptor that had no limit to check.
    pub(crate) fn rls_no_limit(&self, reason: NoLimitReason) {
        self.rls_no_limit[reason as usize].increment(1);
    }

    /// Publishes the store's counts (read when `/metrics` is scraped).
    pub(crate) fn store_stats(&self, stats: BackendStats) {
        if let Some(live) = stats.live_keys {
            self.live_keys.set(live as f64);
        }
        if let Some(capacity) = stats.capacity {
            self.max_keys.set(capacity as f64);
        }
        self.evictions.absolute(stats.evictions);
        self.reclaimed.absolute(stats.reclaimed);
        self.slots_expired.absolute(stats.slots_expired);
        if let Some(held) = stats.slots_held {
            // By policy label: every inline policy's namespace is `inline`.
            let mut by_label: std::collections::BTreeMap<String, u64> = Default::default();
            for (name, units) in held {
                let label = if name.starts_with("inline:") {
                    INLINE_POLICY_LABEL.to_owned()
                } else {
                    name
                };
                *by_label.entry(label).or_default() += units;
            }
            let mut labels = self
                .slots_held_labels
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            labels.extend(by_label.keys().cloned());
            for label in labels.iter() {
                let units = by_label.get(label).copied().unwrap_or(0);
                self.recorder
                    .register_gauge(
                        &Key::from_parts(SLOTS_HELD, vec![Label::new("policy", label.clone())]),
                        &metadata(),
                    )
                    .set(units as f64);
            }
        }
        if let Some(state) = stats.breaker_state {
            self.recorder
                .register_gauge(&Key::from_static_name(BREAKER_STATE), &metadata())
                .set(state as f64);
        }
        // Not the hot path: each figure's handle is looked up per scrape.
        for figure in stats.figures {
            let labels = figure.labels.iter().map(|&(k, v)| Label::new(k, v));
            register_counter(&self.recorder, figure.name, labels.collect()).absolute(figure.value);
        }
    }
}

/// `quotad_decisions_total` for one policy label and algorithm, registered
/// lazily per (reason, outcome) so that only combinations that happen are
/// exported.
#[derive(Debug)]
pub(crate) struct DecisionCounters {
    recorder: Arc<PrometheusRecorder>,
    policy: String,
    algorithm: Algorithm,
    /// Indexed by reason, then by `allowed`.
    slots: [[OnceLock<Counter>; 2]; Reason::ALL.len()],
}

impl DecisionCounters {
    fn new(recorder: &Arc<PrometheusRecorder>, policy: &str, algorithm: Algorithm) -> Self {
        DecisionCounters {
            recorder: Arc::clone(recorder),
            policy: policy.to_owned(),
            algorithm,
            slots: Default::default(),
        }
    }

    /// Counts one decision.
    pub(crate) fn record(&self, decision: &Decision) {
        self.counter(decision.reason, decision.allowed).increment(1);
    }

    /// Counts the decisions of `tally`: one increment per reason and
    /// outcome it holds, however many decisions share them.
    pub(crate) fn record_tally(&self, tally: &DecisionTally) {
        for (reason, by_outcome) in Reason::ALL.into_iter().zip(&tally.counts) {
            for (allowed, &count) in [false, true].into_iter().zip(by_outcome) {
                if count > 0 {
                    self.counter(reason, allowed).increment(count);
                }
            }
        }
    }

    fn counter(&self, reason: Reason, allowed: bool) -> &Counter {
        self.slots[reason as usize][usize::from(allowed)].get_or_init(|| {
            let outcome = if allowed { "allowed" } else { "denied" };
            let labels = vec![
                Label::new("policy", self.policy.clone()),
                Label::new("algorithm", self.algorithm.as_str()),
                Label::new("outcome", outcome),
                Label::new("reason", reason.as_str()),
            ];
            register_counter(&self.recorder, DECISIONS, labels)
        })
    }
}

/// Decisions counted locally, by reason and outcome, before they reach
/// the shared [`DecisionCounters`]: a batch whose items share a policy
/// touches each counter once, not once per item.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DecisionTally {
    /// Indexed by reason, then by `allowed`.
    counts: [[u64; 2]; Reason::ALL.len()],
}

impl DecisionTally {
    /// Counts one decision.
    pub(crate) fn add(&mut self, decision: &Decision) {
        self.counts[decision.reason as usize][usize::from(decision.allowed)] += 1;
    }
}

/// What became of a lease request, as the `outcome` label of
/// `quotad_leases_total`. A request that settles a lease and asks for a
/// new one counts twice: what became of the old one, then of the new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseEvent {
    /// A lease was granted.
    Granted,
    /// A lease was asked for and the answer was direct.
    Direct,
    /// A live lease was settled; its unspent units went back.
    Returned,
    /// The lease settled had ended: nothing went back.
    Ended,
    /// The store refused the request (an unknown or overspent lease) or
    /// failed: nothing was granted or settled.
    Refused,
}

impl LeaseEvent {
    const ALL: [LeaseEvent; 5] = [
        LeaseEvent::Granted,
        LeaseEvent::Direct,
        LeaseEvent::Returned,
        LeaseEvent::Ended,
        LeaseEvent::Refused,
    ];

    fn as_str(self) -> &'static str {
        match self {
            LeaseEvent::Granted => "granted",
            LeaseEvent::Direct => "direct",
            LeaseEvent::Returned => "returned",
            LeaseEvent::Ended => "ended",
            LeaseEvent::Refused => "refused",
        }
    }
}

/// `quotad_leases_total` and the lease units counters of one policy label,
/// registered lazily so that only what happens is exported.
#[derive(Debug)]
pub(crate) struct LeaseCounters {
    recorder: Arc<PrometheusRecorder>,
    policy: String,
    events: [OnceLock<Counter>; LeaseEvent::ALL.len()],
    units_granted: OnceLock<Counter>,
    units_returned: OnceLock<Counter>,
}

impl LeaseCounters {
    fn new(recorder: &Arc<PrometheusRecorder>, policy: &str) -> Self {
        LeaseCounters {
            recorder: Arc::clone(recorder),
            policy: policy.to_owned(),
            events: Default::default(),
            units_granted: OnceLock::new(),
            units_returned: OnceLock::new(),
        }
    }

    /// Counts one `event`.
    pub(crate) fn record(&self, event: LeaseEvent) {
        self.events[event as usize]
            .get_or_init(|| {
                let labels = vec![
                    Label::new("policy", self.policy.clone()),
                    Label::new("outcome", event.as_str()),
                ];
                register_counter(&self.recorder, LEASES, labels)
            })
            .increment(1);
    }

    /// Counts `units` granted in a lease.
    pub(crate) fn granted_units(&self, units: u64) {
        self.units(&self.units_granted, LEASE_UNITS_GRANTED)
            .increment(units);
    }

    /// Counts `units` given back by a settled lease.
    pub(crate) fn returned_units(&self, units: u64) {
        self.units(&self.units_returned, LEASE_UNITS_RETURNED)
            .increment(units);
    }

    fn units<'a>(&'a self, slot: &'a OnceLock<Counter>, name: &'static str) -> &'a Counter {
        slot.get_or_init(|| {
            let labels = vec![Label::new("policy", self.policy.clone())];
            register_counter(&self.recorder, name, labels)
        })
    }
}

/// One RLS rule's counters: its decisions, and the denials its shadow mode
/// (or the server's) let through.
#[derive(Debug)]
pub(crate) struct RlsRuleCounters {
    pub(crate) decisions: DecisionCounters,
    shadow: OnceLock<Counter>,
}

impl RlsRuleCounters {
    /// Counts one over-limit answer that shadow mode turned into OK.
    pub(crate) fn shadow_denial(&self) {
        self.shadow
            .get_or_init(|| {
                let labels = vec![Label::new("policy", self.decisions.policy.clone())];
                register_counter(&self.decisions.recorder, RLS_SHADOW, labels)
            })
            .increment(1);
    }
}

fn metadata() -> Metadata<'static> {
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()))
}

fn register_counter(
    recorder: &PrometheusRecorder,
    name: &'static str,
    labels: Vec<Label>,
) -> Counter {
    recorder.register_counter(&Key::from_parts(name, labels), &metadata())
}

fn describe(recorder: &PrometheusRecorder) {
    let counters = [
        (
            SLOTS_EXPIRED,
            "Concurrency slots that ended without being released (their holder died, hung or stopped renewing): a leak signal.",
        ),
        (
            DECISIONS,
            "Decisions made, by policy name (or \"inline\"), algorithm, outcome and reason.",
        ),
        (
            REQUEST_ERRORS,
            "Requests that failed with a gRPC error, by method and status code.",
        ),
        (
            STORE_OPERATIONS,
            "Calls to the state store, by backend and operation.",
        ),
        (
            EVICTIONS,
            "Live keys evicted to make room for new ones (their budgets started over).",
        ),
        (
            RECLAIMED,
            "Keys dropped because their state had become equivalent to fresh.",
        ),
        (
            RELOADS,
            "Policy reloads, by outcome (an error keeps the previous policies).",
        ),
        (
            SNAPSHOT_WRITES,
            "Snapshots of the memory store written, by outcome (an error keeps the previous file).",
        ),
        (
            SNAPSHOT_LOADED,
            "Entries of the snapshot loaded at start, by outcome (policy_removed and policy_changed are loaded too, and reconciled as after a reload).",
        ),
        (
            SNAPSHOT_LOAD_FAILURES,
            "Snapshots that could not be read at start, replaced by an empty store.",
        ),
        (
            REDIS_CONNECTS,
            "Connection attempts to a standalone Redis, by outcome.",
        ),
        (
            REDIS_LATE,
            "Scripts Redis received after quotad had answered their call as failed: refused (nothing counted) or counted (ran in time, reply late).",
        ),
        (
            REDIS_CORRUPT,
            "Redis calls that found a quotad key holding state the script cannot read (answered INTERNAL).",
        ),
        (
            AUTH_DENIED,
            "Calls denied by [auth] (PERMISSION_DENIED), by method group.",
        ),
        (
            CONNECTIONS_REJECTED,
            "Connections closed as soon as accepted because the port held transport.max_connections, by port.",
        ),
        (
            CALLS_SHED,
            "gRPC calls refused with UNAVAILABLE at once because transport.max_in_flight calls were in progress.",
        ),
        (
            LOCAL_FALLBACK,
            "Decisions made by this replica alone, from its own memory with its share of the limit, while the store was down (on_error = \"local\"), by outcome.",
        ),
        (
            BREAKER_TRANSITIONS,
            "Transitions of the local fallback's breaker, by the state entered: open (a store call failed; falling-back calls are decided locally, none sent), half_open (one probe of the store), closed (the probe answered).",
        ),
        (
            RLS_RELOADS,
            "RLS rules reloads, by outcome (an error keeps the previous rules).",
        ),
        (
            RLS_SHADOW,
            "RLS descriptors over their limit that shadow mode answered OK, by rule.",
        ),
        (
            RLS_NO_LIMIT,
            "RLS descriptors with no limit to check, by reason (unknown_domain, no_match, replaced, unlimited).",
        ),
        (
            LEASES,
            "Lease requests, by policy name (or \"inline\") and outcome: granted or direct for a lease asked for, returned or ended for one settled, refused when nothing happened (an unknown or overspent lease, a store failure).",
        ),
        (
            LEASE_UNITS_GRANTED,
            "Units granted in leases (charged to their key's budget when granted), by policy name (or \"inline\").",
        ),
        (
            LEASE_UNITS_RETURNED,
            "Unspent lease units given back to their key's budget when settled, by policy name (or \"inline\").",
        ),
    ];
    for (name, help) in counters {
        recorder.describe_counter(name.into(), None, help.into());
    }
    for (name, help) in [
        (
            SNAPSHOT_SECONDS,
            "Time the last snapshot took to write, in seconds.",
        ),
        (
            SNAPSHOT_BYTES,
            "Size of the last snapshot written, in bytes.",
        ),
        (
            SNAPSHOT_TIMESTAMP,
            "When the last snapshot was written, in seconds since the Unix epoch.",
        ),
    ] {
        recorder.describe_gauge(name.into(), None, help.into());
    }
    recorder.describe_gauge(
        SLOTS_HELD.into(),
        None,
        "Units held by live concurrency slots, by policy name (or \"inline\"); memory store only."
            .into(),
    );
    recorder.describe_gauge(
        LIVE_KEYS.into(),
        None,
        "Keys holding state in the store.".into(),
    );
    recorder.describe_gauge(
        MAX_KEYS.into(),
        None,
        "The most keys the memory store holds (store.max_keys); live keys against it is how full the store is.".into(),
    );
    recorder.describe_gauge(
        BUILD_INFO.into(),
        None,
        "Always 1; the version label says which quotad is running.".into(),
    );
    recorder.describe_gauge(
        OVERRIDES.into(),
        None,
        "Overrides in force, by policy name and source (file or runtime).".into(),
    );
    recorder.describe_gauge(
        OVERRIDES_IN_SYNC.into(),
        None,
        "1 when the last read of the store's overrides succeeded; 0 while this replica serves the last set it read.".into(),
    );
    recorder.describe_gauge(
        BREAKER_STATE.into(),
        None,
        "The local fallback's breaker: 0 closed (calls go to the store), 1 open (on_error = \"local\" calls decided locally at once), 2 half-open (one probe under way).".into(),
    );
    recorder.describe_gauge(
        RLS_RULES.into(),
        None,
        "RLS rules in force (unlimited ones included).".into(),
    );
    recorder.describe_histogram(
        DURATION.into(),
        Some(metrics::Unit::Seconds),
        "Time to handle a request, from decoded request to response, by method.".into(),
    );
}

/// Counts a backend reports for the metrics; `None` where it cannot know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Keys holding state now.
    pub live_keys: Option<u64>,
    /// Live keys evicted to make room, since start.
    pub evictions: u64,
    /// Keys dropped because their state had become fresh, since start.
    pub reclaimed: u64,
    /// The most keys the store holds (the memory store's `max_keys`).
    pub capacity: Option<u64>,
    /// What only this backend counts (a Redis backend's connections and
    /// late scripts), named by the backend itself.
    pub figures: Vec<Figure>,
    /// Units held by live concurrency slots, by policy namespace, when the
    /// backend can tell cheaply (the memory store; not Redis, which would
    /// have to scan its keys).
    pub slots_held: Option<Vec<(String, u64)>>,
    /// Concurrency slots dropped because they ended unreleased, since
    /// start.
    pub slots_expired: u64,
    /// The local fallback's breaker state, as its gauge value, where there
    /// is one (`crate::backend::breaker::State::gauge`).
    pub breaker_state: Option<u64>,
}

/// One count of a backend's own, since start: a counter series named by
/// the backend, which the metrics exporter renders as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    /// The series' name (e.g. `quotad_redis_late_scripts_total`).
    pub name: &'static str,
    /// The series' labels, as `(name, value)` pairs.
    pub labels: &'static [(&'static str, &'static str)],
    /// The count.
    pub value: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, reason: Reason) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            reason,
        }
    }

    #[test]
    fn counts_decisions_by_policy_algorithm_outcome_and_reason() {
        let metrics = Metrics::new().expect("metrics");
        let api = metrics.named_policy("api", Algorithm::FixedWindow);
        api.record(&decision(true, Reason::WithinLimit));
        api.record(&decision(true, Reason::WithinLimit));
        api.record(&decision(false, Reason::LimitExceeded));
        metrics
            .inline_policy(Algorithm::TokenBucket)
            .record(&decision(false, Reason::CostExceedsCapacity));
        let text = metrics.render();
        assert!(text.contains(
            r#"quotad_decisions_total{policy="api",algorithm="fixed_window",outcome="allowed",reason="within_limit"} 2"#
        ), "{text}");
        assert!(text.contains(
            r#"quotad_decisions_total{policy="api",algorithm="fixed_window",outcome="denied",reason="limit_exceeded"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"quotad_decisions_total{policy="inline",algorithm="token_bucket",outcome="denied",reason="cost_exceeds_capacity"} 1"#
        ), "{text}");
        assert!(text.contains("# HELP quotad_decisions_total"), "{text}");
    }

    #[test]
    fn a_tally_counts_the_same_as_recording_each_decision() {
        let metrics = Metrics::new().expect("metrics");
        let one_by_one = metrics.named_policy("each", Algorithm::SlidingWindow);
        let tallied = metrics.named_policy("tally", Algorithm::SlidingWindow);
        let decisions = [
            decision(true, Reason::WithinLimit),
            decision(false, Reason::LimitExceeded),
            decision(true, Reason::WithinLimit),
            decision(false, Reason::Capacity),
            decision(true, Reason::FailOpen),
            decision(true, Reason::WithinLimit),
        ];
        let mut tally = DecisionTally::default();
        for d in &decisions {
            one_by_one.record(d);
            tally.add(d);
        }
        tallied.record_tally(&tally);
        tallied.record_tally(&DecisionTally::default());
        let text = metrics.render();
        let series = |policy: &str| {
            let mut lines: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{DECISIONS}{{policy=\"{policy}\"")))
                .map(|l| l.replacen(policy, "P", 1))
                .collect();
            lines.sort();
            lines
        };
        assert_eq!(series("each").len(), 4, "{text}");
        assert_eq!(series("each"), series("tally"));
        assert!(text.contains(
            r#"quotad_decisions_total{policy="tally",algorithm="sliding_window",outcome="allowed",reason="within_limit"} 3"#
        ), "{text}");
    }

    #[test]
    fn exports_the_build_and_the_store_capacity() {
        let metrics = Metrics::new().expect("metrics");
        metrics.store_stats(BackendStats {
            live_keys: Some(3),
            capacity: Some(1_000),
            ..BackendStats::default()
        });
        let text = metrics.render();
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            text.contains(&format!("quotad_build_info{{version=\"{version}\"}} 1")),
            "{text}"
        );
        assert!(text.contains("quotad_max_keys 1000"), "{text}");
        assert!(text.contains("quotad_live_keys 3"), "{text}");
    }

    #[test]
    fn renders_a_backends_figures_under_the_series_declared_here() {
        let metrics = Metrics::new().expect("metrics");
        let quiet = metrics.render();
        let counts = crate::backend::redis::RedisCounts {
            late_counted: 2,
            ..Default::default()
        };
        for figure in counts.figures() {
            assert!(
                quiet.contains(&format!("# HELP {} ", figure.name)),
                "{quiet}"
            );
        }
        metrics.store_stats(BackendStats {
            figures: counts.figures(),
            ..BackendStats::default()
        });
        let text = metrics.render();
        assert!(
            text.contains(r#"quotad_redis_late_scripts_total{outcome="counted"} 2"#),
            "{text}"
        );
        assert!(
            text.contains("quotad_redis_corrupt_state_total 0"),
            "{text}"
        );
    }

    #[test]
    fn counts_lease_outcomes_and_units_by_policy() {
        let metrics = Metrics::new().expect("metrics");
        let api = metrics.named_leases("api");
        api.record(LeaseEvent::Granted);
        api.record(LeaseEvent::Granted);
        api.granted_units(40);
        api.record(LeaseEvent::Returned);
        api.returned_units(7);
        metrics.inline_leases().record(LeaseEvent::Direct);
        let text = metrics.render();
        for line in [
            r#"quotad_leases_total{policy="api",outcome="granted"} 2"#,
            r#"quotad_leases_total{policy="api",outcome="returned"} 1"#,
            r#"quotad_leases_total{policy="inline",outcome="direct"} 1"#,
            r#"quotad_lease_units_granted_total{policy="api"} 40"#,
            r#"quotad_lease_units_returned_total{policy="api"} 7"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(
            !text.contains(r#"quotad_leases_total{policy="api",outcome="refused"}"#),
            "only what happened is exported: {text}"
        );
    }

    #[test]
    fn two_registries_do_not_share_counts() {
        let a = Metrics::new().expect("metrics");
        let b = Metrics::new().expect("metrics");
        a.policy_reload(true);
        assert!(
            a.render()
                .contains(r#"quotad_policy_reloads_total{outcome="ok"} 1"#)
        );
        assert!(
            b.render()
                .contains(r#"quotad_policy_reloads_total{outcome="ok"} 0"#)
        );
    }

    #[test]
    fn renders_the_duration_histogram_with_buckets() {
        let metrics = Metrics::new().expect("metrics");
        metrics.request_duration(Method::Check, Duration::from_micros(30));
        let text = metrics.render();
        assert!(
            text.contains(
                r#"quotad_decision_duration_seconds_bucket{method="check",le="0.00005"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"quotad_decision_duration_seconds_bucket{method="check",le="0.00001"} 0"#
            ),
            "{text}"
        );
    }
}
