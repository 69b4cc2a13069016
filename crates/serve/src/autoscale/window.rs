//! The look-back window: the deployment's load (requests running plus queued) as a step
//! function of time, reduced to one figure as Ray reduces its merged metrics: the
//! time-weighted mean, the peak or the trough over the last `look_back_period`.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::config::Aggregation;

/// Samples of one gauge, oldest first; each holds until the next.
#[derive(Debug, Default)]
pub(crate) struct Window {
    samples: VecDeque<(Instant, f64)>,
}

impl Window {
    /// Records that the gauge reads `value` from `at` on (samples come in time order).
    pub(crate) fn record(&mut self, at: Instant, value: f64) {
        self.samples.push_back((at, value));
    }

    /// The gauge over the last `look_back` before `now`, reduced by `how`; the window starts
    /// no earlier than the first sample (a window partly before any sample would count time
    /// nobody measured). 0 with no samples.
    pub(crate) fn aggregate(&mut self, now: Instant, look_back: Duration, how: Aggregation) -> f64 {
        let start = now.checked_sub(look_back).unwrap_or(now);
        // Keep the last sample at or before the window's start: its value covers the start.
        while self.samples.len() > 1 && self.samples[1].0 <= start {
            self.samples.pop_front();
        }
        let Some(&(first, _)) = self.samples.front() else {
            return 0.0;
        };
        let start = start.max(first);
        let mut weighted = 0.0;
        let mut peak = f64::MIN;
        let mut trough = f64::MAX;
        for (k, &(at, value)) in self.samples.iter().enumerate() {
            let from = at.max(start);
            let to = self.samples.get(k + 1).map_or(now, |&(next, _)| next);
            weighted += value * to.saturating_duration_since(from).as_secs_f64();
            peak = peak.max(value);
            trough = trough.min(value);
        }
        let span = now.saturating_duration_since(start).as_secs_f64();
        match how {
            // A window of no length (the first sample just taken): its value.
            Aggregation::Mean if span <= 0.0 => self.samples.back().map_or(0.0, |s| s.1),
            Aggregation::Mean => weighted / span,
            Aggregation::Max => peak,
            Aggregation::Min => trough,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ray's own example (`_private/autoscaling_state.py`, the docstring of
    /// `get_total_num_requests`): two replicas' running counts and a handle's queue, merged,
    /// at `now` = 2.0 s. The merged total steps 10 (0.3 s), 12 (0.8), 13 (0.9), 14 (1.0), 18
    /// (1.4), 17 (1.5); the window starts at 0.3, when every source has reported: the mean
    /// is 23.4 / 1.7 = 13.76, the peak 18, the trough 10.
    #[tokio::test(start_paused = true)]
    async fn rays_worked_example_gives_its_mean_peak_and_trough() {
        let origin = Instant::now();
        let at = |s: f64| origin + Duration::from_secs_f64(s);
        let series = [
            (0.3, 10.0),
            (0.8, 12.0),
            (0.9, 13.0),
            (1.0, 14.0),
            (1.4, 18.0),
            (1.5, 17.0),
        ];
        let window = || {
            let mut w = Window::default();
            for (t, v) in series {
                w.record(at(t), v);
            }
            w
        };
        let look_back = Duration::from_secs(30);
        let mean = window().aggregate(at(2.0), look_back, Aggregation::Mean);
        assert!((mean - 23.4 / 1.7).abs() < 1e-9, "{mean}");
        assert_eq!(
            window().aggregate(at(2.0), look_back, Aggregation::Max),
            18.0
        );
        assert_eq!(
            window().aggregate(at(2.0), look_back, Aggregation::Min),
            10.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_look_back_period_counts_and_old_samples_are_dropped() {
        let origin = Instant::now();
        let at = |s: u64| origin + Duration::from_secs(s);
        let mut w = Window::default();
        w.record(at(0), 100.0);
        w.record(at(10), 2.0);
        w.record(at(20), 4.0);
        // Window [15, 25]: 2 for 5 s, 4 for 5 s.
        let mean = w.aggregate(at(25), Duration::from_secs(10), Aggregation::Mean);
        assert!((mean - 3.0).abs() < 1e-9, "{mean}");
        assert_eq!(
            w.samples.len(),
            2,
            "the sample of 100 lies wholly before the window"
        );
        assert_eq!(
            w.aggregate(at(25), Duration::from_secs(10), Aggregation::Max),
            4.0
        );
        assert_eq!(
            Window::default().aggregate(at(1), Duration::from_secs(1), Aggregation::Mean),
            0.0
        );
    }
}
