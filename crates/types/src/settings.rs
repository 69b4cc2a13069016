//! Setting values checked while YAML (or any serde format) is parsed, so an error names the
//! value's line: durations in seconds, counts of attempts. Shared by every crate whose settings
//! a configuration file holds.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

/// Checks numbers inside the scalar's own deserialization, so errors carry its line: the
/// message says what was expected, the function turns a number into a value (or refuses it).
pub struct Checked<F>(pub &'static str, pub F);

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
