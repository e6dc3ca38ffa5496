//! The loader: the rules files read and checked, and built into the
//! domains' descriptor trees of [`RlsRules`].
//!
//! What is an error follows the reference's loader (src/config/
//! config_impl.go): an empty or missing `domain` or `key`, a domain in two
//! files (unless [`LoadOptions::merge_domains`]), a key and value twice at
//! one level, a unit other than second..year, a unit beside
//! `unlimited: true`, an empty `replaces` name or one naming its own rule,
//! `share_threshold` without a wildcard value, unknown keys, lists of
//! anything but mappings, and values of the wrong type. Beyond the
//! reference, quotad refuses keys the reference knows but ignores where
//! they stand (a `unit` beside `key` instead of inside `rate_limit`, which
//! there silently leaves the descriptor without a limit), a second YAML
//! document in a file, and limits quotad cannot count exactly.
//!
//! Every check of the reference's format (its
//! fields, units, wildcards, `replaces`, the quotad extensions) stands
//! next to the field it reads, in the order a file is read.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;

use std::time::Duration;

use quotad_core::calendar::{self, Calendar, CalendarError, Period, Weekday, Zone};
use quotad_core::{Algorithm, MAX_EXACT};

use super::rules::{Counting, Domain, Level, Limit, RlsRules, Rule, TreeNode, policy_message};
use super::state::{domain_namespace, push_level};
use super::yaml::{self, Ctx, Node};
use super::{RlsConfigError, Unit};
use crate::policy::{PolicyField, policy_error_field};

/// The largest rules file read: a file is parsed whole in memory, and the
/// largest real-world rule sets are a few hundred kilobytes.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// How files are combined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Whether files naming the same domain are merged into one descriptor
    /// list (the reference's `MERGE_DOMAIN_CONFIG`); otherwise a domain in
    /// two files is an error.
    pub merge_domains: bool,
}

impl RlsRules {
    /// Loads `path`: every `*.yaml` and `*.yml` file directly in it, in
    /// name order, or the one file it names.
    ///
    /// Subdirectories and names starting with `.` are skipped (a Kubernetes
    /// ConfigMap volume keeps its files twice, under `..data/` and as links
    /// beside it); symbolic links are followed.
    ///
    /// # Errors
    ///
    /// The first [`RlsConfigError`]: a file that cannot be read, or a rule
    /// that breaks the format.
    pub fn load(path: &Path, options: LoadOptions) -> Result<RlsRules, RlsConfigError> {
        let texts = RlsRules::read_sources(path)?;
        RlsRules::from_sources(
            texts.iter().map(|(f, t)| (f.as_path(), t.as_str())),
            options,
        )
    }

    /// Reads the files [`RlsRules::load`] would load from `path`, as
    /// `(file, text)` in load order, without loading them (to tell whether
    /// they changed).
    ///
    /// # Errors
    ///
    /// An [`RlsConfigError`] naming the folder or file that cannot be read,
    /// is not UTF-8, or is larger than [`MAX_FILE_BYTES`].
    pub fn read_sources(path: &Path) -> Result<Vec<(PathBuf, String)>, RlsConfigError> {
        let io_error =
            |file: &Path, e: std::io::Error| RlsConfigError::new(file, "", e.to_string());
        let files = if path.is_dir() {
            rule_files(path).map_err(|e| io_error(path, e))?
        } else {
            vec![path.to_owned()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let mut text = String::new();
            open_regular(&file)
                .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
                .map_err(|e| io_error(&file, e))?;
            if text.len() as u64 > MAX_FILE_BYTES {
                return Err(RlsConfigError::new(
                    &file,
                    "",
                    format!(
                        "larger than {} MiB; split the rules over several files",
                        MAX_FILE_BYTES >> 20
                    ),
                ));
            }
            texts.push((file, text));
        }
        Ok(texts)
    }

    /// Loads files already read, as `(name, text)`, in the order given.
    ///
    /// # Errors
    ///
    /// The first [`RlsConfigError`].
    pub fn from_sources<'a>(
        sources: impl IntoIterator<Item = (&'a Path, &'a str)>,
        options: LoadOptions,
    ) -> Result<RlsRules, RlsConfigError> {
        let mut rules = RlsRules::default();
        for (file, text) in sources {
            rules.load_file(file, text, options)?;
        }
        rules.number_rules();
        Ok(rules)
    }

