//! `quotad batch`: several checks in one `CheckBatch`, from arguments or a
//! JSON file, independent or all or nothing.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use quotad_client::{BatchMode, Check, PolicyRef};
use quotad_core::{Algorithm, Policy};
use serde::Deserialize;
use serde_json::json;

use super::args::{Connected, Connection, policy_label};
use super::check::{Verb, check_of, decision_json, describe};
use super::{Failure, failure};

/// `quotad batch`.
#[derive(Debug, clap::Args)]
pub(crate) struct BatchArgs {
    #[command(flatten)]
    connection: Connection,
    /// One check: POLICY:KEY or POLICY:KEY:COST, under a named policy
    /// (repeat it for each item)
    #[arg(
        long = "item",
        value_name = "POLICY:KEY[:COST]",
        required_unless_present = "file"
    )]
    items: Vec<String>,
    /// The checks as a JSON array: {"key": "alice", "cost": 1, "policy":
    /// "login"}, or an inline "policy": {"algorithm": "fixed_window",
    /// "limit": 5, "window": "1m", "burst": 10}
    #[arg(long, value_name = "FILE", conflicts_with = "items")]
    file: Option<PathBuf>,
    /// Consume nothing unless every item is allowed (ALL_OR_NOTHING);
    /// otherwise each item is decided on its own
    #[arg(long)]
    all_or_nothing: bool,
}

/// An item of `--file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Item {
    key: String,
    #[serde(default = "one")]
    cost: u64,
    policy: ItemPolicy,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum ItemPolicy {
    Named(String),
    Inline {
        algorithm: String,
        limit: u64,
        window: String,
        #[serde(default)]
        burst: Option<u64>,
    },
}

/// The most items one batch may carry (quotad's own bound).
const MAX_ITEMS: usize = 1_000;

impl BatchArgs {
    fn checks(&self) -> Result<Vec<Check>, Failure> {
        let checks = match &self.file {
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| Failure::Usage(format!("--file {}: {e}", file.display())))?;
                let items: Vec<Item> = serde_json::from_str(&text)
                    .map_err(|e| Failure::Usage(format!("--file {}: {e}", file.display())))?;
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| {
                        from_file(item).map_err(|e| {
                            Failure::Usage(format!("--file {}: item {i}: {e}", file.display()))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => self
                .items
                .iter()
                .map(|item| {
                    from_argument(item).map_err(|e| Failure::Usage(format!("--item {item}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        match checks.len() {
            0 => Err(Failure::Usage("a batch needs at least one item".to_owned())),
            n if n > MAX_ITEMS => Err(Failure::Usage(format!(
                "a batch holds at most {MAX_ITEMS} items (got {n})"
            ))),
            _ => Ok(checks),
        }
    }
}

/// `POLICY:KEY` or `POLICY*COST:KEY`: the key is everything after the
/// first colon (keys such as `user:42` stay whole), since a policy name
/// has neither `:` nor `*`.
fn from_argument(item: &str) -> Result<Check, String> {
    let (head, key) = item
        .split_once(':')
        .ok_or("write POLICY:KEY or POLICY*COST:KEY")?;
    let (policy, cost) = match head.split_once('*') {
        Some((policy, cost)) => (policy, cost_of(cost)?),
        None => (head, 1),
    };
    if policy.is_empty() || key.is_empty() {
        return Err("the policy and the key are not empty".to_owned());
    }
    Ok(Check::named(policy, key).cost(cost))
}

/// A cost as written: a whole number of at least 1.
fn cost_of(text: &str) -> Result<u64, String> {
    super::check::at_least_one(text).map_err(|e| format!("cost {text:?}: {e}"))
}

fn from_file(item: Item) -> Result<Check, String> {
    if item.cost == 0 {
        return Err("cost: must be at least 1".to_owned());
    }
    let policy = match item.policy {
        ItemPolicy::Named(name) => PolicyRef::Named(name),
        ItemPolicy::Inline {
            algorithm,
            limit,
            window,
            burst,
        } => {
            let algorithm: Algorithm = algorithm
                .parse()
                .map_err(|e| format!("policy.algorithm: {e}"))?;
            let window: Duration = humantime::parse_duration(&window)
                .map_err(|e| format!("policy.window: {window:?}: {e}"))?;
            let policy = Policy::try_new(algorithm, limit, window, burst).map_err(|e| {
                let field = quotad::policy::policy_error_field(&e).config_name();
                format!("policy.{field}: {e}")
            })?;
            PolicyRef::Inline(policy)
        }
    };
    let check = check_of(policy, item.key);
    Ok(check.cost(item.cost))
}

/// Sends the batch and prints each item's decision, then a total.
///
/// # Errors
///
/// [`Failure::Usage`] for items that cannot be sent (nothing is sent then);
/// [`Failure::Failed`] as `check`.
pub(crate) async fn batch(args: BatchArgs, mut out: impl Write) -> Result<(), Failure> {
    let checks = args.checks()?;
    let mode = if args.all_or_nothing {
        BatchMode::AllOrNothing
    } else {
        BatchMode::Independent
    };
    let Connected {
        uri,
        client,
        output,
    } = args.connection.connect(None)?;
    let decisions = client
        .check_batch(&checks, mode)
        .await
        .map_err(|error| failure(&uri, error))?;
    let width = checks.len().to_string().len();
    for (n, (check, decision)) in checks.iter().zip(&decisions).enumerate() {
        let label = || policy_label(check.policy());
        output.line(
            &mut out,
            || {
                format!(
                    "#{:<width$}  {} under {}  {}",
                    n + 1,
                    check.key(),
                    label(),
                    describe(decision, check.cost_units(), Verb::Checked)
                )
            },
            || {
                let mut object = decision_json(decision);
                object["n"] = json!(n + 1);
                object["key"] = json!(check.key());
                object["policy"] = json!(label());
                object
            },
        )?;
    }
    let allowed = decisions.iter().filter(|d| d.allowed).count();
    output.line(
        &mut out,
        || {
            format!(
                "{} items: {allowed} allowed, {} denied{}",
                decisions.len(),
                decisions.len() - allowed,
                if args.all_or_nothing { " (all or nothing)" } else { "" }
            )
        },
        || json!({"total": {"items": decisions.len(), "allowed": allowed, "denied": decisions.len() - allowed, "all_or_nothing": args.all_or_nothing}}),
    )?;
    Ok(())
}
