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
//! and `released slot=... was_held=true` once it let the slot go. A slot
//! that may have ended (a renewal found it gone, or its TTL passed with no
//! renewal answered: quotad unreachable, or the process stalled) is
//! reported as `lost slot=...`, released if it is still held, and the
//! command exits 1. It holds the slot through quotad-client's
//! [`SlotGuard`](quotad_client::SlotGuard), so it reaches quotad as
//! `quotad check` does: http, https with `--tls-ca` (and mTLS), or a unix
//! socket; `--output json` prints the same lines as JSON objects.

use std::io::Write;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use quotad_client::{Acquired, Check};

use super::args::{Connection, Output};
use super::{Failure, failure, human};

/// `quotad acquire`.
#[derive(Debug, clap::Args)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    connection: Connection,
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
}

/// Acquires, holds and releases one slot, printing each step.
///
/// # Errors
///
/// [`Failure`] when quotad cannot be reached, refuses the request, or the
/// slot is lost while held.
pub(crate) async fn acquire(args: AcquireArgs, mut out: impl Write) -> Result<(), Failure> {
    let connected = args.connection.connect(None)?;
    let (uri, output) = (connected.uri.as_str(), connected.output);
    let check = Check::named(args.policy.clone(), args.key.clone()).cost(args.cost);
    let answer = connected
        .client
        .acquire(&check)
        .await
        .map_err(|e| failure(uri, e))?;
    let guard = match answer {
        Acquired::Denied(d) => {
            output.line(
                &mut out,
                || {
                    format!(
                        "denied remaining={} retry_after={} limit={}",
                        d.remaining,
                        human(d.retry_after_ms),
                        d.limit
                    )
                },
                || {
                    serde_json::json!({
                        "outcome": "denied", "key": args.key, "policy": args.policy,
                        "remaining": d.remaining, "retry_after_ms": d.retry_after_ms,
                        "limit": d.limit, "reason": d.reason.to_string(),
                    })
                },
            )?;
            return Ok(());
        }
        Acquired::Held(guard) => guard,
    };
    let slot = guard.slot_id().to_owned();
    let shown = if slot.is_empty() { "none" } else { &slot };
    let (d, ttl) = (guard.decision(), millis(guard.ttl()));
    output.line(
        &mut out,
        || {
            format!(
                "acquired slot={shown} ttl={} remaining={} limit={}",
                human(ttl),
                d.remaining,
                d.limit
            )
        },
        || {
            serde_json::json!({
                "outcome": "acquired", "key": args.key, "policy": args.policy,
                "slot_id": slot, "ttl_ms": ttl, "remaining": d.remaining,
                "limit": d.limit, "reason": d.reason.to_string(),
            })
        },
    )?;
    if slot.is_empty() {
        // Admitted by on_error = "fail_open": no slot to hold.
        return Ok(());
    }
    // Interrupted (Ctrl-C), it releases the slot as at the end of --hold.
    let lost = tokio::select! {
        () = tokio::time::sleep(args.hold) => false,
        _ = tokio::signal::ctrl_c() => false,
        () = guard.lost() => true,
    };
    let said = Said {
        output,
        key: &args.key,
        policy: &args.policy,
        slot: &slot,
    };
    // The release is sent before anything more is printed: an output that
    // fails must not leave the slot to its TTL.
    let released = guard.release().await;
    if lost {
        said.line(&mut out, "lost", None)?;
    }
    if let Ok(was_held) = released {
        said.line(&mut out, "released", Some(was_held))?;
    }
    if lost {
        return Err(Failure::Failed(format!(
            "slot {slot} may have ended before it was renewed"
        )));
    }
    released.map(|_| ()).map_err(|e| failure(uri, e))
}

/// What the `lost` and `released` lines name.
struct Said<'a> {
    output: Output,
    key: &'a str,
    policy: &'a str,
    slot: &'a str,
}

impl Said<'_> {
    /// A `lost` or `released` line.
    fn line(
        &self,
        out: &mut impl Write,
        what: &str,
        was_held: Option<bool>,
    ) -> std::io::Result<()> {
        let slot = self.slot;
        self.output.line(
            out,
            || match was_held {
                Some(held) => format!("{what} slot={slot} was_held={held}"),
                None => format!("{what} slot={slot}"),
            },
            || {
                let mut line = serde_json::json!({
                    "outcome": what, "key": self.key, "policy": self.policy, "slot_id": slot,
                });
                if let Some(held) = was_held {
                    line["was_held"] = held.into();
                }
                line
            },
        )
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
