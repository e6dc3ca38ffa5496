//! `quotad override set|rm|ls`: runtime overrides of named policies,
//! through `quotad.v1.Overrides`.

use std::io::Write;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use quotad_proto::v1 as pb;
use quotad_proto::v1::overrides_client::OverridesClient;

use super::args::{Connection, Output};
use super::{Failure, human, status_failure};

/// `quotad override`.
#[derive(Debug, clap::Args)]
pub(crate) struct OverrideArgs {
    #[command(subcommand)]
    command: OverrideCommand,
}

#[derive(Debug, clap::Subcommand)]
enum OverrideCommand {
    /// Sets (adds or replaces) an override: a key or a prefix of a policy
    /// gets its own limit, window and burst
    Set(SetArgs),
    /// Removes a runtime override
    Rm(RmArgs),
    /// Lists the overrides in force (runtime and config file)
    Ls(LsArgs),
}

/// What an override applies to.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct ScopeArgs {
    /// Exactly this key
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    key: Option<String>,
    /// Every key that starts with this
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    prefix: Option<String>,
}

impl ScopeArgs {
    fn to_pb(&self) -> pb::OverrideScope {
        let scope = match (&self.key, &self.prefix) {
            (Some(k), _) => pb::override_scope::Scope::Key(k.clone()),
            (None, Some(p)) => pb::override_scope::Scope::Prefix(p.clone()),
            (None, None) => unreachable!("clap requires one of --key and --prefix"),
        };
        pb::OverrideScope { scope: Some(scope) }
    }
}

#[derive(Debug, clap::Args)]
struct SetArgs {
    #[command(flatten)]
    connection: Connection,
    /// The named policy
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    policy: String,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Units per window (or the refill rate)
    #[arg(long, value_name = "N")]
    limit: u64,
    /// The window, e.g. 1s, 1m [default: the policy's]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    window: Option<Duration>,
    /// A bucket's capacity [default: the limit]
    #[arg(long, value_name = "N")]
    burst: Option<u64>,
    /// How long it stays in force, from now, e.g. 1h [default: until removed]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    expires_in: Option<Duration>,
}

#[derive(Debug, clap::Args)]
struct RmArgs {
    #[command(flatten)]
    connection: Connection,
    /// The named policy
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    policy: String,
    #[command(flatten)]
    scope: ScopeArgs,
}

#[derive(Debug, clap::Args)]
struct LsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only this policy's overrides
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,
}

/// Runs `quotad override ...`.
///
/// # Errors
///
/// [`Failure::Failed`] when quotad cannot be reached or refuses the change
/// (INVALID_ARGUMENT naming the field, PERMISSION_DENIED for a caller
/// `limits.allow_overrides` refuses).
pub(crate) async fn override_command(
    args: OverrideArgs,
    mut out: impl Write,
) -> Result<(), Failure> {
    match args.command {
        OverrideCommand::Set(args) => set(args, &mut out).await,
        OverrideCommand::Rm(args) => rm(args, &mut out).await,
        OverrideCommand::Ls(args) => ls(args, &mut out).await,
    }
}

fn client(
    connection: &Connection,
) -> Result<(String, OverridesClient<tonic::transport::Channel>), Failure> {
    let (uri, channel) = connection.channel()?;
    Ok((uri, OverridesClient::new(channel)))
}

/// A request that gives up after `timeout`.
fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

async fn set(args: SetArgs, out: &mut impl Write) -> Result<(), Failure> {
    let window_ms = args
        .window
        .map(|w| {
            u64::try_from(w.as_millis())
                .map_err(|_| Failure::Usage("--window: too long".to_owned()))
        })
        .transpose()?;
    let expires_at_ms = args
        .expires_in
        .map(|d| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            u64::try_from((now + d).as_millis())
                .map_err(|_| Failure::Usage("--expires-in: too long".to_owned()))
        })
        .transpose()?;
    let (uri, mut client) = client(&args.connection)?;
    let message = pb::SetOverrideRequest {
        policy: args.policy,
        scope: Some(args.scope.to_pb()),
        limit: args.limit,
        window_ms,
        burst: args.burst,
        expires_at_ms,
    };
    let response = client
        .set_override(request(message.clone(), args.connection.timeout()))
        .await
        .map_err(|s| status_failure(&uri, s))?
        .into_inner();
    let entry = pb::OverrideEntry {
        policy: message.policy,
        scope: message.scope,
        limit: message.limit,
        window_ms: message.window_ms,
        burst: message.burst,
        expires_at_ms: message.expires_at_ms,
        source: pb::OverrideSource::Runtime.into(),
        ..pb::OverrideEntry::default()
    };
    args.connection.output.line(
        out,
        || {
            let was = response
                .previous
                .as_ref()
                .map_or_else(|| "none".to_owned(), numbers);
            format!("set {}: {} (was {was})", target(&entry), numbers(&entry))
        },
        || {
            serde_json::json!({
                "set": entry_json(&entry),
                "previous": response.previous.as_ref().map(entry_json),
            })
        },
    )?;
    Ok(())
}

