//! Tests of the RLS rules: loading (what is an error, and where) and
//! matching (which rule, which state, which charge).

mod calendar;
mod load;
mod matching;

use std::path::Path;

use super::{LoadOptions, RlsConfigError, RlsRules};

/// Loads one file named `rules.yaml`.
fn rules(text: &str) -> RlsRules {
    load(text).unwrap_or_else(|e| panic!("{e}"))
}

fn load(text: &str) -> Result<RlsRules, RlsConfigError> {
    RlsRules::from_sources([(Path::new("rules.yaml"), text)], LoadOptions::default())
}

/// The error of loading one file, as displayed.
fn load_error(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("loaded:\n{text}"),
        Err(e) => e.to_string(),
    }
}
