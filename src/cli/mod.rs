//! The client commands of the `quotad` binary: `check`, `peek`, `reset`,
//! `batch`, `acquire`, `override`, `explain` and `demo`.
//! They talk to a quotad through `quotad-client`, like any application
//! would, and print each decision on one line. `simulate` runs the
//! algorithms in-process instead, with no server.
//!
//! Exit codes: 0 when quotad answered (a denial is an answer), 1 when it
//! could not be reached or refused the request (unknown policy, bad key),
//! 2 for bad input on the command line (nothing is sent then).
//!
//! This module belongs to the binary, not to the server library.

mod acquire;
mod args;
mod batch;
mod check;
mod demo;
mod explain;
mod r#override;
mod simulate;

use std::error::Error as _;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use quotad_client::{Client, Error as ClientError, LeaseOptions, TlsConfig};
use tonic::Status;

pub(crate) use acquire::{AcquireArgs, acquire};
pub(crate) use batch::{BatchArgs, batch};
pub(crate) use check::{CheckArgs, PeekArgs, ResetArgs, check, peek, reset};
pub(crate) use demo::{DemoArgs, demo};
pub(crate) use explain::{ExplainArgs, explain};
pub(crate) use r#override::{OverrideArgs, override_command};
pub(crate) use simulate::{SimulateArgs, simulate};

/// Where the client commands (and `demo --addr`) look for quotad by default.
pub(crate) const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// Bad input on the command line: exit code 2, as clap uses.
const EXIT_USAGE: u8 = 2;

/// Why a client command could not do its job; printed as `error: ...`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The command line is wrong; nothing was sent (exit 2).
    #[error("{0}")]
    Usage(String),
    /// quotad could not be reached, refused the request, or the output
    /// could not be written (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Failure::Failed(format!("cannot write the output: {error}"))
    }
}

/// Runs a client command on its own runtime and turns its outcome into
/// the process exit code.
pub(crate) fn execute<F>(command: impl FnOnce(std::io::Stdout) -> F) -> ExitCode
where
    F: Future<Output = Result<(), Failure>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Stdout is line-buffered, so each decision shows as soon as it is
    // printed.
    match runtime.block_on(command(std::io::stdout())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = std::io::stdout().flush();
            eprintln!("error: {failure}");
            match failure {
                Failure::Usage(_) => ExitCode::from(EXIT_USAGE),
                Failure::Failed(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// A client of the quotad at `uri` whose calls give up after `timeout`,
/// over `tls` when given, leasing with `leases` when given. No local deny
/// cache: the command line shows quotad's own answers, or with `leases`,
/// the decisions made from the leases quotad granted.
fn client(
    uri: &str,
    timeout: Duration,
    tls: Option<TlsConfig>,
    leases: Option<LeaseOptions>,
) -> Result<Client, Failure> {
    let mut builder = Client::builder(uri).deadline(timeout).deny_cache(0);
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    if let Some(options) = leases {
        builder = builder.leases(options);
    }
    builder.build().map_err(|error| failure(uri, error))
}

/// What a client error means for the person at the terminal.
fn failure(uri: &str, error: ClientError) -> Failure {
    match error {
        ClientError::InvalidAddress(message) => Failure::Usage(format!("--addr: {message}")),
        ClientError::Unavailable(status) => Failure::Failed(format!(
            "cannot reach quotad at {uri}: {}",
            status_detail(&status)
        )),
        ClientError::Rejected(status) => Failure::Failed(format!(
            "quotad refused the request ({}): {}",
            quotad_proto::convert::code_name(status.code()),
            status.message()
        )),
        ClientError::BadResponse(what) => {
            Failure::Failed(format!("unexpected answer from quotad at {uri}: {what}"))
        }
    }
}

/// What a refused or failed call of a generated client means.
fn status_failure(uri: &str, status: Status) -> Failure {
    if status.code() == tonic::Code::Unavailable && status.source().is_some() {
        failure(uri, ClientError::Unavailable(status))
    } else {
        failure(uri, ClientError::Rejected(status))
    }
}

/// The status message and its causes: tonic's "tcp connect error" alone
/// does not say that the connection was refused.
fn status_detail(status: &Status) -> String {
    let mut detail = status.message().to_owned();
    let mut source = status.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // tonic wraps the cause in a bare "transport error", which says nothing.
        if text != "transport error" && !detail.contains(&text) {
            detail.push_str(": ");
            detail.push_str(&text);
        }
        source = cause.source();
    }
    detail
}

/// A duration in milliseconds for people: `1s 850ms`, `59s`, `1h 2m`.
/// Exact, never rounded, so a retry time is never shown as shorter than
/// it is.
fn human(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_host_and_port_means_http_or_https_with_a_ca() {
        use super::args::endpoint;
        assert_eq!(
            endpoint("127.0.0.1:50051", false).expect("valid"),
            "http://127.0.0.1:50051"
        );
        assert_eq!(
            endpoint("127.0.0.1:50051", true).expect("valid"),
            "https://127.0.0.1:50051"
        );
        assert_eq!(
            endpoint("http://quotad:50051", false).expect("valid"),
            "http://quotad:50051"
        );
        for (addr, tls) in [
            ("https://quotad:50051", false),
            ("http://quotad:50051", true),
            ("ftp://quotad:21", false),
            ("unix:///run/quotad.sock", true),
        ] {
            assert!(
                matches!(endpoint(addr, tls), Err(Failure::Usage(_))),
                "{addr} {tls}"
            );
        }
        assert_eq!(
            endpoint("unix:///run/quotad.sock", false).expect("valid"),
            "unix:///run/quotad.sock"
        );
    }

    #[test]
    fn durations_are_printed_exactly_in_human_units() {
        assert_eq!(human(0), "0s");
        assert_eq!(human(850), "850ms");
        assert_eq!(human(1_850), "1s 850ms");
        assert_eq!(human(30_000), "30s");
        assert_eq!(human(3_723_000), "1h 2m 3s");
    }

    #[test]
    fn refusals_name_the_grpc_code_and_the_servers_message() {
        let error =
            ClientError::Rejected(Status::not_found("policy_name: no policy named \"nope\""));
        assert_eq!(
            failure("http://x", error).to_string(),
            "quotad refused the request (NOT_FOUND): policy_name: no policy named \"nope\""
        );
    }
}
