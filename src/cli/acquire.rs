//! `quotad acquire`: takes a slot of a concurrency policy, holds it
//! (renewing it at a third of its TTL) for `--hold`, then releases it.
//!
//! One line when the answer comes, flushed at once, so a process killed
//! while it holds the slot has said which slot it held:
//!
//! ```text
//! acquired slot=5f0c2a1e9b3d4c77 ttl=30s remaining=4 limit=5
//! denied remaining=0 retry_after=12s 400ms limit=5
//! ```
//!
//! and `released slot=...` once it let the slot go. A slot whose renewal
//! fails (it ended: the process stalled past its TTL) is reported and the
//! command exits 1. It speaks to quotad's `quotad.v1.Concurrency` service
//! directly, over plaintext http.

use std::io::Write;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use quotad_proto::v1 as pb;
use quotad_proto::v1::concurrency_client::ConcurrencyClient;
use tonic::transport::Endpoint;

use super::args::endpoint;
use super::{DEFAULT_ADDR, Failure, human, status_detail};

/// `quotad acquire`.
#[derive(Debug, clap::Args)]
pub(crate) struct AcquireArgs {
    /// quotad's gRPC address (`http://host:port` or `host:port`)
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_ADDR)]
    addr: String,
    /// The named concurrency policy
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    policy: String,
    /// The key to hold a slot of: a tenant, a user, a backend
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    key: String,
    /// Units the slot holds
    #[arg(long, value_name = "N", default_value_t = 1)]
    cost: u64,
    /// How long to hold the slot before releasing it; renewed meanwhile
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Longest wait for each answer, connecting included
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Acquires, holds, renews and releases one slot, printing each step.
///
/// # Errors
///
/// [`Failure`] when quotad cannot be reached, refuses the request, or a
/// renewal finds the slot gone.
pub(crate) async fn acquire(args: AcquireArgs, mut out: impl Write) -> Result<(), Failure> {
    let uri = endpoint(&args.addr, false)?;
    if uri.starts_with("unix:") {
        return Err(Failure::Usage(
            "--addr: quotad acquire speaks plaintext http:// only".to_owned(),
        ));
    }
    let channel = Endpoint::from_shared(uri.clone())
        .map_err(|e| Failure::Usage(format!("--addr: {e}")))?
        .connect_timeout(args.timeout)
        .timeout(args.timeout)
        .connect_lazy();
    let mut client = ConcurrencyClient::new(channel);
    let failed = |status: tonic::Status| match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown => {
            Failure::Failed(format!(
                "cannot reach quotad at {uri}: {}",
                status_detail(&status)
            ))
        }
        code => Failure::Failed(format!(
            "quotad refused the request ({}): {}",
            quotad_proto::convert::code_name(code),
            status.message()
        )),
    };
    let answer = client
        .acquire(pb::AcquireRequest {
            key: args.key.clone(),
            cost: Some(args.cost),
            policy: Some(pb::acquire_request::Policy::PolicyName(args.policy.clone())),
        })
        .await
        .map_err(failed)?
        .into_inner();
    let decision = answer.decision.unwrap_or_default();
    if !decision.allowed {
        writeln!(
            out,
            "denied remaining={} retry_after={} limit={}",
            decision.remaining,
            human(decision.retry_after_ms),
            decision.limit
        )?;
        out.flush()?;
        return Ok(());
    }
    writeln!(
        out,
        "acquired slot={} ttl={} remaining={} limit={}",
        if answer.slot_id.is_empty() {
            "none"
        } else {
            &answer.slot_id
        },
        human(answer.ttl_ms),
        decision.remaining,
        decision.limit
    )?;
    out.flush()?;
    if answer.slot_id.is_empty() {
        // Admitted by on_error = "fail_open": no slot to hold.
        return Ok(());
    }
    let request = || pb::SlotRequest {
        key: args.key.clone(),
        policy: Some(pb::slot_request::Policy::PolicyName(args.policy.clone())),
        slot_id: answer.slot_id.clone(),
    };
    // Renew at a third of the TTL: two renewals may fail or come late
    // before the slot ends.
    let every = Duration::from_millis((answer.ttl_ms / 3).max(1));
    let until = tokio::time::Instant::now() + args.hold;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(every)).await;
        if tokio::time::Instant::now() >= until {
            break;
        }
        let renewed = client.renew(request()).await.map_err(failed)?;
        if !renewed.into_inner().renewed {
            writeln!(out, "lost slot={}", answer.slot_id)?;
            out.flush()?;
            return Err(Failure::Failed(format!(
                "slot {} ended before it was renewed",
                answer.slot_id
            )));
        }
    }
    let released = client
        .release(request())
        .await
        .map_err(failed)?
        .into_inner();
    writeln!(
        out,
        "released slot={} was_held={} remaining={}",
        answer.slot_id, released.was_held, released.remaining
    )?;
    out.flush()?;
    Ok(())
}
