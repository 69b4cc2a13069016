//! `modelmux plan`: replays a trace through the server's own router and caches in virtual time
//! (see `modelmux-plan`), for the configuration's setting or for a grid of them, and says which
//! setting meets a target at the least cost.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use modelmux_plan::search::{Grid, Targets, search};
use modelmux_plan::{Costs, Report, Setting, Trace, explain, plot, replay};

use crate::CliError;
use crate::config::Config;

/// `modelmux plan`'s arguments.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The trace: modelmux's log (its access lines, and its load lines for load times), or a
    /// CSV (`timestamp,model_id[,service_ms][,bytes]`) or JSON lines of the same fields.
    pub trace: PathBuf,
    /// The server's configuration: the deployment's replicas, caps, load slots, eviction
    /// policy and queue, and a synthetic kind's load and inference times.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The deployment to plan, when the configuration has several.
    #[arg(long)]
    pub deployment: Option<String>,
    /// A load's time in milliseconds, for models the trace measured no load of.
    #[arg(long)]
    pub load_ms: Option<f64>,
    /// A request's service time in milliseconds, where the trace gives none.
    #[arg(long)]
    pub service_ms: Option<f64>,
    /// Search these replica counts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub replicas: Vec<usize>,
    /// Search these models per replica.
    #[arg(long, value_delimiter = ',')]
    pub max_models: Vec<usize>,
    /// Search these concurrent loads per replica.
    #[arg(long, value_delimiter = ',')]
    pub max_concurrent_loads: Vec<usize>,
    /// Search these eviction policies (`lru`, `gdsf`).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// The target: end-to-end p99 at most this many milliseconds.
    #[arg(long)]
    pub target_p99_ms: Option<f64>,
    /// The target: a hit ratio at least this.
    #[arg(long)]
    pub min_hit_ratio: Option<f64>,
    /// Write `plan.json` (every setting's report) and `frontier.png` here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Name the (at most N) slowest requests past the p99 target, and why they were slow.
    #[arg(long, value_name = "N")]
    pub explain: Option<usize>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn millis(ms: f64, what: &str) -> Result<Duration, CliError> {
    if !(0.0..1e9).contains(&ms) {
        return Err(format!("{what}: {ms} is not a time in milliseconds").into());
    }
    Ok(Duration::from_secs_f64(ms / 1e3))
}

/// The setting and costs to start from: the configuration's, else one replica of Ray's
/// defaults (3 models, LRU).
fn base(args: &PlanArgs) -> Result<(Setting, Costs), CliError> {
    let (setting, mut costs) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let config = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let (setting, costs, _) =
                crate::config::plan::setting(&config, args.deployment.as_deref())?;
            (setting, costs)
        }
        None => (
            Setting {
                replicas: 1,
                max_models: Some(3),
                max_bytes: None,
                max_concurrent_loads: 2,
                eviction: modelmux_cache::EvictionPolicy::Lru,
                max_ongoing_requests: Some(5),
                max_queued_requests: Some(1024),
                queue_timeout: None,
            },
            Costs::default(),
        ),
    };
    if let Some(ms) = args.load_ms {
        costs.load = millis(ms, "--load-ms")?;
    }
    if let Some(ms) = args.service_ms {
        costs.service = millis(ms, "--service-ms")?;
    }
    Ok((setting, costs))
}

