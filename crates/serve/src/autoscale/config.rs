//! A deployment's autoscaling settings: Ray Serve's `autoscaling_config`, its keys, meanings
//! and defaults (Ray 2.60's `AutoscalingConfig`), and the preset `num_replicas: "auto"` stands
//! for.

use std::time::Duration;

/// How the samples of the look-back window become one figure (Ray's `aggregation_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// The time-weighted mean over the window (Ray's default).
    #[default]
    Mean,
    /// The window's peak.
    Max,
    /// The window's trough.
    Min,
}

impl Aggregation {
    /// Parses Ray's names, in any case: `mean`, `max`, `min`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "mean" => Some(Self::Mean),
            "max" => Some(Self::Max),
            "min" => Some(Self::Min),
            _ => None,
        }
    }
}

/// How a deployment's replica count follows its load. The fields are Ray's keys (seconds as
/// [`Duration`]s); [`Default`] gives Ray's class defaults, [`AutoscalingConfig::auto`] the
/// preset of `num_replicas: "auto"`.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalingConfig {
    /// Fewest replicas (Ray's default 1). 0 lets the deployment scale to zero: requests that
    /// arrive then wait in its queue while a replica starts.
    pub min_replicas: usize,
    /// Most replicas (default 1; at least 1).
    pub max_replicas: usize,
    /// Replicas to start with (default `min_replicas`).
    pub initial_replicas: Option<usize>,
    /// Requests (running plus queued) per replica the pool is sized for (default 2).
    pub target_ongoing_requests: f64,
    /// How long the wish to scale up must last before it is acted on (default 30 s).
    pub upscale_delay: Duration,
    /// How long the wish to scale down (to one replica or more) must last (default 600 s).
    pub downscale_delay: Duration,
    /// How long the wish to go from one replica to none must last (default: `downscale_delay`).
    pub downscale_to_zero_delay: Option<Duration>,
    /// The share of an upward step taken at once (default 1: all of it).
    pub upscaling_factor: f64,
    /// The share of a downward step taken at once (default 1).
    pub downscaling_factor: f64,
    /// Ray's metrics push period (default 10 s; deprecated there). Accepted and checked: the
    /// counts are read in process here, every control tick, so nothing waits for a push.
    pub metrics_interval: Duration,
    /// The window the load is averaged over (default 30 s).
    pub look_back_period: Duration,
    /// How the window's samples are reduced (default the mean).
    pub aggregation: Aggregation,
}

impl Default for AutoscalingConfig {
    fn default() -> Self {
        Self {
            min_replicas: 1,
            max_replicas: 1,
            initial_replicas: None,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
            downscale_to_zero_delay: None,
            upscaling_factor: 1.0,
            downscaling_factor: 1.0,
            metrics_interval: Duration::from_secs(10),
            look_back_period: Duration::from_secs(30),
            aggregation: Aggregation::Mean,
        }
    }
}

impl AutoscalingConfig {
    /// What `num_replicas: "auto"` means, as in Ray (2.10 and later): 1 to 100 replicas, 2
    /// requests per replica, the other keys at their defaults. Keys given beside it override.
    pub fn auto() -> Self {
        Self {
            max_replicas: 100,
            ..Self::default()
        }
    }

    /// Replicas at start: `initial_replicas`, else `min_replicas`.
    pub fn start_replicas(&self) -> usize {
        self.initial_replicas.unwrap_or(self.min_replicas)
    }

    /// `n` within `min_replicas..=max_replicas`.
    pub fn bound(&self, n: usize) -> usize {
        n.clamp(self.min_replicas, self.max_replicas)
    }

    /// Checks the keys together (Ray's rules): `max_replicas` at least 1, `min_replicas` ≤
    /// `initial_replicas` ≤ `max_replicas`, a positive finite target and factors, a positive
    /// look-back period and metrics interval. The message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_replicas == 0 {
            return Err("max_replicas must be at least 1".into());
        }
        if self.min_replicas > self.max_replicas {
            return Err(format!(
                "min_replicas ({}) is above max_replicas ({})",
                self.min_replicas, self.max_replicas
            ));
        }
        if let Some(initial) = self.initial_replicas
            && !(self.min_replicas..=self.max_replicas).contains(&initial)
        {
            return Err(format!(
                "initial_replicas ({initial}) must be between min_replicas ({}) and max_replicas ({})",
                self.min_replicas, self.max_replicas
            ));
        }
        for (key, value) in [
            ("target_ongoing_requests", self.target_ongoing_requests),
            ("upscaling_factor", self.upscaling_factor),
            ("downscaling_factor", self.downscaling_factor),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!("{key} must be a positive number, not {value}"));
            }
        }
        for (key, value) in [
            ("look_back_period_s", self.look_back_period),
            ("metrics_interval_s", self.metrics_interval),
        ] {
            if value.is_zero() {
                return Err(format!("{key} must be positive"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_the_auto_preset_are_rays() {
        // Ray 2.60, python/ray/serve/config.py (AutoscalingConfig and its `default()`).
        let d = AutoscalingConfig::default();
        assert_eq!((d.min_replicas, d.max_replicas), (1, 1));
        assert_eq!(d.target_ongoing_requests, 2.0);
        assert_eq!(d.upscale_delay, Duration::from_secs(30));
        assert_eq!(d.downscale_delay, Duration::from_secs(600));
        assert_eq!(d.look_back_period, Duration::from_secs(30));
        assert_eq!(d.aggregation, Aggregation::Mean);
        let auto = AutoscalingConfig::auto();
        assert_eq!((auto.min_replicas, auto.max_replicas), (1, 100));
        assert_eq!(auto.start_replicas(), 1);
    }

    #[test]
    fn inconsistent_keys_are_refused_by_name() {
        let bad = |f: fn(&mut AutoscalingConfig)| {
            let mut c = AutoscalingConfig::auto();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.max_replicas = 0).contains("max_replicas"));
        assert!(bad(|c| c.min_replicas = 101).contains("min_replicas"));
        assert!(bad(|c| c.initial_replicas = Some(200)).contains("initial_replicas"));
        assert!(bad(|c| c.target_ongoing_requests = 0.0).contains("target_ongoing_requests"));
        assert!(bad(|c| c.upscaling_factor = f64::NAN).contains("upscaling_factor"));
        assert!(bad(|c| c.look_back_period = Duration::ZERO).contains("look_back_period_s"));
        assert_eq!(Aggregation::parse("MAX"), Some(Aggregation::Max));
        assert_eq!(Aggregation::parse("median"), None);
    }
}
