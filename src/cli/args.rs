//! What every client command takes: where quotad is and how to reach it
//! (`--addr`, `--timeout`, TLS), how to print (`--output`), and the policy
//! to count under (`--policy NAME`, or an inline policy).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use quotad_client::{Client, LeaseOptions, PolicyRef, TlsConfig};
use quotad_core::calendar::{self, Calendar, CalendarError, Period, Zone};
use quotad_core::{Algorithm, Policy};

use super::{DEFAULT_ADDR, Failure, client};

/// How a command prints its answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    /// One line a decision, for people.
    #[default]
    Text,
    /// One JSON object a line, for programs.
    Json,
}

impl Output {
    /// Writes `json` as one line when the output is JSON, `text` otherwise;
    /// flushed, so a killed process leaves every line it wrote.
    pub(crate) fn line(
        self,
        out: &mut impl Write,
        text: impl FnOnce() -> String,
        json: impl FnOnce() -> serde_json::Value,
    ) -> std::io::Result<()> {
        match self {
            Output::Text => writeln!(out, "{}", text())?,
            Output::Json => writeln!(out, "{}", json())?,
        }
        out.flush()
    }
}

/// Where quotad is, how to reach it, and how to print its answers.
#[derive(Debug, clap::Args)]
pub(crate) struct Connection {
    /// quotad's gRPC address (`http://host:port`, `host:port`,
    /// `https://host:port` with `--tls-ca`, or `unix:///path/to.sock`)
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_ADDR)]
    addr: String,
    /// Longest wait for each answer, connecting included
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The CA certificates (PEM) to trust: TLS to quotad (`https://`)
    #[arg(long = "tls-ca", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// A client certificate (PEM) to present, for quotad's mTLS
    #[arg(long = "tls-cert", value_name = "FILE", requires_all = ["tls_key", "ca"])]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM)
    #[arg(
        long = "tls-key",
        id = "tls_key",
        value_name = "FILE",
        requires = "cert"
    )]
    tls_key: Option<PathBuf>,
    /// The name to expect in quotad's certificate, when it is not the
    /// address's host
    #[arg(long = "tls-server-name", value_name = "NAME", requires = "ca")]
    server_name: Option<String>,
    /// How to print each answer
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

/// A connected client command: the address it speaks to and its client.
pub(crate) struct Connected {
    pub(crate) uri: String,
    pub(crate) client: Client,
    pub(crate) output: Output,
}

impl Connection {
    /// A client of quotad, leasing with `leases` when given.
    ///
    /// # Errors
    ///
    /// [`Failure::Usage`] for an address or TLS file that cannot be used.
    pub(crate) fn connect(&self, leases: Option<LeaseOptions>) -> Result<Connected, Failure> {
        let uri = endpoint(&self.addr, self.ca.is_some())?;
        let client = client(&uri, self.timeout, self.tls()?, leases)?;
        Ok(Connected {
            uri,
            client,
            output: self.output,
        })
    }

    /// A channel to quotad, for the services `quotad-client` does not wrap
    /// (overrides, explain), and the longest wait for each answer.
    ///
    /// # Errors
    ///
    /// As [`Connection::connect`].
    pub(crate) fn channel(&self) -> Result<(String, tonic::transport::Channel), Failure> {
        let uri = endpoint(&self.addr, self.ca.is_some())?;
        let mut builder = Client::builder(&uri).deadline(self.timeout);
        if let Some(tls) = self.tls()? {
            builder = builder.tls(tls);
        }
        let channel = builder
            .channel()
            .map_err(|error| super::failure(&uri, error))?;
        Ok((uri, channel))
    }

    /// How long a command waits for each answer.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The TLS settings of `--tls-*`, if any.
    fn tls(&self) -> Result<Option<TlsConfig>, Failure> {
        let mut tls = None;
        if let Some(ca) = &self.ca {
            let mut config = TlsConfig::from_pem_files(ca)
                .map_err(|e| Failure::Usage(format!("--tls-ca: {e}")))?;
            if let (Some(cert), Some(key)) = (&self.cert, &self.tls_key) {
                config = config
                    .identity_from_pem_files(cert, key)
                    .map_err(|e| Failure::Usage(format!("--tls-cert/--tls-key: {e}")))?;
            }
            if let Some(name) = &self.server_name {
                config = config.server_name(name.clone());
            }
            tls = Some(config);
        }
        Ok(tls)
    }
}

/// The URI for `--addr`: `host:port` means `http://host:port`, or
/// `https://host:port` when a CA is given (`--tls-ca`); `unix:///path/to.sock` (or
/// `unix:path`) is a unix socket.
///
/// # Errors
///
/// [`Failure::Usage`] for a scheme other than `http`, `https` or `unix`, an
/// `https` address without `--ca`, or `--ca` with a plaintext address.
pub(crate) fn endpoint(addr: &str, tls: bool) -> Result<String, Failure> {
    if addr.starts_with("unix:") {
        if tls {
            return Err(Failure::Usage(format!(
                "--tls-ca: {addr} is a unix socket, which quotad serves without TLS"
            )));
        }
        return Ok(addr.to_owned());
    }
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    match (uri.split_once("://").map(|(scheme, _)| scheme), tls) {
        (Some("http"), false) | (Some("https"), true) => Ok(uri),
        (Some("https"), false) => Err(Failure::Usage(format!(
            "--addr {addr}: an https:// address needs --tls-ca FILE, the CA to trust"
        ))),
        (Some("http"), true) => Err(Failure::Usage(format!(
            "--addr {addr}: --tls-ca is for an https:// address"
        ))),
        _ => Err(Failure::Usage(format!(
            "--addr {addr}: the address is http://, https:// or unix:"
        ))),
    }
}

