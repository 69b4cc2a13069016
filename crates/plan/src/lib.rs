//! `modelmux-plan`: what a deployment needs for a given workload, found before traffic
//! arrives.
//!
//! A [`Trace`] (modelmux's own access log, or a CSV or JSON lines of arrivals) is
//! [replayed](replay()) through the server's own router and model caches on a paused Tokio
//! clock: the same placement, queue, single-flight loads and eviction the server runs, with
//! stand-in models whose loads and requests take the trace's (or the configuration's) times.
//! A replay runs as fast as that code (tens of thousands of requests a second, whatever the
//! trace's rate). A [`Report`] gives the hit ratio (and Belady's optimum for the same slots),
//! loads per second, queue, load and end-to-end percentiles, replica utilisation and copies
//! per model; a [search](search::search) over replicas, caps, load slots and eviction policies
//! finds the cheapest setting that meets a latency and hit-ratio target, and the frontier of
//! the others.

pub mod belady;
pub mod explain;
pub mod plot;
pub mod replay;
pub mod report;
pub mod search;
pub mod trace;

pub use replay::{Costs, Outcome, ReplayError, Setting, replay};
pub use report::Report;
pub use trace::{Trace, TraceError};

use modelmux_cache::EvictionPolicy;

/// An eviction policy's name in the configuration (`lru`, `gdsf`).
pub fn policy_name(p: EvictionPolicy) -> &'static str {
    match p {
        EvictionPolicy::Lru => "lru",
        EvictionPolicy::Gdsf => "gdsf",
    }
}

/// The eviction policy of a configuration's name.
pub fn policy_of(name: &str) -> Option<EvictionPolicy> {
    match name {
        "lru" => Some(EvictionPolicy::Lru),
        "gdsf" => Some(EvictionPolicy::Gdsf),
        _ => None,
    }
}