    fn load_file(
        &mut self,
        file: &Path,
        text: &str,
        options: LoadOptions,
    ) -> Result<(), RlsConfigError> {
        let ctx = Ctx { file };
        let Some(doc) = yaml::parse(ctx, text)? else {
            return Err(RlsConfigError::new(
                file,
                "domain",
                "missing: every file names its domain",
            ));
        };
        let mut domain = None;
        let mut descriptors = None;
        for (k, v) in yaml::mapping(ctx, "", &doc).map_err(|_| {
            ctx.error(
                "",
                &doc,
                format!(
                    "must be a mapping with domain and descriptors, not {}",
                    yaml::kind(&doc)
                ),
            )
        })? {
            match yaml::key(ctx, "", k)? {
                "domain" => domain = Some((yaml::string(ctx, "domain", v)?, v)),
                "descriptors" => descriptors = Some(v),
                other => return Err(misplaced(ctx, "", k, other, "the top of a file")),
            }
        }
        let (name, name_node) = match domain {
            Some((name, node)) if !name.is_empty() => (name, node),
            Some((_, node)) => return Err(ctx.error("domain", node, "must not be empty")),
            None => return Err(ctx.error("domain", &doc, "missing: every file names its domain")),
        };
        let file_arc: Arc<Path> = Arc::from(file);
        let entry = match self.domains.get_mut(&name) {
            Some(existing) if !options.merge_domains => {
                return Err(ctx.error(
                    "domain",
                    name_node,
                    format!(
                        "duplicate domain {name:?}, already in {} (merging files of one domain is off)",
                        existing.file.display()
                    ),
                ));
            }
            Some(existing) => existing,
            None => self.domains.entry(name.clone()).or_insert(Domain {
                root: Level::default(),
                file: file_arc.clone(),
            }),
        };
        if let Some(list) = descriptors {
            let loader = Loader {
                ctx,
                file: &file_arc,
            };
            loader.descriptors(
                &mut entry.root,
                "descriptors",
                list,
                &domain_namespace(&name),
            )?;
        }
        Ok(())
    }
}

/// Opens `file` for reading if it is a regular file (after links): never
/// blocks on a FIFO or reads a device, whatever the path turns out to be
/// when it is opened.
fn open_regular(file: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        // Opening a FIFO for reading waits for a writer, unless non-blocking.
        let nonblock = rustix::fs::OFlags::NONBLOCK.bits();
        options.custom_flags(i32::try_from(nonblock).unwrap_or(i32::MAX));
    }
    let opened = options.open(file)?;
    if opened.metadata()?.is_file() {
        Ok(opened)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    }
}

/// The rule files directly in `dir`, sorted by name.
fn rule_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        if yaml && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// An unknown key, or a key of the format in the wrong place (the
/// reference accepts its keys anywhere and ignores them out of place).
fn misplaced(ctx: Ctx<'_>, parent: &str, node: &Node<'_>, key: &str, here: &str) -> RlsConfigError {
    let home = match key {
        "domain" => Some("the top of a file"),
        "descriptors" => Some("the top of a file or a descriptor"),
        "key" | "value" | "rate_limit" | "shadow_mode" | "quota_mode" | "detailed_metric"
        | "value_to_metric" | "share_threshold" | "metadata" => Some("a descriptor"),
        "unit" | "requests_per_unit" | "unlimited" | "replaces" => Some("rate_limit"),
        "name" => Some("rate_limit or a replaces entry"),
        _ => None,
    };
    let path = join(parent, key);
    match home {
        Some(home) => ctx.error(
            &path,
            node,
            format!("{key} is not a field of {here}; it belongs in {home}"),
        ),
        None => ctx.error(&path, node, format!("unknown key {key:?} in {here}")),
    }
}

fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    }
}

/// Reads descriptor lists of one file into a domain's tree.
struct Loader<'a> {
    ctx: Ctx<'a>,
    file: &'a Arc<Path>,
}

/// A descriptor's fields as read, before it joins the tree.
#[derive(Default)]
struct Fields<'n, 'i> {
    key: Option<(String, &'n Node<'i>)>,
    value: String,
    /// The `rate_limit` key (for the rule's line) and its value.
    rate_limit: Option<(&'n Node<'i>, &'n Node<'i>)>,
    descriptors: Option<&'n Node<'i>>,
    metadata: Option<&'n Node<'i>>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: Option<&'n Node<'i>>,
}

/// quotad's settings from `metadata.quotad`.
#[derive(Default)]
struct Extension<'n, 'i> {
    node: Option<&'n Node<'i>>,
    algorithm: Option<(Algorithm, &'n Node<'i>)>,
    burst: Option<(u64, &'n Node<'i>)>,
    /// A calendar period instead of the epoch-aligned unit.
    period: Option<(Period, &'n Node<'i>)>,
    time_zone: Option<(Zone, &'n Node<'i>)>,
    week_start: Option<(Weekday, &'n Node<'i>)>,
    /// A window of any length instead of one unit.
    window: Option<(Duration, &'n Node<'i>)>,
}

/// What a rule's windows are, from its `metadata.quotad` extension: one
/// unit (the reference's), a `window` of any length, or the unit's
/// calendar `period` in `time_zone` (UTC when left out).
fn counting(
    ctx: Ctx<'_>,
    here: &str,
    ext: &Extension<'_, '_>,
    unit: Unit,
) -> Result<Counting, RlsConfigError> {
    let field = |name: &str| format!("{here}.metadata.quotad.{name}");
    let Some((period, at)) = ext.period else {
        if let Some((_, at)) = ext.time_zone {
            return Err(ctx.error(&field("time_zone"), at, "applies only with a period"));
        }
        if let Some((_, at)) = ext.week_start {
            return Err(ctx.error(&field("week_start"), at, "applies only with period: week"));
        }
        return Ok(ext
            .window
            .map_or(Counting::Unit, |(w, _)| Counting::Window(w)));
    };
    if let Some((_, at)) = ext.window {
        return Err(ctx.error(
            &field("window"),
            at,
            "give either window (a fixed length) or period (a calendar day, week, month or year), not both",
        ));
    }
    // The answers report the unit, so the period is the unit's.
    if period.as_str() != unit.as_str() {
        return Err(ctx.error(
            &field("period"),
            at,
            format!(
                "must be the rule's unit ({unit}): Envoy's answers report the unit, and the period is its calendar form"
            ),
        ));
    }
    let period = match (period, ext.week_start) {
        (Period::Week(_), Some((day, _))) => Period::Week(day),
        (_, Some((_, at))) => {
            return Err(ctx.error(&field("week_start"), at, "applies only with period: week"));
        }
        (period, None) => period,
    };
    let zone = ext.time_zone.map_or_else(Zone::utc, |(z, _)| z);
    Ok(Counting::Calendar(Calendar::new(period, zone)))
}

