//! Why a configuration cannot be used, and where the bad value came from.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::policy::rls::RlsConfigError;

/// A configuration that cannot be used. The message names the field.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("invalid TOML: {message}{}", Origin::File(*line))]
    Syntax {
        /// The parser's message.
        message: String,
        /// The line of the error, 1-based.
        line: Option<usize>,
    },
    /// A value is missing, of the wrong type, or breaks a rule.
    #[error("{field}: {message}{origin}")]
    Invalid {
        /// The field's path, such as `policies.login.limit`.
        field: String,
        /// What is wrong.
        message: String,
        /// Where the value came from.
        origin: Origin,
    },
    /// A file of `rls.config_dir` breaks the RLS rules format; the message
    /// names the file, the field and the line.
    #[error(transparent)]
    Rls(#[from] RlsConfigError),
}

impl ConfigError {
    /// The path of the offending field, when one is known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Rls(error) if !error.field().is_empty() => Some(error.field()),
            _ => None,
        }
    }
}

/// Where an invalid value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The config file, at this 1-based line when known.
    File(Option<usize>),
    /// A command-line flag or environment variable.
    Flag,
    /// A default combined with other values.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(Some(line)) => write!(f, " (line {line})"),
            Origin::File(None) | Origin::Default => Ok(()),
            Origin::Flag => f.write_str(" (from a flag or environment variable)"),
        }
    }
}
