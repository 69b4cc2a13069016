//! Numbers and names of the configuration that serde checks while parsing, so an error
//! carries the value's line.

use modelmux_types::Checked;
use serde::Deserialize;

pub use modelmux_types::{Attempts, Seconds};

/// `eviction_policy`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionPolicyName {
    /// Least recently used first.
    Lru,
    /// Greedy-Dual-Size-Frequency (the default).
    #[default]
    Gdsf,
}

/// `max_models_per_replica`: at least 1, or -1 for no limit.
#[derive(Debug, Clone, Copy)]
pub struct ModelCap(pub Option<usize>);

impl Default for ModelCap {
    fn default() -> Self {
        Self(Some(3))
    }
}

impl<'de> Deserialize<'de> for ModelCap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked(
            "a whole number of at least 1, or -1 for no limit",
            |n: f64| match n {
                -1.0 => Some(ModelCap(None)),
                n if n >= 1.0 && n.fract() == 0.0 && n < 1e12 => Some(ModelCap(Some(n as usize))),
                _ => None,
            },
        ))
    }
}
