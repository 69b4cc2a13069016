//! The autoscaling loop of one deployment: every tick it reads the deployment's load (requests
//! in its replicas plus those queued in front of them, and the loads its replicas want), keeps
//! it over the look-back window, asks the [`Decider`] for a replica count and scales to it
//! through [`Reconfiguration::scale`](super::Reconfiguration::scale): up starts replicas, down
//! drains those cheapest to lose after loading elsewhere the recently used models only they
//! held. A request that finds no replica of a deployment scaled to zero wakes the loop at once.

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::ModelStatus;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Controller;
use super::applications::SpecCell;
use crate::autoscale::policy::{Decider, Load};
use crate::autoscale::window::Window;
use crate::autoscale::{Aggregation, AutoscalingConfig};
use crate::deployment_router::DeploymentRouter;
use crate::replica::Replica;

/// How often the loop looks (Ray's control loop period).
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// What the loop keeps between ticks.
#[derive(Default)]
struct Measures {
    /// Requests running plus queued.
    requests: Window,
    /// Loads wanted (running or waiting for a load slot), while any waits for a slot.
    loads: Window,
    decider: Decider,
}

/// Runs deployment `d` of application `a`'s autoscaling until `stopped` turns true. A
/// deployment without `autoscaling_config` is left alone (the loop looks again each tick: a
/// reload may give it one).
pub(crate) async fn run(
    controller: Arc<Controller>,
    a: usize,
    d: usize,
    mut stopped: watch::Receiver<bool>,
) {
    let app = controller.apps.iter().nth(a).expect("an application");
    let (router, cell): &(Arc<DeploymentRouter>, SpecCell) = &app.deployments[d];
    let mut measures = Measures::default();
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep(TICK) => {}
            () = router.demand.notified() => {}
        }
        let Some(config) = cell.read().config.autoscaling.clone() else {
            router.set_wakes_from_zero(false);
            continue;
        };
        router.set_wakes_from_zero(config.min_replicas == 0);
        let replicas = router.replicas();
        if router.is_starting() {
            continue;
        }
        // Scaling is awaited here, so what runs is what was decided last (or what a reload
        // or a replacement left).
        let target = replicas.len();
        let now = Instant::now();
        let load = measures.observe(&config, &replicas, router.queued(), target, now);
        let decided = measures.decider.decide(&config, load, now);
        if decided == target {
            continue;
        }
        tracing::info!(app = %app.name, deployment = %router.name(), from = target, to = decided, requests = load.requests, loads = load.for_loads, "autoscaling");
        let scaled = controller
            .reconfiguration
            .scale(&app.name, router.name(), decided)
            .await;
        if let Err(e) = scaled {
            // Tried again at a later tick (a replica that failed to start).
            tracing::error!(app = %app.name, deployment = %router.name(), error = %e, "could not scale");
        }
    }
}

impl Measures {
    /// Samples the deployment now and reduces the windows to what the decision needs.
    fn observe(
        &mut self,
        config: &AutoscalingConfig,
        replicas: &[Arc<Replica>],
        queued: usize,
        target: usize,
        now: Instant,
    ) -> Load {
        let inside: usize = replicas.iter().map(|r| r.slot.inside()).sum();
        self.requests.record(now, (inside + queued) as f64);
        let (wanted, waiting, slots) = loads(replicas);
        self.loads
            .record(now, if waiting > 0 { wanted as f64 } else { 0.0 });
        let look_back = config.look_back_period;
        let requests = self.requests.aggregate(now, look_back, config.aggregation);
        let loads = self.loads.aggregate(now, look_back, Aggregation::Mean);
        let for_loads = if loads > 0.0 {
            (loads / slots.max(1) as f64).ceil() as usize
        } else {
            0
        };
        Load {
            running: replicas.len(),
            target,
            requests,
            for_loads,
        }
    }
}

/// Over `replicas`: loads wanted (running or queued), how many wait for a load slot, and the
/// load slots one replica has.
fn loads(replicas: &[Arc<Replica>]) -> (usize, usize, usize) {
    let mut wanted = 0;
    let mut waiting = 0;
    let mut slots = 0;
    for replica in replicas {
        let mut replica_slots = 0;
        for cache in &replica.caches {
            replica_slots += cache.max_concurrent_loads();
            for model in cache.models() {
                match model.status {
                    ModelStatus::Queued => {
                        wanted += 1;
                        waiting += 1;
                    }
                    ModelStatus::Loading => wanted += 1,
                    ModelStatus::Loaded => {}
                }
            }
        }
        slots = slots.max(replica_slots);
    }
    (wanted, waiting, slots)
}
