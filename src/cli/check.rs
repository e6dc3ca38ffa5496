//! `quotad check` and `quotad peek`: one decision a line.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::builder::NonEmptyStringValueParser;
use quotad_client::{Check, Decision, LeaseOptions, MAX_LEASE_WANT, PolicyRef, Reason};
use quotad_core::Zone;
use quotad_proto::v1 as pb;
use quotad_proto::v1::explain_client::ExplainClient;
use serde_json::json;

use super::args::{Connected, Connection, Output, PolicyArgs, policy_label};
use super::{Failure, failure, human};

/// A key under a policy, at a quotad: what each command about one key
/// takes.
#[derive(Debug, clap::Args)]
pub(crate) struct KeyAt {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    policy: PolicyArgs,
    /// The key: a user, an API key, an IP address
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    key: String,
}

/// What to ask: a key under a policy, at a quotad, and the cost.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    #[command(flatten)]
    at: KeyAt,
    /// Units each check asks for
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    cost: u64,
}

/// A client of the target's quotad, and the check it asks for.
struct Asking {
    uri: String,
    client: quotad_client::Client,
    output: Output,
    check: Check,
    /// The zone the reset is printed in as a local time, when known.
    zone: Option<Zone>,
}

impl Target {
    /// A client of the target, leasing with `leases` when given.
    async fn connect(self, leases: Option<LeaseOptions>) -> Result<Asking, Failure> {
        let policy = self.at.policy.policy()?;
        let zone = match (self.at.policy.display_zone()?, &policy) {
            (Some(asked), _) => Some(asked),
            (None, PolicyRef::Inline(p)) => p.calendar_period().map(|c| c.zone()),
            (None, PolicyRef::Named(name)) => {
                named_zone(&self.at.connection, name, &self.at.key).await
            }
        };
        let check = check_of(policy, self.at.key).cost(self.cost);
        let Connected {
            uri,
            client,
            output,
        } = self.at.connection.connect(leases)?;
        Ok(Asking {
            uri,
            client,
            output,
            check,
            zone,
        })
    }
}

/// The zone a named policy's reset is printed in, as quotad's `Explain`
/// describes the policy in force for `key`: a calendar policy's own zone;
/// none for a policy of plain windows (its reset is printed as a wait
/// only). Where `Explain` does not answer (a caller `limits.allow_reset`
/// refuses, or a quotad without it), none either: which kind of policy it
/// is cannot be known, so the reset is printed as a wait only, and one
/// line on stderr says why and that `--time-zone` names a zone.
async fn named_zone(connection: &Connection, name: &str, key: &str) -> Option<Zone> {
    // Without a channel the check itself says what is wrong.
    let (_, channel) = connection.channel().ok()?;
    let mut request = tonic::Request::new(pb::ExplainRequest {
        policy: name.to_owned(),
        key: key.to_owned(),
    });
    request.set_timeout(connection.timeout());
    let answer = match ExplainClient::new(channel).explain(request).await {
        Ok(answer) => answer.into_inner(),
        Err(status) => {
            // The check itself says what is wrong with the policy, the key
            // or quotad; a refusal of Explain alone (or a quotad without
            // it) only costs the local reset time.
            if matches!(
                status.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unimplemented
            ) {
                eprintln!(
                    "note: the reset is printed as a wait only: quotad's Explain answered {:?}: {} \
                     (--time-zone prints it as a local time in the zone given)",
                    status.code(),
                    status.message()
                );
            }
            return None;
        }
    };
    let policy = answer.in_force.or(answer.configured)?;
    if policy.period.is_empty() {
        return None;
    }
    if policy.time_zone.is_empty() {
        return Some(Zone::utc());
    }
    Some(Zone::named(&policy.time_zone).unwrap_or_else(|_| Zone::utc()))
}

/// A check of `key` under `policy`, at cost 1.
pub(crate) fn check_of(policy: PolicyRef, key: impl Into<String>) -> Check {
    match policy {
        PolicyRef::Named(name) => Check::named(name, key),
        PolicyRef::Inline(policy) => Check::inline(policy, key),
    }
}

/// The most checks one `quotad check` makes.
const MAX_COUNT: u64 = 100_000;

/// A whole number of at least 1.
pub(crate) fn at_least_one(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// A `--count` from 1 to [`MAX_COUNT`].
fn count(value: &str) -> Result<u64, String> {
    match at_least_one(value)? {
        n if n > MAX_COUNT => Err(format!("must be at most {MAX_COUNT}")),
        n => Ok(n),
    }
}

/// A `--leases` want: from 1 to 2^53 units, as a lease may be asked for.
fn lease_want(value: &str) -> Result<u64, String> {
    match at_least_one(value)? {
        n if n > MAX_LEASE_WANT => Err(format!("must be at most {MAX_LEASE_WANT}")),
        n => Ok(n),
    }
}

/// `quotad check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    target: Target,
    /// How many checks to make, one after another (at most 100,000)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = count)]
    count: u64,
    /// Pause between two checks of `--count`
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Lease budget from quotad, asking for up to N units a lease, and
    /// decide locally while a lease lasts (the policy needs lease settings
    /// on the server); off by default
    #[arg(long, value_name = "N", value_parser = lease_want)]
    leases: Option<u64>,
    /// Start each line with the wall-clock time the decision was in hand,
    /// in milliseconds since the Unix epoch
    #[arg(long)]
    timestamps: bool,
}

