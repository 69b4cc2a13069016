//! The search: every setting of a grid replayed (on as many threads as the machine has), the
//! cheapest that meets the targets, and the frontier of the others.
//!
//! What a setting costs is, in order: its replicas (a replica is a pod, a GPU, a process),
//! then the model slots they hold in all (memory), then its concurrent loads (bandwidth to
//! the store); a setting is cheaper than another when it is less at the first of these that
//! differs. The frontier is the settings that no cheaper-or-equal setting beats on both p99
//! and hit ratio.

use std::sync::atomic::{AtomicUsize, Ordering};

use modelmux_cache::EvictionPolicy;

use crate::replay::{Costs, ReplayError, Setting, replay};
use crate::report::Report;
use crate::trace::Trace;

/// The values to try for each knob; the grid is their product.
#[derive(Debug, Clone)]
pub struct Grid {
    /// Replica counts.
    pub replicas: Vec<usize>,
    /// Models per replica.
    pub max_models: Vec<usize>,
    /// Concurrent loads per replica.
    pub max_concurrent_loads: Vec<usize>,
    /// Eviction policies.
    pub policies: Vec<EvictionPolicy>,
}

impl Grid {
    /// Every setting of the grid, built on `base` (its other fields kept), cheapest first.
    pub fn settings(&self, base: &Setting) -> Vec<Setting> {
        let mut out = Vec::new();
        for &replicas in &self.replicas {
            for &models in &self.max_models {
                for &loads in &self.max_concurrent_loads {
                    for &eviction in &self.policies {
                        out.push(Setting {
                            replicas,
                            max_models: Some(models),
                            max_concurrent_loads: loads,
                            eviction,
                            ..base.clone()
                        });
                    }
                }
            }
        }
        out.sort_by_key(cost);
        out
    }
}

/// A setting's cost, compared in order (see the module's documentation).
pub fn cost(s: &Setting) -> (usize, usize, usize) {
    let slots = s
        .max_models
        .map_or(usize::MAX, |m| m.saturating_mul(s.replicas));
    (s.replicas, slots, s.max_concurrent_loads)
}

/// What a setting must reach.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    /// End-to-end p99 at most, in milliseconds.
    pub p99_ms: Option<f64>,
    /// Hit ratio at least.
    pub min_hit_ratio: Option<f64>,
}

impl Targets {
    /// Whether `r` meets every target, with the reasons it does not.
    pub fn misses(&self, r: &Report) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p99) = self.p99_ms
            && r.end_to_end_ms.p99 > p99
        {
            out.push(format!("p99 {:.1} ms > {p99} ms", r.end_to_end_ms.p99));
        }
        if let Some(min) = self.min_hit_ratio
            && r.hit_ratio < min
        {
            out.push(format!("hit ratio {:.4} < {min}", r.hit_ratio));
        }
        if r.refused > 0 {
            out.push(format!("{} requests refused", r.refused));
        }
        out
    }
}

/// A search's answer: every setting's report (cheapest first), which are on the frontier, and
/// the cheapest that meets the targets.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Search {
    /// Every setting's report, cheapest first.
    pub reports: Vec<Report>,
    /// Indices into `reports` of the frontier.
    pub frontier: Vec<usize>,
    /// Index into `reports` of the cheapest setting meeting the targets.
    pub cheapest: Option<usize>,
}

/// Replays `trace` under every setting, `threads` at a time, calling `progress` with how many
/// are done.
pub fn search(
    trace: &Trace,
    settings: &[Setting],
    costs: &Costs,
    targets: &Targets,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Search, ReplayError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Vec<parking_lot::Mutex<Option<Result<Report, ReplayError>>>> = settings
        .iter()
        .map(|_| parking_lot::Mutex::new(None))
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, settings.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(setting) = settings.get(i) else {
                        break;
                    };
                    let report = replay(trace, setting, costs, &|_| {})
                        .map(|outcome| Report::new(trace, setting, &outcome));
                    *results[i].lock() = Some(report);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    });
    let reports = results
        .into_iter()
        .map(|r| r.into_inner().expect("every setting was replayed"))
        .collect::<Result<Vec<_>, _>>()?;
    let frontier = frontier(&reports);
    // Of the settings that meet the targets, the least cost; among equals, the lowest p99,
    // then the highest hit ratio (so the answer is on the frontier).
    let cheapest = (0..reports.len())
        .filter(|&i| targets.misses(&reports[i]).is_empty())
        .min_by(|&a, &b| {
            let (ra, rb) = (&reports[a], &reports[b]);
            cost(&ra.setting)
                .cmp(&cost(&rb.setting))
                .then(ra.end_to_end_ms.p99.total_cmp(&rb.end_to_end_ms.p99))
                .then(rb.hit_ratio.total_cmp(&ra.hit_ratio))
        });
    Ok(Search {
        reports,
        frontier,
        cheapest,
    })
}

/// The reports (cheapest first) that no cheaper-or-equal one beats on both p99 and hit ratio.
fn frontier(reports: &[Report]) -> Vec<usize> {
    (0..reports.len())
        .filter(|&i| {
            let r = &reports[i];
            !reports.iter().enumerate().any(|(j, o)| {
                j != i
                    && cost(&o.setting) <= cost(&r.setting)
                    && o.end_to_end_ms.p99 <= r.end_to_end_ms.p99
                    && o.hit_ratio >= r.hit_ratio
                    && (o.end_to_end_ms.p99 < r.end_to_end_ms.p99
                        || o.hit_ratio > r.hit_ratio
                        || cost(&o.setting) < cost(&r.setting)
                        || j < i)
            })
        })
        .collect()
}

impl Search {
    /// The frontier as a table, the cheapest meeting the targets marked.
    pub fn table(&self, targets: &Targets) -> String {
        let mut out = String::from(
            "| replicas | models/replica | loads | policy | hit ratio | Belady | loads/s | p50 ms | p99 ms | meets |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
        );
        for &i in &self.frontier {
            let r = &self.reports[i];
            let s = &r.setting;
            let misses = targets.misses(r);
            let meets = if Some(i) == self.cheapest {
                "**cheapest**".to_string()
            } else if misses.is_empty() {
                "yes".to_string()
            } else {
                misses.join("; ")
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:.4} | {:.4} | {:.3} | {:.1} | {:.1} | {} |\n",
                s.replicas,
                s.max_models.map_or("-".into(), |m| m.to_string()),
                s.max_concurrent_loads,
                crate::policy_name(s.eviction),
                r.hit_ratio,
                r.belady_hit_ratio,
                r.loads_per_s,
                r.end_to_end_ms.p50,
                r.end_to_end_ms.p99,
                meets
            ));
        }
        out
    }
}