impl Loader<'_> {
    fn descriptors(
        &self,
        level: &mut Level,
        path: &str,
        list: &Node<'_>,
        namespace: &str,
    ) -> Result<(), RlsConfigError> {
        let ctx = self.ctx;
        for (i, item) in yaml::sequence(ctx, path, list)?.iter().enumerate() {
            let here = format!("{path}[{i}]");
            let fields = self.fields(&here, item)?;
            let Some((key, key_node)) = fields.key.clone().filter(|(k, _)| !k.is_empty()) else {
                let at = fields.key.as_ref().map_or(item, |(_, node)| *node);
                return Err(ctx.error(
                    &join(&here, "key"),
                    at,
                    "a descriptor must have a non-empty key",
                ));
            };
            let value = fields.value.clone();
            let mut node_namespace = namespace.to_owned();
            push_level(&mut node_namespace, &key, &value);
            if let Some(at) = fields.share_threshold
                && !value.contains('*')
            {
                return Err(ctx.error(
                    &join(&here, "share_threshold"),
                    at,
                    format!("share_threshold needs a wildcard value (containing '*'); {key}'s value is {value:?}"),
                ));
            }
            let extension = self.extension(&here, fields.metadata)?;
            let rule = match fields.rate_limit.filter(|(_, v)| !yaml::is_null(v)) {
                Some((key, node)) => {
                    let line = key.span.start.line();
                    Some(self.rule(
                        &here,
                        node,
                        line,
                        &fields,
                        &extension,
                        node_namespace.clone(),
                    )?)
                }
                None => {
                    if let Some(at) = extension.node {
                        return Err(ctx.error(
                            &join(&here, "metadata.quotad"),
                            at,
                            "applies to a descriptor with a rate_limit",
                        ));
                    }
                    None
                }
            };
            let mut node = TreeNode {
                rule,
                share_threshold: fields.share_threshold.is_some(),
                children: Level::default(),
            };
            if let Some(children) = fields.descriptors {
                self.descriptors(
                    &mut node.children,
                    &join(&here, "descriptors"),
                    children,
                    &node_namespace,
                )?;
            }
            level.insert(key, value, node).map_err(|(key, value)| {
                let what = if value.is_empty() {
                    format!("key {key:?} without a value")
                } else {
                    format!("key {key:?} with value {value:?}")
                };
                ctx.error(
                    &here,
                    key_node,
                    format!("duplicate descriptor: {what} is already defined at this level"),
                )
            })?;
        }
        Ok(())
    }

    fn fields<'n, 'i>(
        &self,
        here: &str,
        item: &'n Node<'i>,
    ) -> Result<Fields<'n, 'i>, RlsConfigError> {
        let ctx = self.ctx;
        let entries = yaml::mapping(ctx, here, item).map_err(|_| {
            ctx.error(
                here,
                item,
                format!("a descriptor must be a mapping, not {}", yaml::kind(item)),
            )
        })?;
        let mut f = Fields::default();
        for (k, v) in entries {
            let name = yaml::key(ctx, here, k)?;
            let path = join(here, name);
            match name {
                "key" => f.key = Some((yaml::string(ctx, &path, v)?, v)),
                "value" => f.value = yaml::string(ctx, &path, v)?,
                "rate_limit" => f.rate_limit = Some((k, v)),
                "descriptors" => f.descriptors = Some(v),
                "metadata" => f.metadata = Some(v),
                "shadow_mode" => f.shadow_mode = yaml::boolean(ctx, &path, v)?,
                "quota_mode" => f.quota_mode = yaml::boolean(ctx, &path, v)?,
                "detailed_metric" => f.detailed_metric = yaml::boolean(ctx, &path, v)?,
                "value_to_metric" => f.value_to_metric = yaml::boolean(ctx, &path, v)?,
                "share_threshold" => f.share_threshold = yaml::boolean(ctx, &path, v)?.then_some(v),
                other => return Err(misplaced(ctx, here, k, other, "a descriptor")),
            }
        }
        Ok(f)
    }

    fn extension<'n, 'i>(
        &self,
        here: &str,
        metadata: Option<&'n Node<'i>>,
    ) -> Result<Extension<'n, 'i>, RlsConfigError> {
        let ctx = self.ctx;
        let mut ext = Extension::default();
        let Some(metadata) = metadata else {
            return Ok(ext);
        };
        let path = join(here, "metadata");
        let Some((_, node)) = yaml::mapping(ctx, &path, metadata)?
            .into_iter()
            .find(|(k, _)| yaml::key(ctx, &path, k).is_ok_and(|k| k == "quotad"))
        else {
            return Ok(ext);
        };
        ext.node = Some(node);
        let path = join(&path, "quotad");
        for (k, v) in yaml::mapping(ctx, &path, node)? {
            let name = yaml::key(ctx, &path, k)?;
            let field = join(&path, name);
            match name {
                "algorithm" => {
                    let text = yaml::string(ctx, &field, v)?;
                    let algorithm = Algorithm::from_str(&text)
                        .map_err(|e| ctx.error(&field, v, e.to_string()))?;
                    if !algorithm.is_rate() {
                        return Err(ctx.error(
                            &field,
                            v,
                            "concurrency is not a rate: an RLS rule counts requests per unit"
                                .to_owned(),
                        ));
                    }
                    ext.algorithm = Some((algorithm, v));
                }
                "burst" => {
                    let burst = yaml::unsigned(ctx, &field, v, MAX_EXACT)?;
                    ext.burst = Some((burst, v));
                }
                "period" => {
                    let text = yaml::string(ctx, &field, v)?;
                    let period: Period = text
                        .parse()
                        .map_err(|e: CalendarError| ctx.error(&field, v, e.to_string()))?;
                    ext.period = Some((period, v));
                }
                "time_zone" => {
                    let text = yaml::string(ctx, &field, v)?;
                    let zone =
                        Zone::named(&text).map_err(|e| ctx.error(&field, v, e.to_string()))?;
                    ext.time_zone = Some((zone, v));
                }
                "week_start" => {
                    let text = yaml::string(ctx, &field, v)?;
                    let day = calendar::parse_weekday(&text)
                        .map_err(|e| ctx.error(&field, v, e.to_string()))?;
                    ext.week_start = Some((day, v));
                }
                "window" => {
                    let text = yaml::string(ctx, &field, v)?;
                    let window = humantime::parse_duration(&text).map_err(|e| {
                        ctx.error(
                            &field,
                            v,
                            format!("invalid window {text:?} ({e}; e.g. 30s, 5m, 2h)"),
                        )
                    })?;
                    ext.window = Some((window, v));
                }
                other => {
                    return Err(ctx.error(
                        &field,
                        k,
                        format!(
                            "unknown key {other:?} in metadata.quotad (expected algorithm, burst, window, period, time_zone or week_start)"
                        ),
                    ));
                }
            }
        }
        Ok(ext)
    }

    fn rule(
        &self,
        here: &str,
        node: &Node<'_>,
        line: usize,
        fields: &Fields<'_, '_>,
        ext: &Extension<'_, '_>,
        namespace: String,
    ) -> Result<Rule, RlsConfigError> {
        let ctx = self.ctx;
        let path = join(here, "rate_limit");
        let mut unit = None;
        let mut requests_per_unit = None;
        let mut unlimited = false;
        let mut name = String::new();
        let mut replaces = Vec::new();
        for (k, v) in yaml::mapping(ctx, &path, node)? {
            let key = yaml::key(ctx, &path, k)?;
            let field = join(&path, key);
            match key {
                "unit" => unit = Some((yaml::string(ctx, &field, v)?, v)),
                "requests_per_unit" => {
                    let n = yaml::unsigned(ctx, &field, v, u64::from(u32::MAX))?;
                    let n = u32::try_from(n).expect("read with u32::MAX as the bound");
                    requests_per_unit = Some((n, v));
                }
                "unlimited" => unlimited = yaml::boolean(ctx, &field, v)?,
                "name" => name = yaml::string(ctx, &field, v)?,
                "replaces" => replaces = self.replaces(&field, v)?,
                other => return Err(misplaced(ctx, &path, k, other, "rate_limit")),
            }
        }
        // replaces names are never empty, so an unnamed rule cannot match.
        if let Some(i) = replaces.iter().position(|(r, _)| *r == name) {
            return Err(ctx.error(
                &format!("{path}.replaces[{i}].name"),
                replaces[i].1,
                format!("a rule cannot replace itself ({name:?})"),
            ));
        }
        let replaces = replaces.into_iter().map(|(r, _)| r).collect();
        let unit_text = unit
            .as_ref()
            .map(|(text, _)| text.as_str())
            .unwrap_or_default();
        let limit = if unlimited {
            if let Some((text, at)) = unit.as_ref().filter(|(text, _)| !text.is_empty()) {
                return Err(ctx.error(
                    &join(&path, "unit"),
                    at,
                    format!("an unlimited rate_limit takes no unit (got {text:?})"),
                ));
            }
            if let Some(at) = ext.node {
                return Err(ctx.error(
                    &join(here, "metadata.quotad"),
                    at,
                    "does not apply to an unlimited rate_limit",
                ));
            }
            None
        } else {
            let Some(unit_value) = Unit::from_name(unit_text) else {
                let at = unit.as_ref().map_or(node, |(_, at)| *at);
                return Err(ctx.error(
                    &join(&path, "unit"),
                    at,
                    format!(
                        "invalid rate limit unit {unit_text:?} (expected second, minute, hour, day, week, month or year)"
                    ),
                ));
            };
            let rpu = requests_per_unit.map_or(0, |(n, _)| n);
            let algorithm = ext.algorithm.map_or(Algorithm::FixedWindow, |(a, _)| a);
            let burst = ext.burst.map(|(b, _)| b);
            let counting = counting(ctx, here, ext, unit_value)?;
            let limit =
                Limit::counted(rpu, unit_value, algorithm, burst, counting).map_err(|e| {
                    let (field, at) = match policy_error_field(&e) {
                        PolicyField::Limit => {
                            ("requests_per_unit", requests_per_unit.map(|(_, at)| at))
                        }
                        PolicyField::Window | PolicyField::SlotTtl if ext.window.is_some() => {
                            ("window", ext.window.map(|(_, at)| at))
                        }
                        PolicyField::Window | PolicyField::SlotTtl => {
                            ("unit", unit.as_ref().map(|(_, at)| *at))
                        }
                        PolicyField::Period => (
                            "period",
                            ext.period
                                .map(|(_, at)| at)
                                .or(ext.time_zone.map(|(_, at)| at)),
                        ),
                        PolicyField::Burst => ("burst", ext.burst.map(|(_, at)| at)),
                        PolicyField::Algorithm => ("algorithm", ext.algorithm.map(|(_, at)| at)),
                    };
                    let full = match field {
                        "burst" | "algorithm" | "window" | "period" => {
                            format!("{here}.metadata.quotad.{field}")
                        }
                        _ => join(&path, field),
                    };
                    ctx.error(
                        &full,
                        at.unwrap_or(node),
                        policy_message(&e, rpu, unit_value, algorithm),
                    )
                })?;
            Some(limit)
        };
        Ok(Rule {
            index: 0,
            namespace,
            file: self.file.clone(),
            line,
            name,
            replaces,
            limit,
            shadow_mode: fields.shadow_mode,
            quota_mode: fields.quota_mode,
            detailed_metric: fields.detailed_metric,
            value_to_metric: fields.value_to_metric,
        })
    }

    fn replaces<'n, 'i>(
        &self,
        path: &str,
        list: &'n Node<'i>,
    ) -> Result<Vec<(String, &'n Node<'i>)>, RlsConfigError> {
        let ctx = self.ctx;
        let mut names = Vec::new();
        for (i, item) in yaml::sequence(ctx, path, list)?.iter().enumerate() {
            let here = format!("{path}[{i}]");
            let mut name = None;
            for (k, v) in yaml::mapping(ctx, &here, item).map_err(|_| {
                ctx.error(
                    &here,
                    item,
                    format!("must be a mapping with a name, not {}", yaml::kind(item)),
                )
            })? {
                match yaml::key(ctx, &here, k)? {
                    "name" => name = Some(yaml::string(ctx, &join(&here, "name"), v)?),
                    other => return Err(misplaced(ctx, &here, k, other, "a replaces entry")),
                }
            }
            match name.filter(|n| !n.is_empty()) {
                Some(name) => names.push((name, item)),
                None => {
                    return Err(ctx.error(
                        &join(&here, "name"),
                        item,
                        "a replaces entry needs a non-empty name",
                    ));
                }
            }
        }
        Ok(names)
    }
}
