//! `num_replicas: auto` and `autoscaling_config`, with Ray Serve's keys: what a deployment's
//! YAML says about scaling, checked as it parses (a wrong value names its line) and turned
//! into the serve layer's [`AutoscalingConfig`]. Keys left out take Ray's defaults: those of
//! the `auto` preset (1 to 100 replicas) with `num_replicas: auto`, else Ray's class defaults
//! (`max_replicas: 1`).

use std::num::NonZeroUsize;
use std::time::Duration;

use modelmux_serve::{Aggregation, AutoscalingConfig};
use modelmux_types::Checked;
use serde::Deserialize;

/// `num_replicas`: a whole number of at least 1, or `auto` (autoscaling with Ray's preset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaCount {
    /// This many, fixed (unless `autoscaling_config` is given too: refused).
    Fixed(NonZeroUsize),
    /// Autoscaled, from Ray's `auto` preset.
    Auto,
}

impl ReplicaCount {
    /// The fixed count, if it is one.
    pub fn fixed(self) -> Option<usize> {
        match self {
            Self::Fixed(n) => Some(n.get()),
            Self::Auto => None,
        }
    }
}

impl<'de> Deserialize<'de> for ReplicaCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ReplicaCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number of replicas of at least 1, or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<ReplicaCount, E> {
                usize::try_from(n)
                    .ok()
                    .and_then(NonZeroUsize::new)
                    .map(ReplicaCount::Fixed)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<ReplicaCount, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ReplicaCount, E> {
                if s == "auto" {
                    Ok(ReplicaCount::Auto)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Seconds of delay: 0 or more (Ray's non-negative delays).
#[derive(Debug, Clone, Copy)]
pub struct Delay(Duration);

impl<'de> Deserialize<'de> for Delay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked("a number of seconds, 0 or more", |s: f64| {
            (s.is_finite() && (0.0..1e9).contains(&s)).then(|| Delay(Duration::from_secs_f64(s)))
        }))
    }
}

/// A positive number (a target, a factor).
#[derive(Debug, Clone, Copy)]
pub struct Positive(f64);

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked("a positive number", |x: f64| {
            (x.is_finite() && x > 0.0).then_some(Positive(x))
        }))
    }
}

/// `autoscaling_config`, Ray's keys (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingYaml {
    /// Fewest replicas (0: scale to zero).
    pub min_replicas: Option<usize>,
    /// Most replicas.
    pub max_replicas: Option<usize>,
    /// Replicas at start.
    pub initial_replicas: Option<usize>,
    /// Requests per replica sized for.
    pub target_ongoing_requests: Option<Positive>,
    /// Seconds a wish to scale up must last.
    pub upscale_delay_s: Option<Delay>,
    /// Seconds a wish to scale down must last.
    pub downscale_delay_s: Option<Delay>,
    /// Seconds a wish to go from one replica to none must last.
    pub downscale_to_zero_delay_s: Option<Delay>,
    /// The share of an upward step taken at once.
    pub upscaling_factor: Option<Positive>,
    /// The share of a downward step taken at once.
    pub downscaling_factor: Option<Positive>,
    /// Ray's deprecated fallback for both factors.
    pub smoothing_factor: Option<Positive>,
    /// Ray's deprecated name of `upscaling_factor`.
    pub upscale_smoothing_factor: Option<Positive>,
    /// Ray's deprecated name of `downscaling_factor`.
    pub downscale_smoothing_factor: Option<Positive>,
    /// Ray's metrics push period, in seconds (accepted and checked; counts are read in process).
    pub metrics_interval_s: Option<Positive>,
    /// Seconds the load is averaged over.
    pub look_back_period_s: Option<Positive>,
    /// `mean`, `max` or `min`.
    pub aggregation_function: Option<String>,
}

impl AutoscalingYaml {
    /// The serve layer's settings: these keys over Ray's defaults (`auto`'s preset if
    /// `auto`), checked together; the message names the key.
    pub fn resolve(&self, auto: bool) -> Result<AutoscalingConfig, String> {
        let mut c = if auto {
            AutoscalingConfig::auto()
        } else {
            AutoscalingConfig::default()
        };
        let set = |field: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *field = v;
            }
        };
        set(&mut c.min_replicas, self.min_replicas);
        set(&mut c.max_replicas, self.max_replicas);
        c.initial_replicas = self.initial_replicas;
        let delay = |field: &mut Duration, v: Option<Delay>| {
            if let Some(Delay(v)) = v {
                *field = v;
            }
        };
        delay(&mut c.upscale_delay, self.upscale_delay_s);
        delay(&mut c.downscale_delay, self.downscale_delay_s);
        c.downscale_to_zero_delay = self.downscale_to_zero_delay_s.map(|d| d.0);
        if let Some(Positive(t)) = self.target_ongoing_requests {
            c.target_ongoing_requests = t;
        }
        // Ray's order: the factor, else its deprecated name, else `smoothing_factor`.
        let factor = |a: Option<Positive>, b: Option<Positive>| {
            a.or(b).or(self.smoothing_factor).map_or(1.0, |p| p.0)
        };
        c.upscaling_factor = factor(self.upscaling_factor, self.upscale_smoothing_factor);
        c.downscaling_factor = factor(self.downscaling_factor, self.downscale_smoothing_factor);
        if let Some(Positive(s)) = self.metrics_interval_s {
            c.metrics_interval = Duration::from_secs_f64(s);
        }
        if let Some(Positive(s)) = self.look_back_period_s {
            c.look_back_period = Duration::from_secs_f64(s);
        }
        if let Some(name) = &self.aggregation_function {
            c.aggregation = Aggregation::parse(name).ok_or_else(|| {
                format!("aggregation_function: '{name}' is not one of mean, max, min")
            })?;
        }
        c.validate()?;
        Ok(c)
    }
}

/// A deployment's scaling from its `num_replicas` and `autoscaling_config`: `None` for a
/// fixed count. Both a fixed count and `autoscaling_config` is refused, as Ray refuses it.
pub(super) fn resolve(
    num_replicas: Option<ReplicaCount>,
    autoscaling: Option<&AutoscalingYaml>,
) -> Result<Option<AutoscalingConfig>, String> {
    match (num_replicas, autoscaling) {
        (Some(ReplicaCount::Fixed(_)), Some(_)) => Err(
            "num_replicas is a fixed number and autoscaling_config is given: give one of them (or num_replicas: auto)".into(),
        ),
        (Some(ReplicaCount::Auto), a) => a.cloned().unwrap_or_default().resolve(true).map(Some),
        (None, Some(a)) => a.resolve(false).map(Some),
        (_, None) => Ok(None),
    }
}

#[cfg(feature = "python")]
/// A Python deployment's scaling, from its decorator's `num_replicas` and
/// `autoscaling_config` (checked by the same rules as the YAML's; `None`: a fixed count).
pub(super) fn from_python(
    options: &modelmux_python::DeploymentOptions,
) -> Result<Option<AutoscalingConfig>, String> {
    let num_replicas = match &options.num_replicas {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(ReplicaCount::deserialize(v).map_err(|e| format!("num_replicas: {e}"))?),
    };
    let autoscaling = match &options.autoscaling_config {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => {
            Some(AutoscalingYaml::deserialize(v).map_err(|e| format!("autoscaling_config: {e}"))?)
        }
    };
    resolve(num_replicas, autoscaling.as_ref())
}