/// `quotad peek`.
#[derive(Debug, clap::Args)]
pub(crate) struct PeekArgs {
    #[command(flatten)]
    target: Target,
}

/// Checks (and consumes) `--count` times, printing each decision.
///
/// Each line is flushed as soon as it is written, so a process killed
/// part-way leaves every decision it made on its output. With `--leases`,
/// the leases held are returned before it exits, the run ended by an error
/// or not.
///
/// # Errors
///
/// [`Failure`] when quotad cannot be reached or refuses the request; the
/// decisions made before it are printed.
pub(crate) async fn check(args: CheckArgs, mut out: impl Write) -> Result<(), Failure> {
    let leases = args
        .leases
        .map(LeaseOptions::try_new)
        .transpose()
        .map_err(|error| Failure::Usage(format!("--leases: {error}")))?;
    let asking = args.target.connect(leases).await?;
    let run = Run {
        count: args.count,
        interval: args.interval,
        leases: leases.is_some(),
        timestamps: args.timestamps,
    };
    let outcome = run.checks(&asking, &mut out).await;
    if run.leases {
        // Unspent units go back to the key's budget now rather than when
        // their leases end.
        asking.client.shutdown().await;
    }
    outcome
}

/// How `quotad check` runs its checks, and what it prints with each.
#[derive(Clone, Copy, Debug)]
struct Run {
    count: u64,
    interval: Duration,
    leases: bool,
    timestamps: bool,
}