/// The policy to count under: a named one, or one given inline.
#[derive(Debug, clap::Args)]
pub(crate) struct PolicyArgs {
    /// A named policy of quotad's configuration
    #[arg(
        long,
        value_name = "NAME",
        value_parser = NonEmptyStringValueParser::new(),
        required_unless_present = "algorithm",
        conflicts_with = "algorithm"
    )]
    policy: Option<String>,
    /// An inline policy's algorithm (with --limit and --window, or a
    /// fixed_window's --period): fixed_window, sliding_window, token_bucket,
    /// leaky_bucket or sliding_log
    #[arg(long, value_name = "ALGORITHM", requires = "limit")]
    algorithm: Option<Algorithm>,
    /// An inline policy's limit: units per window, or the refill rate
    #[arg(long, value_name = "N", requires = "algorithm")]
    limit: Option<u64>,
    /// An inline policy's window, e.g. 1s, 1m
    #[arg(long, value_name = "DURATION", requires = "algorithm", value_parser = humantime::parse_duration, conflicts_with = "period")]
    window: Option<Duration>,
    /// An inline fixed window's calendar period instead of --window: day,
    /// week, month or year, from local midnight in --time-zone
    #[arg(long, value_name = "PERIOD", requires = "algorithm")]
    period: Option<String>,
    /// The IANA time zone of --period (default UTC); with --policy, the zone
    /// the reset's local time is printed in (by default the policy's own,
    /// as quotad's Explain describes it)
    #[arg(long, value_name = "ZONE")]
    time_zone: Option<String>,
    /// The day a --period week starts on (default monday)
    #[arg(long, value_name = "DAY", requires = "period")]
    week_start: Option<String>,
    /// An inline bucket policy's capacity (default: the limit)
    #[arg(long, value_name = "N", requires = "algorithm")]
    burst: Option<u64>,
}

impl PolicyArgs {
    /// The policy, an inline one checked as quotad checks it.
    ///
    /// # Errors
    ///
    /// [`Failure::Usage`] naming the flag of an invalid inline policy.
    pub(crate) fn policy(&self) -> Result<PolicyRef, Failure> {
        match (&self.policy, self.algorithm, self.limit, self.window) {
            (Some(name), ..) => Ok(PolicyRef::Named(name.clone())),
            (None, Some(algorithm), Some(limit), None) if self.period.is_some() => {
                let calendar = self.calendar()?.expect("a period was given");
                Policy::calendar(algorithm, limit, calendar)
                    .map(PolicyRef::Inline)
                    .map_err(|error| {
                        let flag = quotad::policy::policy_error_field(&error).config_name();
                        Failure::Usage(format!("--{flag}: {error}"))
                    })
            }
            (None, Some(algorithm), Some(limit), Some(window)) => {
                Policy::try_new(algorithm, limit, window, self.burst)
                    .map(PolicyRef::Inline)
                    .map_err(|error| {
                        let flag = quotad::policy::policy_error_field(&error).config_name();
                        Failure::Usage(format!("--{flag}: {error}"))
                    })
            }
            _ => Err(Failure::Usage(
                "give --policy NAME, or --algorithm with --limit and --window (or --period)"
                    .to_owned(),
            )),
        }
    }

    /// The calendar of `--period`, `--time-zone` and `--week-start`;
    /// `None` without `--period`.
    fn calendar(&self) -> Result<Option<Calendar>, Failure> {
        let Some(period) = &self.period else {
            return Ok(None);
        };
        let usage = |flag: &str, e: CalendarError| Failure::Usage(format!("--{flag}: {e}"));
        let mut period: Period = period.parse().map_err(|e| usage("period", e))?;
        if let Some(day) = &self.week_start {
            let Period::Week(start) = &mut period else {
                return Err(Failure::Usage(
                    "--week-start: applies only with --period week".to_owned(),
                ));
            };
            *start = calendar::parse_weekday(day).map_err(|e| usage("week-start", e))?;
        }
        Ok(Some(Calendar::new(
            period,
            self.zone()?.unwrap_or_else(Zone::utc),
        )))
    }

    /// The zone of `--time-zone`, when given.
    fn zone(&self) -> Result<Option<Zone>, Failure> {
        self.time_zone
            .as_deref()
            .map(Zone::named)
            .transpose()
            .map_err(|e| Failure::Usage(format!("--time-zone: {e}")))
    }

    /// The zone a decision's reset is printed in as a local time: an
    /// inline calendar's, or `--time-zone`'s.
    ///
    /// # Errors
    ///
    /// [`Failure::Usage`] for an unknown zone.
    pub(crate) fn display_zone(&self) -> Result<Option<Zone>, Failure> {
        self.zone()
    }
}

/// What a policy is called in output: its name, or `inline`.
pub(crate) fn policy_label(policy: &PolicyRef) -> String {
    match policy {
        PolicyRef::Named(name) => name.clone(),
        PolicyRef::Inline(policy) => match policy.calendar_period() {
            Some(calendar) => format!(
                "inline {} {}/{calendar}",
                policy.algorithm(),
                policy.limit()
            ),
            None => format!(
                "inline {} {}/{}",
                policy.algorithm(),
                policy.limit(),
                humantime::format_duration(Duration::from_millis(policy.window_ms()))
            ),
        },
    }
}
