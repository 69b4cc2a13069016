//! The decision: how many replicas a deployment should have, from its load over the look-back
//! window. Ray's replica-queue-length policy (Ray 2.60, `python/ray/serve/autoscaling_policy.py`)
//! step for step: the desired count is the load over the target per replica, moved toward by
//! the scaling factors and always rounded up; a wish to move must last its delay (measured in
//! time, not in ticks, so a slow tick cannot stretch it), a scale-down stops at one replica
//! and goes to none only after `downscale_to_zero_delay`, and a deployment at zero with
//! requests waiting starts a replica at once. The bounds apply last.
//!
//! One input Ray has no counterpart for: the replicas that loads need. A request waiting for
//! a load behind other models' loads (every load slot busy) is a shortage of load slots, not
//! of request slots, and Ray's count of requests cannot see it; the desired count is at least
//! the replicas whose load slots would take the loads in flight and queued at once.

use tokio::time::Instant;

use super::config::AutoscalingConfig;

/// What the decision is made from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    /// Replicas running (started and in routing).
    pub(crate) running: usize,
    /// The replica count last decided (running, or about to be).
    pub(crate) target: usize,
    /// Requests running plus queued, over the window.
    pub(crate) requests: f64,
    /// Replicas whose load slots would run every load wanted now at once (0: no load waits).
    pub(crate) for_loads: usize,
}

/// Which way the deployment wishes to move, and since when.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Wish {
    Up(Instant),
    Down(Instant),
}

/// Ray's allowance for float error when comparing a wish's age with its delay.
const EPSILON_S: f64 = 1e-6;

/// One deployment's decision state: the wish to move, while it lasts.
#[derive(Debug, Default)]
pub(crate) struct Decider {
    wish: Option<Wish>,
}

impl Decider {
    /// The replica count `config` wants for `load` at `now`, within its bounds.
    pub(crate) fn decide(&mut self, config: &AutoscalingConfig, load: Load, now: Instant) -> usize {
        config.bound(self.unbounded(config, load, now))
    }

    fn unbounded(&mut self, config: &AutoscalingConfig, load: Load, now: Instant) -> usize {
        // Requests wait and nothing runs: one start (more with a factor above 1), at once.
        if load.running == 0 && (load.requests > 0.0 || load.for_loads > 0) {
            self.wish = None;
            return (config.upscaling_factor.ceil() as usize).max(load.target);
        }
        if load.running == 0 {
            return load.target;
        }
        let raw = (load.requests / config.target_ongoing_requests).max(load.for_loads as f64);
        let desired = with_factors(config, raw, load.running);
        self.delayed(config, desired, load.target, now)
    }

    /// `desired` if the wish to move to it from `target` has lasted its delay, else `target`.
    fn delayed(
        &mut self,
        config: &AutoscalingConfig,
        desired: usize,
        target: usize,
        now: Instant,
    ) -> usize {
        let lasted = |since: Instant, delay: std::time::Duration| {
            now.saturating_duration_since(since).as_secs_f64() + EPSILON_S >= delay.as_secs_f64()
        };
        if desired > target {
            let since = match self.wish {
                Some(Wish::Up(since)) => since,
                _ => now,
            };
            self.wish = Some(Wish::Up(since));
            if lasted(since, config.upscale_delay) {
                self.wish = None;
                return desired;
            }
            target
        } else if desired < target {
            // Down to one replica on the downscale delay; from one to none on its own.
            let (desired, delay) = if target == 1 {
                let to_zero = config.downscale_to_zero_delay;
                (desired, to_zero.unwrap_or(config.downscale_delay))
            } else {
                (desired.max(1), config.downscale_delay)
            };
            let since = match self.wish {
                Some(Wish::Down(since)) => since,
                _ => now,
            };
            self.wish = Some(Wish::Down(since));
            if lasted(since, delay) {
                self.wish = None;
                return desired;
            }
            target
        } else {
            self.wish = None;
            target
        }
    }
}

/// A step from `current` toward `raw` (the load over the target), scaled by the factor of its
/// direction and rounded up, as Ray's `_apply_scaling_factors`: a scaled-down step that would
/// round back to `current` takes one replica away, so a small factor still converges.
fn with_factors(config: &AutoscalingConfig, raw: f64, current: usize) -> usize {
    let current_f = current as f64;
    let factor = if raw > current_f {
        config.upscaling_factor
    } else {
        config.downscaling_factor
    };
    let scaled = (current_f + factor * (raw - current_f)).ceil().max(0.0) as usize;
    if (raw.ceil() as usize) < current && scaled == current {
        return current - 1;
    }
    scaled
}

#[cfg(test)]
mod tests;
