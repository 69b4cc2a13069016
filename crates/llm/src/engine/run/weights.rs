//! The engine loop's weights: the model it steps (or none while asleep), its place among the
//! engines that share the model's steps, and how it sleeps and wakes.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::engine::prefix::PrefixCache;
use crate::engine::{EngineStats, ModelReloader, WeightsState};
use crate::kv::KvDtype;
use crate::model::LlamaModel;

pub(super) struct Weights {
    /// `None` while asleep (the weights' memory released).
    pub(super) model: Option<Arc<LlamaModel>>,
    /// This engine's number among the engines sharing `model`'s steps.
    pub(super) member: u64,
    /// The model's shape (kept while asleep: sequences' caches are sized by it).
    pub(super) config: crate::LlamaConfig,
    /// How sequences' KV caches store keys and values.
    pub(super) kv_dtype: KvDtype,
    /// Loads the weights again on waking; `None`: this engine cannot sleep.
    reload: Option<ModelReloader>,
}

impl Weights {
    pub(super) fn new(
        model: Arc<LlamaModel>,
        kv_dtype: KvDtype,
        reload: Option<ModelReloader>,
    ) -> Self {
        Self {
            config: model.config().clone(),
            member: model.step_member(),
            model: Some(model),
            kv_dtype,
            reload,
        }
    }

    /// Tells the other engines of the model not to wait for this one's next step.
    pub(super) fn leave_steps(&self) {
        if let Some(model) = &self.model {
            model.step_leave(self.member);
        }
    }

    /// Releases the weights when `stats` asks for sleep, loads them again when it asks to
    /// wake up (between steps, on the engine's thread: sequences keep their KV caches and go
    /// on afterwards; the cached `prefixes` go with the weights). A failed reload stays
    /// asleep, says why in `stats`, and is tried again at the next wake-up.
    pub(super) fn sleep_or_wake(
        &mut self,
        stats: &EngineStats,
        prefixes: Option<&mut PrefixCache>,
    ) {
        let want_sleep = stats.want_sleep.load(Ordering::SeqCst);
        match (&self.model, &self.reload) {
            (Some(_), Some(_)) if want_sleep => {
                self.leave_steps();
                self.model = None;
                if let Some(prefixes) = prefixes {
                    prefixes.clear();
                }
                // The weights' own mappings are gone with the model (when no other replica
                // shares it); what the heap held for it goes back too.
                modelmux_kernels::release_free_heap();
                stats.weights.send_replace(WeightsState::Released);
                tracing::info!("engine asleep: weights released");
            }
            (None, Some(reload)) if !want_sleep => {
                let started = Instant::now();
                let failure = match std::panic::catch_unwind(AssertUnwindSafe(|| reload())) {
                    Ok(Ok(model)) => {
                        self.member = model.step_member();
                        self.model = Some(model);
                        stats.weights.send_replace(WeightsState::Loaded);
                        tracing::info!(took = ?started.elapsed(), "engine awake: weights loaded");
                        return;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(panic) => modelmux_cache::panic_message(&*panic),
                };
                tracing::error!(message = %failure, "engine cannot load its weights again; staying asleep");
                // Asleep until the next wake_up, which tries again.
                stats.want_sleep.store(true, Ordering::SeqCst);
                stats
                    .weights
                    .send_replace(WeightsState::ReloadFailed(failure));
            }
            _ => {}
        }
    }
}
