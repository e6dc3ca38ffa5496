//! `quotad explain --policy P --key K`: the policy and override in force
//! for a key and its state, in words, consuming nothing.

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use clap::builder::NonEmptyStringValueParser;
use quotad_proto::v1 as pb;
use quotad_proto::v1::explain_client::ExplainClient;

use super::args::Connection;
use super::r#override::{entry_json, numbers};
use super::{Failure, human, status_failure};

/// `quotad explain`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    connection: Connection,
    /// The named policy
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    policy: String,
    /// The key
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    key: String,
}

/// Explains the key's state under the policy.
///
/// # Errors
///
/// [`Failure::Failed`] when quotad cannot be reached or refuses (NOT_FOUND
/// for an unknown policy; PERMISSION_DENIED for a caller
/// `limits.allow_reset` refuses).
pub(crate) async fn explain(args: ExplainArgs, mut out: impl Write) -> Result<(), Failure> {
    let (uri, channel) = args.connection.channel()?;
    let mut client = ExplainClient::new(channel);
    let mut request = tonic::Request::new(pb::ExplainRequest {
        policy: args.policy,
        key: args.key.clone(),
    });
    request.set_timeout(args.connection.timeout());
    let answer = client
        .explain(request)
        .await
        .map_err(|s| status_failure(&uri, s))?
        .into_inner();
    args.connection.output.line(
        &mut out,
        || render(&args.key, &answer),
        || json(&args.key, &answer),
    )?;
    Ok(())
}

fn algorithm(policy: &pb::Policy) -> &'static str {
    match policy.algorithm() {
        pb::Algorithm::FixedWindow => "fixed_window",
        pb::Algorithm::SlidingWindow => "sliding_window",
        pb::Algorithm::TokenBucket => "token_bucket",
        pb::Algorithm::LeakyBucket => "leaky_bucket",
        pb::Algorithm::SlidingLog => "sliding_log",
        pb::Algorithm::Concurrency => "concurrency",
        pb::Algorithm::Unspecified => "unspecified",
    }
}

fn describe(policy: &pb::Policy) -> String {
    let per = if policy.period.is_empty() {
        human(policy.window_ms)
    } else {
        // A calendar policy: its local period, not a window.
        let zone = if policy.time_zone.is_empty() {
            "UTC"
        } else {
            &policy.time_zone
        };
        match policy.period.as_str() {
            "week" if !policy.week_start.is_empty() => {
                format!("week from {} in {zone}", policy.week_start)
            }
            period => format!("{period} in {zone}"),
        }
    };
    let mut text = format!("{} {} per {per}", algorithm(policy), policy.limit);
    if let Some(b) = policy.burst
        && b != policy.limit
    {
        text.push_str(&format!(", burst {b}"));
    }
    text
}

fn at(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The answer in words, one fact a line.
fn render(key: &str, a: &pb::ExplainResponse) -> String {
    let none = pb::Policy::default();
    let configured = a.configured.as_ref().unwrap_or(&none);
    let in_force = a.in_force.as_ref().unwrap_or(&none);
    let state = a.state.clone().unwrap_or_default();
    let mut lines = vec![format!(
        "key {key:?} under policy {:?} ({})",
        a.policy,
        describe(configured)
    )];
    match &a.active_override {
        Some(o) => {
            let scope = match o.scope.as_ref().and_then(|s| s.scope.as_ref()) {
                Some(pb::override_scope::Scope::Key(k)) => format!("key {k:?}"),
                Some(pb::override_scope::Scope::Prefix(p)) => format!("prefix {p:?}"),
                None => "?".to_owned(),
            };
            let source = if o.source() == pb::OverrideSource::File {
                "config file"
            } else {
                "runtime"
            };
            lines.push(format!(
                "override in force: {scope}, {} ({source}, set by {})",
                numbers(o),
                o.set_by
            ));
        }
        None => lines.push("no override: the policy's numbers apply".to_owned()),
    }
    lines.push(format!("counted as {}", describe(in_force)));
    let cap = state.limit;
    let used = a.used;
    let left = state.remaining;
    let state_line = match in_force.algorithm() {
        pb::Algorithm::FixedWindow => format!(
            "window {} to {}: {used} of {cap} counted, {left} left",
            at(a.window_start_ms),
            at(a.window_end_ms)
        ),
        pb::Algorithm::SlidingWindow => format!(
            "window {} to {}: about {used} of {cap} counted over the last window (the previous window's count weighted by its overlap), {left} left",
            at(a.window_start_ms),
            at(a.window_end_ms)
        ),
        pb::Algorithm::TokenBucket => {
            format!("{left} of {cap} tokens in the bucket ({used} spent and not yet refilled)")
        }
        pb::Algorithm::LeakyBucket => {
            format!("bucket level {used} of {cap}, room for {left}")
        }
        pb::Algorithm::SlidingLog => format!(
            "{used} of {cap} units logged in the last {}, {left} left",
            human(in_force.window_ms)
        ),
        pb::Algorithm::Concurrency => {
            format!("{used} of {cap} units held by live slots, {left} free")
        }
        pb::Algorithm::Unspecified => format!("{used} of {cap} used"),
    };
    lines.push(state_line);
    if left == 0 {
        if state.retry_after_ms > 0 {
            lines.push(format!(
                "limited now: the next unit fits in {} (at {})",
                human(state.retry_after_ms),
                at(a.now_ms + state.retry_after_ms)
            ));
        } else {
            lines.push("limited now".to_owned());
        }
    } else {
        lines.push("not limited now: a unit-cost request would be allowed".to_owned());
    }
    if state.reset_after_ms == 0 {
        lines.push("fresh: nothing counted".to_owned());
    } else {
        lines.push(format!(
            "fresh again in {} (at {})",
            human(state.reset_after_ms),
            at(a.reset_at_ms)
        ));
    }
    lines.join("\n")
}

fn json(key: &str, a: &pb::ExplainResponse) -> serde_json::Value {
    let policy = |p: Option<&pb::Policy>| {
        p.map(|p| {
            serde_json::json!({
                "algorithm": algorithm(p),
                "limit": p.limit,
                "window_ms": p.window_ms,
                "burst": p.burst,
            })
        })
    };
    let state = a.state.clone().unwrap_or_default();
    serde_json::json!({
        "policy": a.policy,
        "key": key,
        "configured": policy(a.configured.as_ref()),
        "in_force": policy(a.in_force.as_ref()),
        "override": a.active_override.as_ref().map(entry_json),
        "capacity": state.limit,
        "used": a.used,
        "remaining": state.remaining,
        "retry_after_ms": state.retry_after_ms,
        "reset_after_ms": state.reset_after_ms,
        "now_ms": a.now_ms,
        "reset_at_ms": a.reset_at_ms,
        "window_start_ms": a.window_start_ms,
        "window_end_ms": a.window_end_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calendar_policy_is_described_by_its_period_and_zone() {
        let calendar = quotad_core::Calendar::new(
            quotad_core::Period::Month,
            quotad_core::Zone::named("Europe/Berlin").expect("a zone"),
        );
        let policy =
            quotad_core::Policy::calendar(quotad_core::Algorithm::FixedWindow, 1000, calendar)
                .expect("valid");
        assert_eq!(
            describe(&(&policy).into()),
            "fixed_window 1000 per month in Europe/Berlin"
        );
        let minute = quotad_core::Policy::try_new(
            quotad_core::Algorithm::FixedWindow,
            10,
            Duration::from_secs(60),
            None,
        )
        .expect("valid");
        assert_eq!(describe(&(&minute).into()), "fixed_window 10 per 1m");
    }
}
