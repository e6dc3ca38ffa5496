//! What a load run does: the requests, how hard, and for how long.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::v1::{Algorithm, Policy, check_request};
use rand::Rng as _;

use crate::keys::KeyDistribution;

/// The longest a run may last, warmup included; a run bounded only by a
/// request count stops at this point too.
pub const MAX_DURATION: Duration = Duration::from_secs(300);

/// The longest a request may wait for its answer.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// The highest paced rate, in requests per second.
const MAX_RATE: f64 = 10_000_000.0;

/// The most requests a run may keep in flight.
const MAX_CONCURRENCY: usize = 1_024;

/// Which RPC a run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One `Check` per request.
    Unary,
    /// One `CheckBatch` of `size` independent items per request.
    Batch {
        /// Items per batch, 1 to 1,000.
        size: usize,
    },
    /// One Envoy `ShouldRateLimit` per request, with `descriptors`
    /// descriptors: descriptor `i` holds the one entry `d<i>` = a key drawn
    /// from the distribution.
    Rls {
        /// Descriptors per request, 1 to 1,000.
        descriptors: usize,
    },
    /// One check per request through `quotad-client`, as an application
    /// makes them: every worker is a caller of one shared client, which
    /// sends concurrent checks as one `CheckBatch` (`coalescing`) and
    /// answers `LIMIT_EXCEEDED` denials locally until their retry time
    /// (`deny_cache`), and admits from leases of budget it holds
    /// (`lease_want`), as configured.
    Client {
        /// Whether the client coalesces concurrent checks.
        coalescing: bool,
        /// Whether the client keeps a deny cache.
        deny_cache: bool,
        /// Leases on, asking for up to this many units each; `None` sends
        /// every check to quotad (the policy needs lease settings for
        /// leases to be granted; without them every check is sent too).
        lease_want: Option<u64>,
    },
}

impl Mode {
    /// Items decided per request.
    pub(crate) fn items(self) -> usize {
        match self {
            Self::Unary | Self::Client { .. } => 1,
            Self::Batch { size } => size,
            Self::Rls { descriptors } => descriptors,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unary => f.write_str("unary"),
            Self::Batch { size } => write!(f, "batch:{size}"),
            Self::Rls { descriptors } => write!(f, "rls:{descriptors}"),
            Self::Client {
                coalescing,
                deny_cache,
                lease_want,
            } => {
                let on = |b: bool| if b { "on" } else { "off" };
                write!(
                    f,
                    "client:coalescing={},deny_cache={}",
                    on(*coalescing),
                    on(*deny_cache)
                )?;
                match lease_want {
                    Some(want) => write!(f, ",leases={want}"),
                    None => f.write_str(",leases=off"),
                }
            }
        }
    }
}

/// The policy every check names or carries.
///
/// Parses from `ALGORITHM:LIMIT:WINDOW_MS[:BURST]` as an inline policy, for
/// example `fixed_window:100:60000` or `token_bucket:10:1000:20`; a named
/// policy is built with [`PolicySpec::Named`].
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySpec {
    /// A policy in the server's configuration, by name.
    Named(String),
    /// A policy sent with every check.
    Inline(Policy),
}

impl PolicySpec {
    /// The `policy` field of every check.
    pub(crate) fn to_proto(&self) -> check_request::Policy {
        match self {
            Self::Named(name) => check_request::Policy::PolicyName(name.clone()),
            Self::Inline(policy) => check_request::Policy::InlinePolicy(policy.clone()),
        }
    }
}

impl PolicySpec {
    /// The policy of a check through quotad-client ([`Mode::Client`]).
    pub(crate) fn to_client(&self) -> Result<quotad_client::PolicyRef, ConfigError> {
        match self {
            Self::Named(name) => Ok(quotad_client::PolicyRef::Named(name.clone())),
            Self::Inline(policy) => {
                let bad = || ConfigError::InlinePolicy(self.to_string());
                let algorithm =
                    quotad_proto::convert::algorithm(policy.algorithm).map_err(|_| bad())?;
                quotad_core::Policy::try_new(
                    algorithm,
                    policy.limit,
                    Duration::from_millis(policy.window_ms),
                    policy.burst,
                )
                .map(quotad_client::PolicyRef::Inline)
                .map_err(|_| bad())
            }
        }
    }
}

