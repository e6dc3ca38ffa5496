//! Which keys a run sends, and how often each.

use std::fmt;
use std::str::FromStr;

use rand::Rng as _;
use rand::rngs::SmallRng;
use rand_distr::{Distribution as _, Zipf};

/// The most distinct keys a run may use; every key is formatted before the
/// run starts, so this bounds the memory the generator takes for them.
pub(crate) const MAX_KEYS: u64 = 10_000_000;

/// How the key of each check is drawn.
///
/// Written as `hot`, `uniform:N` or `zipf:N[:S]` (the exponent `S` defaults
/// to 1.0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Every check uses the same key.
    Hot,
    /// Each check draws one of `keys` keys, each equally likely.
    Uniform {
        /// How many distinct keys.
        keys: u64,
    },
    /// Each check draws one of `keys` keys; the key of rank k (from 1) is
    /// drawn with a probability proportional to 1 / k^`exponent`.
    Zipf {
        /// How many distinct keys.
        keys: u64,
        /// The exponent; 0 is uniform, larger is more skewed.
        exponent: f64,
    },
}

/// A key distribution that cannot be parsed or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseKeysError {
    /// Not `hot`, `uniform:N` or `zipf:N[:S]`.
    #[error("expected hot, uniform:N or zipf:N[:S], got {0:?}")]
    Syntax(String),
    /// The key count is not an integer in range.
    #[error("key count must be an integer from 1 to {MAX_KEYS}, got {0:?}")]
    Count(String),
    /// The zipf exponent is not a finite number >= 0.
    #[error("zipf exponent must be a finite number >= 0, got {0:?}")]
    Exponent(String),
}

impl FromStr for KeyDistribution {
    type Err = ParseKeysError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let count = |n: &str| match n.parse::<u64>() {
            Ok(n) if (1..=MAX_KEYS).contains(&n) => Ok(n),
            _ => Err(ParseKeysError::Count(n.to_owned())),
        };
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            ["hot"] => Ok(Self::Hot),
            ["uniform", n] => Ok(Self::Uniform { keys: count(n)? }),
            ["zipf", n] => Ok(Self::Zipf {
                keys: count(n)?,
                exponent: 1.0,
            }),
            ["zipf", n, s] => match s.parse::<f64>() {
                Ok(exponent) if exponent.is_finite() && exponent >= 0.0 => Ok(Self::Zipf {
                    keys: count(n)?,
                    exponent,
                }),
                _ => Err(ParseKeysError::Exponent((*s).to_owned())),
            },
            _ => Err(ParseKeysError::Syntax(text.to_owned())),
        }
    }
}

impl fmt::Display for KeyDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hot => f.write_str("hot"),
            Self::Uniform { keys } => write!(f, "uniform:{keys}"),
            Self::Zipf { keys, exponent } => write!(f, "zipf:{keys}:{exponent}"),
        }
    }
}

/// The keys of a run, formatted once before it starts, and the sampler
/// that picks one per check.
#[derive(Debug)]
pub(crate) struct KeyPool {
    keys: Vec<String>,
    sampler: Sampler,
}

#[derive(Debug)]
enum Sampler {
    Hot,
    Uniform,
    Zipf(Zipf<f64>),
}

impl KeyPool {
    /// Formats the keys of `distribution` as `{prefix}{index}` (or
    /// `{prefix}hot`).
    ///
    /// # Errors
    ///
    /// [`ParseKeysError`] for a distribution built by hand with a key count
    /// or exponent that parsing would have rejected.
    pub(crate) fn new(distribution: KeyDistribution, prefix: &str) -> Result<Self, ParseKeysError> {
        let check_count = |keys: u64| {
            if (1..=MAX_KEYS).contains(&keys) {
                usize::try_from(keys).map_err(|_| ParseKeysError::Count(keys.to_string()))
            } else {
                Err(ParseKeysError::Count(keys.to_string()))
            }
        };
        let numbered = |n: usize| (0..n).map(|i| format!("{prefix}{i}")).collect();
        match distribution {
            KeyDistribution::Hot => Ok(Self {
                keys: vec![format!("{prefix}hot")],
                sampler: Sampler::Hot,
            }),
            KeyDistribution::Uniform { keys } => Ok(Self {
                keys: numbered(check_count(keys)?),
                sampler: Sampler::Uniform,
            }),
            KeyDistribution::Zipf { keys, exponent } => {
                let n = check_count(keys)?;
                // u64 -> f64 is exact up to 2^53, far above MAX_KEYS.
                #[allow(clippy::cast_precision_loss)]
                let zipf = Zipf::new(keys as f64, exponent)
                    .map_err(|_| ParseKeysError::Exponent(exponent.to_string()))?;
                Ok(Self {
                    keys: numbered(n),
                    sampler: Sampler::Zipf(zipf),
                })
            }
        }
    }

