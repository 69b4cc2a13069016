//! Why requests missed a latency target: how long each waited in the queue and for which load,
//! and who evicted the model it needed.

use std::collections::HashMap;
use std::time::Duration;

use crate::replay::{Happening, Outcome, What};
use crate::trace::Trace;

/// One request past the target, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Late {
    /// Its position in the trace (from 0).
    pub index: usize,
    /// When it arrived, in seconds from the trace's start.
    pub at_s: f64,
    /// Its model.
    pub model: String,
    /// Its replica's id.
    pub replica: String,
    /// Arrival to answer, in milliseconds.
    pub end_to_end_ms: f64,
    /// The reasons, in the order they cost it time.
    pub why: Vec<String>,
}

/// The `limit` slowest requests over `target_ms` end to end, with their reasons.
pub fn explain(trace: &Trace, outcome: &Outcome, target_ms: f64, limit: usize) -> Vec<Late> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut late: Vec<usize> = (0..outcome.served.len())
        .filter(|&i| ms(outcome.served[i].ended - outcome.served[i].arrived) > target_ms)
        .collect();
    late.sort_by(|&a, &b| {
        let took = |i: usize| outcome.served[i].ended - outcome.served[i].arrived;
        took(b).cmp(&took(a)).then(a.cmp(&b))
    });
    late.truncate(limit);
    let timeline = Timeline::new(&outcome.events);
    late.into_iter()
        .map(|i| {
            let s = &outcome.served[i];
            let model = trace.requests[i].model;
            let name = |m: u32| trace.models[m as usize].to_string();
            let replica_name = |r: u16| {
                outcome
                    .replicas
                    .get(r as usize)
                    .cloned()
                    .unwrap_or_default()
            };
            let mut why = Vec::new();
            if !s.ok {
                why.push("refused (queue full, timed out, or its load failed)".to_string());
            }
            let queued = s.started - s.arrived;
            if !queued.is_zero() {
                why.push(format!(
                    "queued {:.1} ms for a free slot on a replica",
                    ms(queued)
                ));
            }
            let waited = s.ready - s.started;
            if !s.hit && s.ok {
                let load = timeline.load_before(s.replica, model, s.ready);
                why.push(match load {
                    Some(started) => format!(
                        "waited {:.1} ms for the load of '{}' on {} (started at {:.3} s)",
                        ms(waited),
                        name(model),
                        replica_name(s.replica),
                        started.as_secs_f64()
                    ),
                    None => format!("waited {:.1} ms for its model's load", ms(waited)),
                });
                if let Some((at, replica, by)) = timeline.eviction_before(model, s.arrived) {
                    why.push(format!(
                        "'{}' had been evicted from {} at {:.3} s{}",
                        name(model),
                        replica_name(replica),
                        at.as_secs_f64(),
                        by.map_or(String::new(), |m| format!(
                            ", to make room for '{}'",
                            name(m)
                        ))
                    ));
                } else {
                    why.push(format!("'{}' had never been loaded before", name(model)));
                }
            }
            let served = s.ended - s.ready;
            why.push(format!("served in {:.1} ms", ms(served)));
            Late {
                index: i,
                at_s: s.arrived.as_secs_f64(),
                model: name(model),
                replica: replica_name(s.replica),
                end_to_end_ms: ms(s.ended - s.arrived),
                why,
            }
        })
        .collect()
}

/// The model events, by model and by replica, for looking back from a request.
struct Timeline<'a> {
    by_model: HashMap<u32, Vec<&'a Happening>>,
    by_replica: HashMap<u16, Vec<&'a Happening>>,
}

impl<'a> Timeline<'a> {
    fn new(events: &'a [Happening]) -> Self {
        let (mut by_model, mut by_replica) = (HashMap::new(), HashMap::new());
        for e in events {
            by_model.entry(e.model).or_insert_with(Vec::new).push(e);
            by_replica.entry(e.replica).or_insert_with(Vec::new).push(e);
        }
        Self {
            by_model,
            by_replica,
        }
    }

    /// When the last load of `model` on `replica` at or before `until` started.
    fn load_before(&self, replica: u16, model: u32, until: Duration) -> Option<Duration> {
        self.by_model
            .get(&model)?
            .iter()
            .rev()
            .find(|e| e.replica == replica && e.what == What::Loading && e.at <= until)
            .map(|e| e.at)
    }

    /// The last eviction of `model` anywhere before `before`: when, where, and the model whose
    /// load on that replica came right after it (what it made room for).
    fn eviction_before(
        &self,
        model: u32,
        before: Duration,
    ) -> Option<(Duration, u16, Option<u32>)> {
        let e = self
            .by_model
            .get(&model)?
            .iter()
            .rev()
            .find(|e| matches!(e.what, What::Evicting(_)) && e.at <= before)?;
        let by = self.by_replica.get(&e.replica).and_then(|events| {
            let from = events.partition_point(|x| x.at < e.at);
            events[from..]
                .iter()
                .find(|x| x.what == What::Loading && x.model != model)
                .map(|x| x.model)
        });
        Some((e.at, e.replica, by))
    }
}
