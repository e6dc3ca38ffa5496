//! `[rlqs]`, validated: where Envoy's RLQS bucket rules are. The rules
//! themselves are read and checked by `policy::rlqs` (at start, by
//! `quotad validate-config`, and on every reload).

use std::path::{Path, PathBuf};

use super::policies::Invalid;
use super::settings::RlqsSection;

/// `[rlqs]`: the bucket rules file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RlqsSettings {
    /// `rlqs.rules`, resolved against the config file's folder when the
    /// file gave it; `None` denies every bucket.
    pub rules: Option<PathBuf>,
}

impl RlqsSettings {
    /// Validates `[rlqs]`; `base_dir` resolves a relative `rules` from the
    /// file.
    pub(super) fn validate(
        section: RlqsSection,
        base_dir: Option<&Path>,
    ) -> Result<RlqsSettings, Invalid> {
        if section
            .rules
            .as_ref()
            .is_some_and(|r| r.as_os_str().is_empty())
        {
            return Err((
                vec!["rlqs".to_owned(), "rules".to_owned()],
                "must name a file (leave it out to deny every bucket)".to_owned(),
            ));
        }
        let rules = section.rules.map(|file| match base_dir {
            Some(base) if file.is_relative() => base.join(file).components().collect(),
            _ => file,
        });
        Ok(RlqsSettings { rules })
    }
}
