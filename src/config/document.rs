//! The layers of a configuration — declared defaults, the file, then flags
//! and environment — merged into one TOML table before the single
//! deserialization, remembering where each value came from so that an
//! error can say it.

use serde::de::DeserializeOwned;
use toml::{Table, Value};

use super::error::{ConfigError, Origin};
use super::flags::FlagValues;
use super::settings::{self, Kind, Setting};

/// The merged configuration, with what is needed to locate a field.
pub(crate) struct Layers<'a> {
    text: &'a str,
    /// The file's parse tree, with spans.
    spans: toml::de::DeValue<'a>,
    /// Defaults, then the file, then the flags.
    merged: Table,
    flagged: Vec<&'static str>,
    defaulted: Vec<&'static str>,
}

impl<'a> Layers<'a> {
    /// Parses `text` and merges `flags` and the declared defaults into
    /// it.
    pub(crate) fn merge(text: &'a str, flags: &FlagValues) -> Result<Self, ConfigError> {
        let spans = toml::de::DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
        let merged: Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let mut layers = Layers {
            text,
            spans: toml::de::DeValue::Table(spans.into_inner()),
            merged,
            flagged: Vec::new(),
            defaulted: Vec::new(),
        };
        for (setting, values) in flags.iter() {
            let value = flag_value(setting, values)?;
            set(&mut layers.merged, setting, value, true);
            layers.flagged.push(setting.path);
        }
        for setting in settings::all() {
            let Some(default) = setting.default else {
                continue;
            };
            let value = flag_value(setting, &[default.to_owned()])
                .expect("the declared defaults are valid values of their kind");
            if set(&mut layers.merged, setting, value, false) {
                layers.defaulted.push(setting.path);
            }
        }
        Ok(layers)
    }

    /// The merged table, as it will be deserialized.
    pub(crate) fn merged(&self) -> &Table {
        &self.merged
    }

    /// Deserializes the merged table, naming the path of the first field
    /// that is missing, unknown or of the wrong type.
    pub(crate) fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        serde_path_to_error::deserialize(Value::Table(self.merged.clone())).map_err(|e| {
            use serde_path_to_error::Segment;
            let segments: Vec<String> = e
                .path()
                .iter()
                .map(|segment| match segment {
                    Segment::Map { key } => key.clone(),
                    Segment::Seq { index } => index.to_string(),
                    Segment::Enum { variant } => variant.clone(),
                    Segment::Unknown => "?".to_owned(),
                })
                .collect();
            let path: Vec<&str> = segments.iter().map(String::as_str).collect();
            // Keys are written as in the file (an empty or dotted key
            // quoted), so every field has a name.
            let field = if path.is_empty() {
                "(top level)".to_owned()
            } else {
                super::display_path(&path)
            };
            ConfigError::Invalid {
                field,
                message: e.into_inner().message().to_owned(),
                origin: self.origin_of(&path),
            }
        })
    }

    /// Where the value at `path` came from.
    pub(crate) fn origin_of(&self, path: &[&str]) -> Origin {
        let joined = path.join(".");
        if self.flagged.iter().any(|p| *p == joined) {
            Origin::Flag
        } else if self.defaulted.iter().any(|p| *p == joined) {
            Origin::Default
        } else {
            Origin::File(self.line_of(path))
        }
    }

    /// The line of the value at `path` in the file, or of its nearest
    /// enclosing table that is in the file.
    fn line_of(&self, path: &[&str]) -> Option<usize> {
        let mut node = &self.spans;
        let mut found = None;
        for segment in path {
            // An array's element by its index (`overrides.0.limit`).
            let next = match (node, segment.parse::<usize>()) {
                (toml::de::DeValue::Array(items), Ok(i)) => items.get(i),
                _ => node.get(*segment),
            };
            match next {
                Some(value) => {
                    found = Some(value.span().start);
                    node = value.get_ref();
                }
                None => break,
            }
        }
        found.map(|offset| line_at(self.text, offset))
    }
}

/// The TOML value of a flag's text, by the setting's kind.
fn flag_value(setting: &Setting, values: &[String]) -> Result<Value, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        field: setting.path.to_owned(),
        message,
        origin: Origin::Flag,
    };
    let one = || values.first().map(String::as_str).unwrap_or_default();
    Ok(match setting.kind {
        Kind::Str | Kind::Table => Value::String(one().to_owned()),
        Kind::Int => Value::Integer(
            one()
                .parse()
                .map_err(|e| invalid(format!("{:?} is not an integer: {e}", one())))?,
        ),
        Kind::Bool => Value::Boolean(
            one()
                .parse()
                .map_err(|_| invalid(format!("{:?} is not true or false", one())))?,
        ),
        Kind::List => Value::Array(
            values
                .iter()
                .flat_map(|v| v.split(','))
                .map(|v| Value::String(v.trim().to_owned()))
                .collect(),
        ),
    })
}

/// Writes `value` at the setting's path. A flag's value creates the tables on
/// the way; a default fills only a table that exists (or a top-level
/// section), and never replaces a value. Returns whether it wrote.
fn set(table: &mut Table, setting: &Setting, value: Value, create: bool) -> bool {
    let keys: Vec<&str> = setting.keys().collect();
    let (last, parents) = keys.split_last().expect("a setting path is never empty");
    let mut node = table;
    for (depth, key) in parents.iter().enumerate() {
        if !(node.contains_key(*key) || create || depth == 0) {
            return false;
        }
        let entry = node
            .entry((*key).to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        node = match entry {
            Value::Table(t) => t,
            // A scalar where a table belongs: deserialization reports it.
            _ => return false,
        };
    }
    if !create && node.contains_key(*last) {
        return false;
    }
    node.insert((*last).to_owned(), value);
    true
}

fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigError {
    ConfigError::Syntax {
        message: error.message().to_owned(),
        line: error.span().map(|span| line_at(text, span.start)),
    }
}

/// The 1-based line holding byte `offset` of `text`.
fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
