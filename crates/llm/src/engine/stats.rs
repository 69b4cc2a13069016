//! What an engine shows of itself while it runs: counters the engine thread updates and any
//! thread reads without a lock, and which adapters its sequences use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Live figures of an engine.
#[derive(Debug, Default)]
pub(crate) struct EngineStats {
    pub(super) running: AtomicUsize,
    pub(super) waiting: AtomicUsize,
    pub(super) steps: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) generated_tokens: AtomicU64,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    pub(super) prefix_queries: AtomicU64,
    pub(super) prefix_hits: AtomicU64,
    /// Bytes the prefix cache holds.
    pub(super) prefix_bytes: AtomicU64,
    /// Set when the engine thread ends, however it ends (a panic outside a step included).
    pub(super) stopped: std::sync::atomic::AtomicBool,
    /// While set, the engine runs no step and admits nothing (requests still queue).
    pub(super) paused: std::sync::atomic::AtomicBool,
    /// Asked to release the weights (set) or to have them (clear).
    pub(super) want_sleep: std::sync::atomic::AtomicBool,
    /// Where the weights are; the engine thread sends each change, so a caller can wait for
    /// one (`sleep` and `wakeup` answering once it happened) without polling.
    pub(super) weights: tokio::sync::watch::Sender<WeightsState>,
    /// Fault injection for tests: the next step panics (see
    /// [`Engine::inject_step_panic`](super::Engine::inject_step_panic)).
    pub(super) inject_panic: std::sync::atomic::AtomicBool,
    /// The adapters running and waiting sequences use, as of the last step.
    pub(super) adapters: parking_lot::Mutex<AdaptersInUse>,
}

/// Where an engine's weights are ([`Engine::sleep`](super::Engine::sleep) releases them,
/// [`Engine::wake_up`](super::Engine::wake_up) loads them again).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WeightsState {
    /// In memory: the engine generates.
    #[default]
    Loaded,
    /// Released by `sleep`, or being loaded again after `wake_up`.
    Released,
    /// The last load after `wake_up` failed, with why; the engine stays asleep.
    ReloadFailed(String),
}

/// The adapters an engine's sequences use: what LoRA-aware routers read (vLLM's
/// `lora_requests_info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdaptersInUse {
    /// Adapter ids of the running sequences, sorted, each once.
    pub running: Vec<String>,
    /// Adapter ids of the waiting requests, sorted, each once.
    pub waiting: Vec<String>,
}

impl AdaptersInUse {
    /// The ids among `adapters` (one per sequence; `None` for the base model), sorted, each
    /// once.
    pub(super) fn ids<'a>(adapters: impl Iterator<Item = Option<&'a str>>) -> Vec<String> {
        let mut ids: Vec<&str> = adapters.flatten().collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(str::to_owned).collect()
    }
}

/// Marks the engine stopped when dropped: held by the engine thread for its whole life.
pub(crate) struct StopFlag(pub(crate) Arc<EngineStats>);

impl Drop for StopFlag {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        // Whoever waits for the weights to change learns that they never will.
        self.0.weights.send_modify(|_| ());
    }
}

/// A snapshot of [`EngineStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    /// Sequences admitted and not finished.
    pub running: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Steps run.
    pub steps: u64,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Of those, tokens whose KV was found there (`prefix_cache_hits`).
    pub prefix_cache_hits: u64,
    /// KV bytes the prefix cache holds (inside the KV budget).
    pub prefix_cache_bytes: u64,
    /// KV bytes reserved by live sequences.
    pub kv_reserved_bytes: u64,
    /// The KV budget.
    pub kv_capacity_bytes: u64,
}
