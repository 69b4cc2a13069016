//! Replays a trace file under one setting (8 replicas x 64 models, 4 load slots, GDSF, 50 ms
//! loads, 5 ms requests: `bench/plan.yaml`) and prints the wall time: a profiling aid for the
//! replay's own cost, without the CLI.
//!   cargo run --release -p modelmux-plan --example replay_speed -- TRACE.csv
//! It prints how long the parse, the replay and the report (Belady included) each took.
// The wall time a replay takes, which the paused Tokio clock it runs on cannot tell.
#![allow(clippy::disallowed_types)]

use std::time::{Duration, Instant};

use modelmux_cache::EvictionPolicy;
use modelmux_plan::{Costs, Report, Setting, Trace, replay};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: replay_speed TRACE")?;
    let start = Instant::now();
    let trace = Trace::parse(&std::fs::read_to_string(path)?)?;
    let parsed = start.elapsed();
    let setting = Setting {
        replicas: 8,
        max_models: Some(64),
        max_bytes: None,
        max_concurrent_loads: 4,
        eviction: EvictionPolicy::Gdsf,
        max_ongoing_requests: None,
        max_queued_requests: None,
        queue_timeout: None,
    };
    let costs = Costs {
        load: Duration::from_millis(50),
        service: Duration::from_millis(5),
        size_bytes: None,
    };
    let start = Instant::now();
    let outcome = replay(&trace, &setting, &costs, &|_| {})?;
    let took = start.elapsed();
    let start = Instant::now();
    let report = Report::new(&trace, &setting, &outcome);
    let reported = start.elapsed();
    let hits = outcome.served.iter().filter(|s| s.hit).count();
    println!(
        "{} requests: parsed in {:.2} s, replayed in {:.2} s, reported in {:.2} s: hit ratio \
         {:.4} (Belady {:.4}), {} loads",
        outcome.served.len(),
        parsed.as_secs_f64(),
        took.as_secs_f64(),
        reported.as_secs_f64(),
        hits as f64 / outcome.served.len() as f64,
        report.belady_hit_ratio,
        outcome.loads
    );
    Ok(())
}
