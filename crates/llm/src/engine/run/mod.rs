//! The engine loop: intake, admission, one batched step, sampling, streaming. Runs on its own
//! thread and owns everything it touches; nothing here is shared but the stats and the KV
//! budget's counter.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use tokio::time::Instant;

use super::prefix::PrefixCache;
use super::sequence::Sequence;

mod prefixes;
mod step;
use super::{AdaptersInUse, Command, EngineConfig, EngineStats, WeightsState};
use crate::error::LlmError;
use crate::kv::{KvBudget, KvCache, KvDtype};
use crate::model::{LlamaModel, Segment};
use crate::tokenizer::TextTokenizer;

pub(super) struct EngineLoop {
    /// `None` while asleep (the weights' memory released).
    model: Option<Arc<LlamaModel>>,
    /// This engine's number among the engines sharing `model`'s steps.
    member: u64,
    model_config: crate::LlamaConfig,
    /// How sequences' KV caches store keys and values.
    kv_dtype: KvDtype,
    reload: Option<super::ModelReloader>,
    tokenizer: Arc<TextTokenizer>,
    config: EngineConfig,
    budget: KvBudget,
    stats: Arc<EngineStats>,
    commands: Receiver<Command>,
    /// Tokens that end a sequence unless it ignores EOS.
    eos: Vec<u32>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Embeddings asked for, run between steps (kept while asleep).
    embeds: Vec<super::EmbedJob>,
    /// Prompts' KV kept for later prompts (`None`: prefix caching is off).
    prefixes: Option<PrefixCache>,
}

impl EngineLoop {
    pub(super) fn new(
        model: Arc<LlamaModel>,
        reload: Option<super::ModelReloader>,
        tokenizer: Arc<TextTokenizer>,
        config: EngineConfig,
        budget: KvBudget,
        stats: Arc<EngineStats>,
        commands: Receiver<Command>,
    ) -> Self {
        let eos = super::constrain::end_tokens(&tokenizer);
        let kv_dtype = config.kv_dtype(model.weights().format);
        let prefixes = config
            .enable_prefix_caching
            .then(|| PrefixCache::new(model.config().kv_bytes_per_token(kv_dtype)));
        Self {
            kv_dtype,
            model_config: model.config().clone(),
            member: model.step_member(),
            model: Some(model),
            reload,
            tokenizer,
            config,
            budget,
            stats,
            commands,
            eos,
            waiting: VecDeque::new(),
            running: Vec::new(),
            embeds: Vec::new(),
            prefixes,
        }
    }

    pub(super) fn run(mut self) {
        let _stopped_on_exit = super::StopFlag(self.stats.clone());
        loop {
            // A sleep or wake-up asked for while this thread waited out a pause (whose wait
            // took the command that announced it) is acted on before it waits on its queue
            // again: otherwise an idle engine would sleep on with nothing to wake it.
            self.sleep_or_wake();
            if !self.intake() {
                break;
            }
            self.drop_abandoned();
            self.sleep_or_wake();
            self.run_embeds();
            if self.stats.paused.load(Ordering::SeqCst) || self.model.is_none() {
                self.leave_steps();
                self.expire_waiting();
                self.publish();
                if !self.wait_paused() {
                    break;
                }
                continue;
            }
            self.admit();
            self.expire_waiting();
            self.publish();
            if self.running.is_empty() {
                self.leave_steps();
                continue;
            }
            let step = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
            let failure = match step {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(panic) => Some(modelmux_cache::panic_message(&*panic)),
            };
            if let Some(message) = failure {
                tracing::error!(%message, "engine step failed; failing the running sequences");
                for s in self.running.drain(..) {
                    s.fail(LlmError::Internal(message.clone()));
                }
            }
            self.stats.steps.fetch_add(1, Ordering::Relaxed);
            self.publish();
        }
        self.leave_steps();
        // Every handle is gone: nobody can listen, but say so to whoever still does.
        for s in self.running.drain(..).chain(self.waiting.drain(..)) {
            s.fail(LlmError::EngineStopped("the engine was shut down".into()));
        }
        self.publish();
    }

    /// Tells the other engines of the model not to wait for this one's next step.
    fn leave_steps(&self) {
        if let Some(model) = &self.model {
            model.step_leave(self.member);
        }
    }