async fn rm(args: RmArgs, out: &mut impl Write) -> Result<(), Failure> {
    let (uri, mut client) = client(&args.connection)?;
    let message = pb::RemoveOverrideRequest {
        policy: args.policy.clone(),
        scope: Some(args.scope.to_pb()),
    };
    let response = client
        .remove_override(request(message, args.connection.timeout()))
        .await
        .map_err(|s| status_failure(&uri, s))?
        .into_inner();
    args.connection.output.line(
        out,
        || match &response.previous {
            Some(old) => format!("removed {}: was {}", target(old), numbers(old)),
            None => "no such runtime override; nothing removed".to_owned(),
        },
        || {
            serde_json::json!({
                "removed": response.removed,
                "previous": response.previous.as_ref().map(entry_json),
            })
        },
    )?;
    Ok(())
}

async fn ls(args: LsArgs, out: &mut impl Write) -> Result<(), Failure> {
    let (uri, mut client) = client(&args.connection)?;
    let message = pb::ListOverridesRequest {
        policy: args.policy.unwrap_or_default(),
    };
    let response = client
        .list_overrides(request(message, args.connection.timeout()))
        .await
        .map_err(|s| status_failure(&uri, s))?
        .into_inner();
    let output = args.connection.output;
    if output == Output::Text && !response.in_sync {
        writeln!(
            out,
            "warning: this quotad could not read the store's overrides the last time it tried; it serves the last set it read"
        )?;
    }
    if output == Output::Text && response.overrides.is_empty() {
        writeln!(out, "no overrides")?;
    }
    for entry in &response.overrides {
        output.line(
            out,
            || {
                format!(
                    "{}: {} ({}, set by {})",
                    target(entry),
                    numbers(entry),
                    source(entry),
                    entry.set_by
                )
            },
            || entry_json(entry),
        )?;
    }
    Ok(())
}

/// `policy api key "k"` or `policy api prefix "t:"`.
fn target(entry: &pb::OverrideEntry) -> String {
    let scope = match entry.scope.as_ref().and_then(|s| s.scope.as_ref()) {
        Some(pb::override_scope::Scope::Key(k)) => format!("key {k:?}"),
        Some(pb::override_scope::Scope::Prefix(p)) => format!("prefix {p:?}"),
        None => "(no scope)".to_owned(),
    };
    format!("policy {} {scope}", entry.policy)
}

/// `limit 100 per 1m, burst 200, until ...`.
pub(crate) fn numbers(entry: &pb::OverrideEntry) -> String {
    let mut text = format!("limit {}", entry.limit);
    if let Some(w) = entry.window_ms {
        text.push_str(&format!(" per {}", human(w)));
    } else {
        text.push_str(" per the policy's window");
    }
    if let Some(b) = entry.burst {
        text.push_str(&format!(", burst {b}"));
    }
    if let Some(at) = entry.expires_at_ms {
        let when = std::time::UNIX_EPOCH + Duration::from_millis(at);
        text.push_str(&format!(
            ", until {}",
            humantime::format_rfc3339_millis(when)
        ));
    }
    text
}

fn source(entry: &pb::OverrideEntry) -> &'static str {
    match entry.source() {
        pb::OverrideSource::File => "config file",
        pb::OverrideSource::Runtime => "runtime",
        pb::OverrideSource::Unspecified => "unknown source",
    }
}

pub(crate) fn entry_json(entry: &pb::OverrideEntry) -> serde_json::Value {
    let (kind, value) = match entry.scope.as_ref().and_then(|s| s.scope.as_ref()) {
        Some(pb::override_scope::Scope::Key(k)) => ("key", k.clone()),
        Some(pb::override_scope::Scope::Prefix(p)) => ("prefix", p.clone()),
        None => ("key", String::new()),
    };
    serde_json::json!({
        "policy": entry.policy,
        kind: value,
        "limit": entry.limit,
        "window_ms": entry.window_ms,
        "burst": entry.burst,
        "expires_at_ms": entry.expires_at_ms,
        "source": match entry.source() {
            pb::OverrideSource::File => "file",
            pb::OverrideSource::Runtime => "runtime",
            pb::OverrideSource::Unspecified => "unspecified",
        },
        "set_by": entry.set_by,
        "set_at_ms": entry.set_at_ms,
    })
}