impl FromStr for PolicySpec {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::InlinePolicy(text.to_owned());
        let number = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let parts: Vec<&str> = text.split(':').collect();
        let (algorithm, limit, window, burst) = match parts.as_slice() {
            [a, l, w] => (*a, number(l)?, number(w)?, None),
            [a, l, w, b] => (*a, number(l)?, number(w)?, Some(number(b)?)),
            _ => return Err(bad()),
        };
        let algorithm = match algorithm {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window" => Algorithm::SlidingWindow,
            "token_bucket" => Algorithm::TokenBucket,
            "leaky_bucket" => Algorithm::LeakyBucket,
            "sliding_log" => Algorithm::SlidingLog,
            _ => return Err(bad()),
        };
        // The server validates the rest and answers INVALID_ARGUMENT, which
        // the report counts; catching the obvious here saves a wasted run.
        if limit == 0 || window == 0 || burst == Some(0) {
            return Err(bad());
        }
        Ok(Self::Inline(Policy {
            algorithm: algorithm.into(),
            limit,
            window_ms: window,
            burst,
            ..Policy::default()
        }))
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Named(name) => f.write_str(name),
            Self::Inline(policy) => {
                let algorithm = match policy.algorithm() {
                    Algorithm::FixedWindow => "fixed_window",
                    Algorithm::SlidingWindow => "sliding_window",
                    Algorithm::TokenBucket => "token_bucket",
                    Algorithm::LeakyBucket => "leaky_bucket",
                    Algorithm::SlidingLog => "sliding_log",
                    Algorithm::Concurrency => "concurrency",
                    Algorithm::Unspecified => "unspecified",
                };
                write!(f, "{algorithm}:{}:{}", policy.limit, policy.window_ms)?;
                match policy.burst {
                    Some(burst) => write!(f, ":{burst}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A load run that cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An inline policy not written as `ALGORITHM:LIMIT:WINDOW_MS[:BURST]`.
    #[error(
        "inline policy must be ALGORITHM:LIMIT:WINDOW_MS[:BURST] with a known algorithm and \
         nonzero numbers, got {0:?}"
    )]
    InlinePolicy(String),
    /// A setting out of its range; the message names it.
    #[error("{0}")]
    Invalid(String),
}

/// Everything a load run needs. [`LoadConfig::new`] fills in defaults;
/// [`crate::run`] checks the whole before sending anything.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The server, as `http://HOST:PORT` or `unix:///path/to.sock`.
    pub target: String,
    /// Requests in flight at once (closed loop), or the most in flight
    /// (with `rate`): 1 to 1,024. Each worker keeps its own latency
    /// histogram (~220 KB), so the hot path shares nothing.
    pub concurrency: usize,
    /// Distinct HTTP/2 connections; requests go to them round-robin. 1 to
    /// `concurrency`. In [`Mode::Client`], the number of clients (each with
    /// its own connection, coalescing queue and deny cache); worker `w`
    /// calls client `w % connections`.
    pub connections: usize,
    /// `Check` or `CheckBatch`.
    pub mode: Mode,
    /// The keys checked.
    pub keys: KeyDistribution,
    /// Prepended to every key, so runs do not share state unless asked to.
    pub key_prefix: String,
    /// The policy every check names or carries (unused by `Mode::Rls`).
    pub policy: PolicySpec,
    /// The domain of every `ShouldRateLimit` (`Mode::Rls`).
    pub domain: String,
    /// The cost of every check; `None` sends no cost (the server takes 1).
    pub cost: Option<u64>,
    /// How long to measure, after the warmup; at most [`MAX_DURATION`].
    pub duration: Option<Duration>,
    /// How many requests to measure, after the warmup.
    pub requests: Option<u64>,
    /// Traffic sent before measuring starts, and left out of the report.
    pub warmup: Duration,
    /// Open loop: send this many requests per second on a fixed schedule
    /// and measure latency from each request's scheduled send time (or its
    /// actual send, if that was earlier), so a slow server cannot hide its
    /// queueing (no coordinated omission).
    /// `None` is a closed loop: each of `concurrency` workers sends its next
    /// request when the last one is answered.
    pub rate: Option<f64>,
    /// The client-side deadline of each request.
    pub timeout: Duration,
    /// Seeds the key draws, so a run can be repeated exactly.
    pub seed: u64,
    /// [`Mode::Client`] with coalescing: the requests each client keeps in
    /// flight before checks queue for a batch (1 to 1,024); fewer slots
    /// make larger batches.
    pub max_in_flight: usize,
}

