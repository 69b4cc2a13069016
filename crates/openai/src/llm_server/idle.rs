//! Idle replicas sleep (`experimental_configs.sleep_after_idle_s`): once a replica has had no
//! request in flight and no sequence in its engine for that long, its engine releases its
//! weights (vLLM's sleep level 1: its adapters stay loaded), and the next request wakes it.
//! That request asks the engine to load its weights again; requests arriving meanwhile wait
//! in the engine's queue with it, so a burst costs one reload. Level 2
//! (`drop_adapters_after_idle_s`, longer): its idle adapters are evicted too, their memory
//! returned; the next request for one loads it again. Health checks and `/metrics`
//! are not requests: they never wake it. An engine an operator put to sleep (the `sleep`
//! control) is not woken by requests: they wait for `wakeup`, as before.

use std::sync::{Arc, Weak};
use std::time::Duration;

use modelmux_llm::LlmRuntime;
use tokio::time::Instant;

/// One replica's idle watch.
pub(crate) struct IdleSleep {
    after: Duration,
    /// Idle this long, asleep, its adapters go too.
    drop_adapters_after: Option<Duration>,
    state: parking_lot::Mutex<State>,
}

struct State {
    /// Calls in progress.
    in_flight: usize,
    /// When the replica was last seen busy.
    last: Instant,
    /// Whether this watch put the engine to sleep (and the next request wakes it).
    slept: bool,
    /// Whether it dropped the adapters since (level 2).
    dropped: bool,
}

/// A call in progress (the replica is busy while it lives).
pub(crate) struct Busy(Arc<IdleSleep>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.in_flight -= 1;
        s.last = Instant::now();
    }
}

impl IdleSleep {
    /// Watches `runtime`'s replica: after `after` idle, its engine sleeps. The watch ends with
    /// the runtime.
    pub(crate) fn start(
        after: Duration,
        drop_adapters_after: Option<Duration>,
        runtime: &Arc<LlmRuntime>,
    ) -> Arc<Self> {
        let idle = Arc::new(Self {
            after,
            drop_adapters_after,
            state: parking_lot::Mutex::new(State {
                in_flight: 0,
                last: Instant::now(),
                slept: false,
                dropped: false,
            }),
        });
        tokio::spawn(watch(Arc::downgrade(&idle), Arc::downgrade(runtime)));
        idle
    }

    /// A call begins: wakes the engine if this watch put it to sleep (once, whoever comes
    /// first; the engine's queue holds the call until its weights are back).
    pub(crate) fn enter(self: &Arc<Self>, runtime: &LlmRuntime) -> Busy {
        let mut s = self.state.lock();
        s.in_flight += 1;
        s.last = Instant::now();
        s.dropped = false;
        if std::mem::take(&mut s.slept) {
            tracing::info!("a request wakes the idle LLM replica");
            runtime.engine().wake_up();
        }
        Busy(self.clone())
    }
}

/// Puts the engine to sleep whenever the replica has been idle for `after`.
async fn watch(idle: Weak<IdleSleep>, runtime: Weak<LlmRuntime>) {
    loop {
        let due = {
            let Some(idle) = idle.upgrade() else { return };
            let s = idle.state.lock();
            s.last + idle.after
        };
        // At least a pause between looks: while asleep (or busy) the next look is not due.
        tokio::time::sleep_until(due.max(Instant::now() + Duration::from_millis(100))).await;
        let (Some(idle), Some(runtime)) = (idle.upgrade(), runtime.upgrade()) else {
            return;
        };
        let engine = runtime.engine();
        let mut s = idle.state.lock();
        let now = Instant::now();
        let work = engine.snapshot();
        if s.in_flight > 0 || work.running > 0 || work.waiting > 0 {
            // Busy (a stream outlives its call): idle only from when it ends.
            s.last = now;
            continue;
        }
        if s.slept {
            if let Some(after) = idle.drop_adapters_after
                && !s.dropped
                && now >= s.last + after
            {
                s.dropped = true;
                let evicted = drop_idle_adapters(&runtime);
                tracing::info!(evicted, "the idle LLM replica drops its idle adapters");
            }
            continue;
        }
        if engine.is_asleep() || now < s.last + idle.after {
            continue;
        }
        match engine.sleep() {
            Ok(()) => {
                s.slept = true;
                tracing::info!(
                    idle_s = idle.after.as_secs_f64(),
                    "the idle LLM replica sleeps"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "the idle LLM replica cannot sleep");
                return;
            }
        }
    }
}

/// Evicts every adapter no request holds (each unloads once its last guard goes); how many.
fn drop_idle_adapters(runtime: &LlmRuntime) -> usize {
    let Some(adapters) = runtime.adapters() else {
        return 0;
    };
    (adapters.models().into_iter())
        .filter(|m| m.in_use == 0 && !m.pinned)
        .filter(|m| adapters.evict(m.id.as_str()))
        .count()
}