    /// Runs the embeddings asked for (unless asleep), each on its own, a panic failing it alone.
    fn run_embeds(&mut self) {
        let Some(model) = self.model.clone() else {
            return;
        };
        for job in self.embeds.drain(..) {
            if job.reply.is_closed() {
                continue;
            }
            let mut cache = KvCache::new(
                &self.model_config,
                self.kv_dtype,
                job.tokens.len(),
                Some(job.reservation),
            );
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut segment = [Segment {
                    tokens: &job.tokens,
                    cache: &mut cache,
                    adapter: job.adapter.as_deref(),
                    want_logits: false,
                    all_logits: false,
                }];
                model.embed(&mut segment)
            }))
            .unwrap_or_else(|panic| Err(LlmError::Internal(modelmux_cache::panic_message(&*panic))))
            .map(|mut v| v.pop().unwrap_or_default());
            let _ = job.reply.send(result);
        }
    }

    /// Releases the weights when asked to sleep, loads them again when asked to wake up
    /// (between steps, on this thread: sequences keep their KV caches and go on afterwards).
    fn sleep_or_wake(&mut self) {
        let want_sleep = self.stats.want_sleep.load(Ordering::SeqCst);
        match (&self.model, &self.reload) {
            (Some(_), Some(_)) if want_sleep => {
                self.leave_steps();
                self.model = None;
                // The KV cache goes with the weights.
                if let Some(prefixes) = &mut self.prefixes {
                    prefixes.clear();
                }
                // The weights' own mappings are gone with the model (when no other replica
                // shares it); what the heap held for it goes back too.
                modelmux_kernels::release_free_heap();
                self.stats.weights.send_replace(WeightsState::Released);
                tracing::info!("engine asleep: weights released");
            }
            (None, Some(reload)) if !want_sleep => {
                let started = Instant::now();
                match std::panic::catch_unwind(AssertUnwindSafe(|| reload())) {
                    Ok(Ok(model)) => {
                        self.member = model.step_member();
                        self.model = Some(model);
                        self.stats.weights.send_replace(WeightsState::Loaded);
                        tracing::info!(took = ?started.elapsed(), "engine awake: weights loaded");
                    }
                    failed => {
                        let message = match failed {
                            Ok(Err(e)) => e.to_string(),
                            Err(panic) => modelmux_cache::panic_message(&*panic),
                            Ok(Ok(_)) => unreachable!(),
                        };
                        tracing::error!(%message, "engine cannot load its weights again; staying asleep");
                        // Asleep until the next wake_up, which tries again.
                        self.stats.want_sleep.store(true, Ordering::SeqCst);
                        self.stats
                            .weights
                            .send_replace(WeightsState::ReloadFailed(message));
                    }
                }
            }
            _ => {}
        }
    }

    /// While paused: takes new requests for a little while (so cancellations and resumes are
    /// noticed within it) and runs nothing. False when every handle is gone.
    fn wait_paused(&mut self) -> bool {
        let pause = Duration::from_millis(20);
        if self.waiting.len() >= self.config.max_waiting {
            // Full: leave the rest in the channel (its bound refuses the next ones).
            std::thread::sleep(pause);
            return true;
        }
        match self.commands.recv_timeout(pause) {
            Ok(Command::Submit(s)) => {
                self.waiting.push_back(*s);
                true
            }
            Ok(Command::Embed(job)) => {
                self.embeds.push(*job);
                true
            }
            Ok(Command::Poke) => true,
            Ok(Command::ResetPrefixCache(done)) => {
                self.reset_prefixes();
                let _ = done.send(());
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Moves submitted sequences into the queue. Blocks while there is nothing to do; once a
    /// command has come, takes only what is already there. Returns false once every handle
    /// is gone.
    fn intake(&mut self) -> bool {
        // Only the first receive may wait: a request that arrives at an idle engine is
        // admitted at once, not after the wait meant for sequences that found no KV room
        // (that wait once delayed every such request's first token by 50 ms).
        let mut first = true;
        loop {
            let may_wait = std::mem::replace(&mut first, false);
            let idle = may_wait && self.running.is_empty();
            let command = if idle && self.waiting.is_empty() {
                match self.commands.recv() {
                    Ok(c) => c,
                    Err(_) => return false,
                }
            } else if idle {
                // Only waiting sequences (no KV room): sleep until something changes or the
                // first deadline passes.
                let wait = self
                    .waiting
                    .iter()
                    .map(|s| s.deadline.saturating_duration_since(Instant::now()))
                    .min()
                    .unwrap_or_default()
                    .min(Duration::from_millis(50));
                match self.commands.recv_timeout(wait) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                if self.waiting.len() >= self.config.max_waiting {
                    return true;
                }
                match self.commands.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return false,
                }
            };
            match command {
                Command::Submit(s) => self.waiting.push_back(*s),
                Command::Embed(job) => {
                    self.embeds.push(*job);
                    return true;
                }
                Command::Poke => return true,
                Command::ResetPrefixCache(done) => {
                    self.reset_prefixes();
                    // The caller may have gone (a cancelled admin request): nothing to tell.
                    let _ = done.send(());
                }
            }
            if self.waiting.len() >= self.config.max_waiting {
                return true;
            }
        }
    }

    /// Sequences whose stream was dropped leave now: their KV memory and adapter lease go
    /// with them.
    fn drop_abandoned(&mut self) {
        self.running.retain(|s| !s.is_abandoned());
        self.waiting.retain(|s| !s.is_abandoned());
    }

    /// Waiting sequences past their deadline are refused as overloaded. Runs after admission,
    /// so one whose room opened in the same turn is served, not refused.
    fn expire_waiting(&mut self) {
        let now = Instant::now();
        let (expired, kept): (Vec<_>, Vec<_>) =
            self.waiting.drain(..).partition(|s| s.deadline <= now);
        self.waiting = kept.into();
        for s in expired {
            let reason = format!(
                "no KV cache room or sequence slot within {:?} ({} running, {} of {} KV bytes reserved)",
                self.config.queue_timeout,
                self.running.len(),
                self.budget.reserved(),
                self.budget.capacity()
            );
            s.fail(LlmError::Overloaded {
                reason,
                retry_after: Duration::from_secs(1),
            });
        }
    }

    /// Admits waiting sequences while slots and KV memory allow (a request for `n` choices
    /// takes `n` slots and their KV at once), fairly: see [`Self::next_to_admit`].
    fn admit(&mut self) {
        let mut used: usize = self.running.iter().map(Sequence::slots).sum();
        while used < self.config.max_num_seqs {
            let Some(next) = self.next_to_admit() else {
                break;
            };
            let candidate = &self.waiting[next];
            if used + candidate.slots() > self.config.max_num_seqs {
                break;
            }
            // No skipping past a sequence that does not fit yet: a long one would starve.
            // Cached prefixes give their memory back first.
            let bytes = candidate.reservation_bytes;
            let reservation = loop {
                if let Some(r) = self.budget.try_reserve(bytes) {
                    break Some(r);
                }
                if !self.prefixes.as_mut().is_some_and(PrefixCache::evict_one) {
                    break None;
                }
            };
            let Some(reservation) = reservation else {
                break;
            };
            let mut s = self.waiting.remove(next).expect("index in range");
            used += s.slots();
            s.admit(&self.model_config, self.kv_dtype, Some(reservation));
            self.restore_prefix(&mut s);
            self.running.push(s);
        }
        self.publish_prefixes();
    }

    /// The waiting sequence to admit next: of the adapters with sequences waiting (the base
    /// model counting as one), the one with the fewest sequences running, its oldest waiting
    /// sequence (arrival order between equals); none under `max_running_per_adapter`.
    fn next_to_admit(&self) -> Option<usize> {
        let mut running: std::collections::HashMap<Option<&str>, usize> = Default::default();
        for s in &self.running {
            *running.entry(adapter_id(s)).or_default() += s.slots();
        }
        let mut best: Option<(usize, usize)> = None;
        for (index, s) in self.waiting.iter().enumerate() {
            let n = running.get(&adapter_id(s)).copied().unwrap_or(0);
            if self
                .config
                .max_running_per_adapter
                .is_some_and(|cap| n + s.slots() > cap)
            {
                continue;
            }
            if best.is_none_or(|(fewest, _)| n < fewest) {
                best = Some((n, index));
            }
        }
        best.map(|(_, index)| index)
    }

    fn publish(&self) {
        self.stats
            .running
            .store(self.running.len(), Ordering::Relaxed);
        self.stats
            .waiting
            .store(self.waiting.len(), Ordering::Relaxed);
        let running = AdaptersInUse::ids(self.running.iter().map(adapter_id));
        let waiting = AdaptersInUse::ids(self.waiting.iter().map(adapter_id));
        let mut adapters = self.stats.adapters.lock();
        if adapters.running != running || adapters.waiting != waiting {
            *adapters = AdaptersInUse { running, waiting };
        }
    }
}

/// The id of the adapter `s` uses, `None` for the base model.
pub(super) fn adapter_id(s: &Sequence) -> Option<&str> {
    s.adapter.as_ref().map(|a| a.id())
}