impl LoadConfig {
    /// A 10-second closed-loop run of unary checks on one hot key with 16
    /// in flight over one connection, with a fresh random key prefix.
    pub fn new(target: impl Into<String>, policy: PolicySpec) -> Self {
        let run_id: u32 = rand::rng().random();
        Self {
            target: target.into(),
            concurrency: 16,
            connections: 1,
            mode: Mode::Unary,
            keys: KeyDistribution::Hot,
            key_prefix: format!("lg{run_id:08x}:"),
            policy,
            domain: "bench".to_owned(),
            cost: None,
            duration: Some(Duration::from_secs(10)),
            requests: None,
            warmup: Duration::ZERO,
            rate: None,
            timeout: Duration::from_secs(5),
            seed: 0,
            max_in_flight: quotad_client::DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Checks every setting against its range.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the first setting out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        let unix_path = self.target.strip_prefix("unix://");
        if !(self.target.starts_with("http://") || unix_path.is_some_and(|p| !p.is_empty())) {
            return invalid(format!(
                "target must be http://HOST:PORT or unix:///PATH, got {:?}",
                self.target
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return invalid(format!(
                "concurrency must be from 1 to {MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if !(1..=self.concurrency).contains(&self.connections) {
            return invalid(format!(
                "connections must be from 1 to the concurrency ({}), got {}",
                self.concurrency, self.connections
            ));
        }
        if let Mode::Batch { size } = self.mode
            && !(1..=MAX_BATCH_ITEMS).contains(&size)
        {
            return invalid(format!(
                "batch size must be from 1 to {MAX_BATCH_ITEMS}, got {size}"
            ));
        }
        if let Mode::Rls { descriptors } = self.mode
            && !(1..=MAX_BATCH_ITEMS).contains(&descriptors)
        {
            return invalid(format!(
                "descriptors must be from 1 to {MAX_BATCH_ITEMS}, got {descriptors}"
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.max_in_flight) {
            return invalid(format!(
                "max in flight must be from 1 to {MAX_CONCURRENCY}, got {}",
                self.max_in_flight
            ));
        }
        if let Mode::Client {
            lease_want: Some(want),
            ..
        } = self.mode
            && let Err(error) = quotad_client::LeaseOptions::try_new(want)
        {
            return invalid(error.to_string());
        }
        if self.cost == Some(0) {
            return invalid("cost must be at least 1".to_owned());
        }
        match (self.duration, self.requests) {
            (None, None) => {
                return invalid("a run needs a duration, a request count or both".to_owned());
            }
            (_, Some(0)) => return invalid("requests must be at least 1".to_owned()),
            (Some(d), _) if d.is_zero() => {
                return invalid("duration must be more than 0".to_owned());
            }
            _ => {}
        }
        let total = self.warmup + self.duration.unwrap_or_default();
        if total > MAX_DURATION {
            return invalid(format!(
                "warmup + duration must be at most {} s, got {:.1} s",
                MAX_DURATION.as_secs(),
                total.as_secs_f64()
            ));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return invalid(format!(
                "timeout must be more than 0 and at most {} s",
                MAX_TIMEOUT.as_secs()
            ));
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && (1.0..=MAX_RATE).contains(&rate))
        {
            return invalid(format!(
                "rate must be from 1 to {MAX_RATE} requests/s, got {rate}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoadConfig {
        LoadConfig::new("http://127.0.0.1:1", PolicySpec::Named("api".to_owned()))
    }

    #[test]
    fn parses_inline_policies_with_and_without_burst() {
        let fixed: PolicySpec = "fixed_window:100:60000".parse().expect("valid");
        assert_eq!(
            fixed,
            PolicySpec::Inline(Policy {
                algorithm: Algorithm::FixedWindow.into(),
                limit: 100,
                window_ms: 60_000,
                burst: None,
                ..Policy::default()
            })
        );
        assert_eq!(fixed.to_string(), "fixed_window:100:60000");
        let bucket: PolicySpec = "token_bucket:10:1000:20".parse().expect("valid");
        assert_eq!(bucket.to_string(), "token_bucket:10:1000:20");
    }

    #[test]
    fn rejects_malformed_inline_policies() {
        for text in [
            "fixed_window:100",
            "fixed:1:1",
            "fixed_window:0:1000",
            "fixed_window:1:0",
            "token_bucket:1:1:0",
            "fixed_window:a:1",
        ] {
            assert!(text.parse::<PolicySpec>().is_err(), "{text}");
        }
    }

    fn lease_mode(want: u64) -> Mode {
        Mode::Client {
            coalescing: false,
            deny_cache: false,
            lease_want: Some(want),
        }
    }

    #[test]
    fn lease_modes_name_their_want() {
        assert_eq!(
            lease_mode(500).to_string(),
            "client:coalescing=off,deny_cache=off,leases=500"
        );
        let mut c = config();
        c.mode = lease_mode(500);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn unix_socket_targets_are_valid() {
        let mut c = config();
        c.target = "unix:///run/quotad/grpc.sock".to_owned();
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn a_run_must_be_bounded() {
        let mut c = config();
        c.duration = None;
        assert!(c.validate().is_err());
        c.requests = Some(10);
        assert_eq!(c.validate(), Ok(()));
        c.duration = Some(Duration::from_secs(301));
        assert!(c.validate().is_err());
        c.duration = Some(Duration::from_secs(290));
        c.warmup = Duration::from_secs(20);
        assert!(c.validate().is_err());
    }

    #[test]
    fn rejects_settings_out_of_range() {
        let cases: [fn(&mut LoadConfig); 12] = [
            |c| c.concurrency = 0,
            |c| c.connections = 17,
            |c| c.mode = Mode::Batch { size: 1001 },
            |c| c.mode = Mode::Rls { descriptors: 0 },
            |c| c.cost = Some(0),
            |c| c.rate = Some(0.0),
            |c| c.rate = Some(f64::NAN),
            |c| c.target = "127.0.0.1:1".to_owned(),
            |c| c.target = "unix://".to_owned(),
            |c| c.max_in_flight = 0,
            |c| c.mode = lease_mode(0),
            |c| c.mode = lease_mode(quotad_client::MAX_LEASE_WANT + 1),
        ];
        for change in cases {
            let mut c = config();
            change(&mut c);
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