impl Run {
    async fn checks(self, asking: &Asking, out: &mut impl Write) -> Result<(), Failure> {
        let Asking {
            uri,
            client,
            output,
            check: request,
            zone,
        } = asking;
        let cost = request.cost_units();
        let width = self.count.to_string().len();
        let (mut allowed, mut denied, mut local) = (0_u64, 0_u64, 0_u64);
        for n in 1..=self.count {
            if n > 1 && !self.interval.is_zero() {
                tokio::time::sleep(self.interval).await;
            }
            let before = client.lease_stats().local_admissions;
            let decision = client
                .check(request)
                .await
                .map_err(|error| failure(uri, error))?;
            // Read at once: for a call, quotad decided a little earlier;
            // for a lease, this is the local decision's own instant.
            let at_ms = wall_clock_ms();
            // Checks run one at a time, so a local admission counted since
            // `before` is this one's.
            let from_lease = self.leases && client.lease_stats().local_admissions > before;
            if decision.allowed {
                allowed += 1;
            } else {
                denied += 1;
            }
            local += u64::from(from_lease);
            let text = || {
                let mut line = format!("#{n:<width$}  ");
                if self.timestamps {
                    line.push_str(&format!("at {at_ms}  "));
                }
                line.push_str(&describe(&decision, cost, Verb::Checked));
                if let Some(at) = reset_at(&decision, *zone, at_ms) {
                    line.push_str(&format!("  resets {at}"));
                }
                if from_lease {
                    line.push_str("  from a lease");
                }
                line
            };
            let json = || {
                let mut object = decision_json(&decision);
                object["key"] = json!(request.key());
                object["policy"] = json!(policy_label(request.policy()));
                object["n"] = json!(n);
                object["at_ms"] = json!(u64::try_from(at_ms).unwrap_or(u64::MAX));
                object["from_lease"] = json!(from_lease);
                if let Some(at) = reset_at(&decision, *zone, at_ms) {
                    object["reset_at"] = json!(at);
                }
                object
            };
            output.line(out, text, json)?;
        }
        if self.count > 1 {
            let text = || {
                let mut total =
                    format!("{} checks: {allowed} allowed, {denied} denied", self.count);
                if self.leases {
                    total.push_str(&format!(", {local} decided from leases"));
                }
                total
            };
            let json = || json!({"checks": self.count, "allowed": allowed, "denied": denied, "from_leases": local});
            output.line(out, text, json)?;
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch on the wall clock (0 for a clock set
/// before 1970): comparable across processes on one host, unlike the
/// monotonic clock the client times its leases by.
fn wall_clock_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Prints what a check would answer now, consuming nothing.
///
/// # Errors
///
/// As [`check`].
pub(crate) async fn peek(args: PeekArgs, mut out: impl Write) -> Result<(), Failure> {
    let Asking {
        uri,
        client,
        output,
        check,
        zone,
    } = args.target.connect(None).await?;
    let cost = check.cost_units();
    let decision = client
        .peek(&check)
        .await
        .map_err(|error| failure(&uri, error))?;
    let reset = reset_at(&decision, zone, wall_clock_ms());
    output.line(
        &mut out,
        || {
            let mut line = format!("peek  {}", describe(&decision, cost, Verb::Peeked));
            if let Some(at) = &reset {
                line.push_str(&format!("  resets {at}"));
            }
            line
        },
        || {
            let mut object = decision_json(&decision);
            object["key"] = json!(check.key());
            object["policy"] = json!(policy_label(check.policy()));
            if let Some(at) = &reset {
                object["reset_at"] = json!(at);
            }
            object
        },
    )?;
    Ok(())
}

/// A decision as JSON: the fields of the API's `Decision`, the reason by
/// its name.
pub(crate) fn decision_json(d: &Decision) -> serde_json::Value {
    json!({
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "retry_after_ms": d.retry_after_ms,
        "reset_after_ms": d.reset_after_ms,
        "reason": d.reason.to_string(),
    })
}

/// `quotad reset`.
#[derive(Debug, clap::Args)]
pub(crate) struct ResetArgs {
    #[command(flatten)]
    at: KeyAt,
}

/// Gives the key a full budget under the policy.
///
/// # Errors
///
/// As [`check`]; quotad refuses a Reset from a caller
/// `limits.allow_reset` does not admit (PERMISSION_DENIED).
pub(crate) async fn reset(args: ResetArgs, mut out: impl Write) -> Result<(), Failure> {
    let KeyAt {
        connection,
        policy,
        key,
    } = args.at;
    let policy = policy.policy()?;
    let Connected {
        uri,
        client,
        output,
    } = connection.connect(None)?;
    client
        .reset(&policy, &key)
        .await
        .map_err(|error| failure(&uri, error))?;
    let label = policy_label(&policy);
    output.line(
        &mut out,
        || format!("reset  {key} under {label}"),
        || json!({"reset": true, "key": key, "policy": label}),
    )?;
    Ok(())
}

/// When the key is back to a full budget, as a local time in `zone`
/// (RFC 9557: `2024-03-11T00:00:00-04:00[America/New_York]`), from the
/// decision's instant `at_ms` on the wall clock; `None` without a zone or a
/// reset.
fn reset_at(d: &Decision, zone: Option<Zone>, at_ms: u128) -> Option<String> {
    let zone = zone?;
    if d.reset_after_ms == 0 {
        return None;
    }
    let at = u64::try_from(at_ms).ok()?.checked_add(d.reset_after_ms)?;
    Some(zone.local(at))
}

/// Whether the decision was made (`check`) or only looked at (`peek`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Checked,
    Peeked,
}

/// One decision on one line: the outcome, the budget left, when to retry,
/// when the key is back to a full budget, and why.
pub(crate) fn describe(d: &Decision, cost: u64, verb: Verb) -> String {
    let outcome = match (verb, d.allowed) {
        (Verb::Checked, true) => "allowed",
        (Verb::Checked, false) => "denied ",
        (Verb::Peeked, true) => "would be allowed",
        (Verb::Peeked, false) => "would be denied ",
    };
    let mut line = format!("{outcome}  remaining {}/{}", d.remaining, d.limit);
    if !d.allowed {
        if d.reason == Reason::CostExceedsCapacity {
            line.push_str(&format!("  cost {cost} can never fit"));
        } else if d.retry_after_ms > 0 {
            line.push_str(&format!("  retry in {}", human(d.retry_after_ms)));
        }
    }
    if d.reset_after_ms > 0 {
        line.push_str(&format!("  reset in {}", human(d.reset_after_ms)));
    }
    line.push_str(&format!("  ({})", d.reason));
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, remaining: u64, retry: u64, reset: u64, reason: Reason) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            reason,
        }
    }

    /// Allowed: the budget left and the reset; denied: when to retry; a
    /// cost above the capacity: that it never fits; a peek: what would
    /// happen.
    #[test]
    fn a_decision_is_one_line_that_says_what_to_do_next() {
        let cases = [
            (
                decision(true, 9, 0, 1_998, Reason::WithinLimit),
                1,
                Verb::Checked,
                "allowed  remaining 9/10  reset in 1s 998ms  (within_limit)",
            ),
            (
                decision(false, 0, 1_850, 1_850, Reason::LimitExceeded),
                1,
                Verb::Checked,
                "denied   remaining 0/10  retry in 1s 850ms  reset in 1s 850ms  (limit_exceeded)",
            ),
            (
                decision(false, 10, 0, 0, Reason::CostExceedsCapacity),
                20,
                Verb::Checked,
                "denied   remaining 10/10  cost 20 can never fit  (cost_exceeds_capacity)",
            ),
            (
                decision(true, 10, 0, 0, Reason::WithinLimit),
                1,
                Verb::Peeked,
                "would be allowed  remaining 10/10  (within_limit)",
            ),
        ];
        for (d, cost, verb, line) in cases {
            assert_eq!(describe(&d, cost, verb), line);
        }
    }
}
