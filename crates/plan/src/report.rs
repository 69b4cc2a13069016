//! What one replay says about its setting: hits, loads, waits, how busy the replicas were, how
//! many copies each model had, and how far the hit ratio is from Belady's optimum.

use std::time::Duration;

use crate::belady::belady_hits;
use crate::replay::{Outcome, Setting, What};
use crate::trace::Trace;

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The largest.
    pub max: f64,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_by(f64::total_cmp);
        // The nearest-rank percentile: the smallest value at or above p% of them.
        let at =
            |p: f64| ms[((p / 100.0 * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Self {
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: ms[ms.len() - 1],
        }
    }
}

/// How many replicas held a model at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopiesAt {
    /// Seconds from the trace's start.
    pub at_s: f64,
    /// The models with more than one copy then, and their copies (most first, at most 10).
    pub replicated: Vec<(String, usize)>,
    /// Models held anywhere then.
    pub models_held: usize,
}

/// One replay's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The setting replayed.
    pub setting: Setting,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests refused or failed (queue full, timed out, load failed).
    pub refused: usize,
    /// Of the requests a replica took, the share whose model it held when they arrived.
    pub hit_ratio: f64,
    /// Belady's hit ratio for the same slots pooled (replicas x models per replica): the most
    /// any cache could have.
    pub belady_hit_ratio: f64,
    /// Loads started.
    pub loads: u64,
    /// Loads per second of the trace.
    pub loads_per_s: f64,
    /// Waits in the router's queue, until a replica took the request.
    pub queue_ms: Percentiles,
    /// Waits for a model's load, once a replica had the request.
    pub load_wait_ms: Percentiles,
    /// Arrival to answer.
    pub end_to_end_ms: Percentiles,
    /// Per replica, the share of the time it served at least one request.
    pub utilisation: Vec<f64>,
    /// Copies per model at regular moments of the trace.
    pub copies: Vec<CopiesAt>,
    /// The most copies any model had at any moment.
    pub max_copies: usize,
    /// The trace's span in seconds (first arrival to last).
    pub span_s: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Report {
    /// The figures of `outcome`, a replay of `trace` under `setting`.
    pub fn new(trace: &Trace, setting: &Setting, outcome: &Outcome) -> Self {
        let served = &outcome.served;
        let taken: Vec<_> = served.iter().filter(|s| s.ok).collect();
        let hits = taken.iter().filter(|s| s.hit).count();
        let slots = setting
            .max_models
            .map_or(usize::MAX, |m| m.saturating_mul(setting.replicas));
        let seq: Vec<u32> = trace.requests.iter().map(|r| r.model).collect();
        let span = trace.span().max(Duration::from_millis(1));
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let (copies, max_copies) = copies_over_time(trace, outcome, 20);
        Self {
            setting: setting.clone(),
            requests: served.len(),
            refused: served.len() - taken.len(),
            hit_ratio: ratio(hits, taken.len()),
            belady_hit_ratio: ratio(belady_hits(&seq, slots) as usize, seq.len()),
            loads: outcome.loads,
            loads_per_s: outcome.loads as f64 / span.as_secs_f64(),
            queue_ms: Percentiles::of(taken.iter().map(|s| ms(s.started - s.arrived)).collect()),
            load_wait_ms: Percentiles::of(taken.iter().map(|s| ms(s.ready - s.started)).collect()),
            end_to_end_ms: Percentiles::of(taken.iter().map(|s| ms(s.ended - s.arrived)).collect()),
            utilisation: utilisation(outcome),
            copies,
            max_copies,
            span_s: trace.span().as_secs_f64(),
        }
    }

    /// The report as text, a line per figure.
    pub fn to_text(&self) -> String {
        let s = &self.setting;
        let p = |x: &Percentiles| {
            format!(
                "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
                x.p50, x.p90, x.p99, x.max
            )
        };
        let cap = s.max_models.map_or("no cap".into(), |m| m.to_string());
        let mean_util = self.utilisation.iter().sum::<f64>() / self.utilisation.len().max(1) as f64;
        format!(
            "setting: {} replicas, {} models per replica{}, {} concurrent loads, {}\n\
             requests: {} over {:.1} s ({} refused)\n\
             hit ratio: {:.4}  (Belady's optimum for {} slots: {:.4})\n\
             loads: {} ({:.3}/s)\n\
             queue wait ms:   {}\n\
             load wait ms:    {}\n\
             end to end ms:   {}\n\
             replica utilisation: mean {:.3} (each: {})\n\
             copies: at most {} of one model\n",
            s.replicas,
            cap,
            s.max_bytes
                .map_or(String::new(), |b| format!(", {b} bytes")),
            s.max_concurrent_loads,
            crate::policy_name(s.eviction),
            self.requests,
            self.span_s,
            self.refused,
            self.hit_ratio,
            s.max_models
                .map_or("unbounded".into(), |m| (m * s.replicas).to_string()),
            self.belady_hit_ratio,
            self.loads,
            self.loads_per_s,
            p(&self.queue_ms),
            p(&self.load_wait_ms),
            p(&self.end_to_end_ms),
            mean_util,
            self.utilisation
                .iter()
                .map(|u| format!("{u:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            self.max_copies,
        )
    }
}

/// Per replica, the share of the replay during which it served at least one request.
fn utilisation(outcome: &Outcome) -> Vec<f64> {
    let span = outcome.span.as_secs_f64().max(1e-9);
    let mut intervals: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); outcome.replicas.len()];
    for s in outcome.served.iter().filter(|s| s.ok) {
        if let Some(v) = intervals.get_mut(s.replica as usize) {
            v.push((s.ready, s.ended));
        }
    }
    intervals
        .into_iter()
        .map(|mut v| {
            v.sort();
            let (mut busy, mut until) = (Duration::ZERO, Duration::ZERO);
            for (from, to) in v {
                let from = from.max(until);
                if to > from {
                    busy += to - from;
                    until = to;
                }
            }
            busy.as_secs_f64() / span
        })
        .collect()
}

/// Copies of each model at `points` regular moments, and the most any model had.
fn copies_over_time(trace: &Trace, outcome: &Outcome, points: usize) -> (Vec<CopiesAt>, usize) {
    let span = outcome.span.max(Duration::from_millis(1));
    let mut copies = vec![0usize; trace.models.len()];
    let mut held = std::collections::HashSet::new();
    let (mut out, mut max) = (Vec::new(), 0);
    let mut events = outcome.events.iter().peekable();
    for k in 1..=points {
        let at = span.mul_f64(k as f64 / points as f64);
        while let Some(e) = events.next_if(|e| e.at <= at) {
            let key = (e.replica, e.model);
            match e.what {
                What::Loaded if held.insert(key) => copies[e.model as usize] += 1,
                What::Evicting(_) | What::Failed if held.remove(&key) => {
                    copies[e.model as usize] -= 1;
                }
                _ => {}
            }
            max = max.max(copies[e.model as usize]);
        }
        let mut replicated: Vec<(String, usize)> = copies
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 1)
            .map(|(m, c)| (trace.models[m].to_string(), *c))
            .collect();
        replicated.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        replicated.truncate(10);
        out.push(CopiesAt {
            at_s: at.as_secs_f64(),
            replicated,
            models_held: copies.iter().filter(|c| **c > 0).count(),
        });
    }
    (out, max)
}
