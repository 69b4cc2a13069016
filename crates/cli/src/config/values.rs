//! Numbers and names of the configuration that serde checks while parsing, so an error
//! carries the value's line.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

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

/// Checks numbers inside the scalar's own deserialization, so errors carry its line.
pub(super) struct Checked<F>(&'static str, F);

impl<'de, T, F: FnOnce(f64) -> Option<T>> serde::de::Visitor<'de> for Checked<F> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
        (self.1)(n as f64)
            .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Signed(n), &self.0))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
        (self.1)(n as f64)
            .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self.0))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<T, E> {
        (self.1)(n).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Float(n), &self.0))
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

/// A positive number of seconds.
#[derive(Debug, Clone, Copy)]
pub struct Seconds(pub Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked("a positive number of seconds", |s: f64| {
            (s.is_finite() && (0.001..1e9).contains(&s))
                .then(|| Seconds(Duration::from_secs_f64(s)))
        }))
    }
}

/// `download.attempts`: at least 1.
#[derive(Debug, Clone, Copy)]
pub struct Attempts(pub NonZeroU32);

impl<'de> Deserialize<'de> for Attempts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked(
            "a whole number of download attempts, at least 1",
            |n: f64| {
                (n.fract() == 0.0 && (1.0..=1000.0).contains(&n))
                    .then(|| Attempts(NonZeroU32::new(n as u32).expect("n >= 1")))
            },
        ))
    }
}