    /// Draws the key of the next check.
    pub(crate) fn sample(&self, rng: &mut SmallRng) -> &str {
        let index = match &self.sampler {
            Sampler::Hot => 0,
            Sampler::Uniform => rng.random_range(0..self.keys.len()),
            // Zipf draws an integral rank in [1, n]; rank 1 is the hottest.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Sampler::Zipf(zipf) => (zipf.sample(rng) as usize).saturating_sub(1),
        };
        self.keys
            .get(index)
            .or_else(|| self.keys.last())
            .map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    #[test]
    fn parses_every_written_form() {
        assert_eq!("hot".parse(), Ok(KeyDistribution::Hot));
        assert_eq!(
            "uniform:1000".parse(),
            Ok(KeyDistribution::Uniform { keys: 1000 })
        );
        assert_eq!(
            "zipf:50".parse(),
            Ok(KeyDistribution::Zipf {
                keys: 50,
                exponent: 1.0
            })
        );
        assert_eq!(
            "zipf:50:1.2".parse(),
            Ok(KeyDistribution::Zipf {
                keys: 50,
                exponent: 1.2
            })
        );
    }

    #[test]
    fn rejects_counts_and_exponents_out_of_range() {
        assert!(matches!(
            "uniform:0".parse::<KeyDistribution>(),
            Err(ParseKeysError::Count(_))
        ));
        assert!(matches!(
            "uniform:x".parse::<KeyDistribution>(),
            Err(ParseKeysError::Count(_))
        ));
        assert!(matches!(
            "zipf:10:-1".parse::<KeyDistribution>(),
            Err(ParseKeysError::Exponent(_))
        ));
        assert!(matches!(
            "zipf:10:NaN".parse::<KeyDistribution>(),
            Err(ParseKeysError::Exponent(_))
        ));
        assert!(matches!(
            "cold".parse::<KeyDistribution>(),
            Err(ParseKeysError::Syntax(_))
        ));
    }

    #[test]
    fn display_round_trips() {
        for text in ["hot", "uniform:7", "zipf:9:1.5"] {
            let parsed: KeyDistribution = text.parse().expect("valid");
            assert_eq!(parsed.to_string().parse::<KeyDistribution>(), Ok(parsed));
        }
    }

    #[test]
    fn zipf_draws_stay_in_range_and_favour_the_first_key() {
        let pool = KeyPool::new(
            KeyDistribution::Zipf {
                keys: 100,
                exponent: 1.0,
            },
            "k",
        )
        .expect("valid");
        let mut rng = SmallRng::seed_from_u64(7);
        let mut first = 0;
        for _ in 0..10_000 {
            let key = pool.sample(&mut rng);
            let index: usize = key[1..].parse().expect("numbered key");
            assert!(index < 100);
            first += usize::from(index == 0);
        }
        // 1 / H(100) is about 19% of draws.
        assert!((1_500..2_400).contains(&first), "{first}");
    }

    #[test]
    fn uniform_draws_cover_every_key() {
        let pool = KeyPool::new(KeyDistribution::Uniform { keys: 10 }, "u").expect("valid");
        let mut rng = SmallRng::seed_from_u64(1);
        let mut seen = [false; 10];
        for _ in 0..1_000 {
            let index: usize = pool.sample(&mut rng)[1..].parse().expect("numbered key");
            seen[index] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
