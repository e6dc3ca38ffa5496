//! Arbitrary text through configuration loading, `Config::from_toml`: the
//! function `quotad serve` and `quotad validate-config` run on the file
//! (without the flags and environment layered over it).
//!
//! Run it in an empty working directory: a `[server.tls]` section makes the
//! loader read the files it names, and relative names then find nothing.

use quotad::{Config, ConfigError};

/// Loads `data` (as UTF-8, lossily) and checks the outcome.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Config::from_toml(&text) {
        Ok(config) => {
            let again = Config::from_toml(&text).expect("text accepted once is accepted again");
            assert!(
                config.restart_required_changes(&again).is_empty(),
                "the same text loaded twice differs"
            );
            for (name, settings) in config.policies() {
                assert!(
                    quotad::policy::validate_policy_name(name).is_ok(),
                    "{name:?}"
                );
                let _ = settings.policy.capacity();
            }
        }
        Err(error) => check_error(&error),
    }
}

/// A refusal says what is wrong, and where when it is about a field.
fn check_error(error: &ConfigError) {
    let message = error.to_string();
    assert!(!message.trim().is_empty(), "an empty error: {error:?}");
    if let ConfigError::Invalid { field, .. } = error {
        assert!(
            !field.is_empty(),
            "an invalid value names its field: {message}"
        );
    }
}