/// The grid the flags ask for, each knob defaulting to the base setting's value.
fn grid(args: &PlanArgs, base: &Setting) -> Result<Option<Grid>, CliError> {
    if args.replicas.is_empty()
        && args.max_models.is_empty()
        && args.max_concurrent_loads.is_empty()
        && args.policies.is_empty()
    {
        return Ok(None);
    }
    let or = |v: &Vec<usize>, d: usize| if v.is_empty() { vec![d] } else { v.clone() };
    let policies = if args.policies.is_empty() {
        vec![base.eviction]
    } else {
        args.policies
            .iter()
            .map(|p| {
                modelmux_plan::policy_of(p)
                    .ok_or_else(|| format!("--policies: '{p}' is not lru or gdsf"))
            })
            .collect::<Result<_, _>>()?
    };
    let grid = Grid {
        replicas: or(&args.replicas, base.replicas),
        max_models: or(&args.max_models, base.max_models.unwrap_or(3)),
        max_concurrent_loads: or(&args.max_concurrent_loads, base.max_concurrent_loads),
        policies,
    };
    if grid.replicas.contains(&0)
        || grid.max_models.contains(&0)
        || grid.max_concurrent_loads.contains(&0)
    {
        return Err(
            "--replicas, --max-models and --max-concurrent-loads must be at least 1".into(),
        );
    }
    Ok(Some(grid))
}

fn bar(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} (eta {{eta}})"
    )) {
        bar.set_style(style);
    }
    bar
}

/// Runs `modelmux plan`.
pub fn run(args: &PlanArgs) -> Result<(), CliError> {
    let text = std::fs::read_to_string(&args.trace)
        .map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?;
    let trace = Trace::parse(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let (setting, costs) = base(args)?;
    let targets = Targets {
        p99_ms: args.target_p99_ms,
        min_hit_ratio: args.min_hit_ratio,
    };
    if let Some(grid) = grid(args, &setting)? {
        let settings = grid.settings(&setting);
        let progress = bar(settings.len(), "settings");
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let found = search(&trace, &settings, &costs, &targets, threads, &|n| {
            progress.set_position(n as u64);
        })?;
        progress.finish_and_clear();
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join("plan.json"), serde_json::to_vec_pretty(&found)?)?;
            std::fs::write(
                dir.join("frontier.png"),
                plot::frontier_png(&found, &targets)?,
            )?;
        }
        if args.json {
            crate::say(format_args!("{}\n", serde_json::to_string_pretty(&found)?));
        } else {
            crate::say(format_args!(
                "{} requests, {} models, {:.1} s of trace; {} settings replayed\n\n{}\n{}\n",
                trace.requests.len(),
                trace.models.len(),
                trace.span().as_secs_f64(),
                settings.len(),
                found.table(&targets),
                match found.cheapest {
                    Some(i) => format!(
                        "cheapest meeting the targets:\n{}",
                        found.reports[i].to_text()
                    ),
                    None => "no setting of the grid meets the targets".to_string(),
                }
            ));
        }
        return Ok(());
    }
    let progress = bar(trace.requests.len(), "requests");
    let outcome = replay(&trace, &setting, &costs, &|n| {
        progress.set_position(n as u64)
    })?;
    progress.finish_and_clear();
    let report = Report::new(&trace, &setting, &outcome);
    let late = args.explain.map(|n| {
        let target = args.target_p99_ms.unwrap_or(report.end_to_end_ms.p99);
        explain::explain(&trace, &outcome, target, n)
    });
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("plan.json"), serde_json::to_vec_pretty(&report)?)?;
    }
    if args.json {
        let value = serde_json::json!({"report": report, "late": late});
        crate::say(format_args!("{}\n", serde_json::to_string_pretty(&value)?));
        return Ok(());
    }
    crate::say(format_args!("{}", report.to_text()));
    let misses = targets.misses(&report);
    if targets.p99_ms.is_some() || targets.min_hit_ratio.is_some() {
        crate::say(format_args!(
            "targets: {}\n",
            if misses.is_empty() {
                "met".to_string()
            } else {
                misses.join("; ")
            }
        ));
    }
    for l in late.unwrap_or_default() {
        crate::say(format_args!(
            "request {} at {:.3} s, '{}' on {}: {:.1} ms\n  - {}\n",
            l.index,
            l.at_s,
            l.model,
            l.replica,
            l.end_to_end_ms,
            l.why.join("\n  - ")
        ));
    }
    Ok(())
}
