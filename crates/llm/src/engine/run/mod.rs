//! The engine loop: intake, admission, one batched step, sampling, streaming. Runs on its own
//! thread and owns everything it touches; nothing here is shared but the stats and the KV
//! budget's counter.

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
mod weights;

use super::scheduler::{IntakeWait, Limits, Schedulable, Scheduler};
use super::{AdaptersInUse, Command, EngineConfig, EngineStats};
use crate::error::LlmError;
use crate::kv::{KvBudget, KvCache};
use crate::model::{LlamaModel, Segment};
use crate::tokenizer::TextTokenizer;
use weights::Weights;

pub(super) struct EngineLoop {
    weights: Weights,
    tokenizer: Arc<TextTokenizer>,
    /// Tokens that end a sequence unless it ignores EOS.
    eos: Vec<u32>,
    config: EngineConfig,
    budget: KvBudget,
    stats: Arc<EngineStats>,
    commands: Receiver<Command>,
    /// The waiting and running sequences.
    sched: Scheduler<Sequence>,
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
            weights: Weights::new(model, kv_dtype, reload),
            tokenizer,
            eos,
            sched: Scheduler::new(Limits::from(&config)),
            config,
            budget,
            stats,
            commands,
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
            self.sched.drop_abandoned();
            self.sleep_or_wake();
            self.run_embeds();
            if self.stats.paused.load(Ordering::SeqCst) || self.weights.model.is_none() {
                self.weights.leave_steps();
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
            if self.sched.running().is_empty() {
                self.weights.leave_steps();
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
                for s in self.sched.drain_running() {
                    s.fail(LlmError::Internal(message.clone()));
                }
            }
            self.stats.steps.fetch_add(1, Ordering::Relaxed);
            self.publish();
        }
        self.weights.leave_steps();
        // Every handle is gone: nobody can listen, but say so to whoever still does.
        for s in self.sched.drain() {
            s.fail(LlmError::EngineStopped("the engine was shut down".into()));
        }
        self.publish();
    }

    fn sleep_or_wake(&mut self) {
        self.weights
            .sleep_or_wake(&self.stats, self.prefixes.as_mut());
    }

    /// Runs the embeddings asked for (unless asleep), each on its own, a panic failing it alone.
    fn run_embeds(&mut self) {
        let Some(model) = self.weights.model.clone() else {
            return;
        };
        for job in self.embeds.drain(..) {
            if job.reply.is_closed() {
                continue;
            }
            let mut cache = KvCache::new(
                &self.weights.config,
                self.weights.kv_dtype,
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

    /// Acts on one command from the queue. False when the queue wants intake to stop taking
    /// more this turn (an embedding or a poke: something to do between steps).
    fn take(&mut self, command: Command) -> bool {
        match command {
            Command::Submit(s) => self.sched.enqueue(*s),
            Command::Embed(job) => {
                self.embeds.push(*job);
                return false;
            }
            Command::Poke => return false,
            Command::ResetPrefixCache(done) => {
                self.reset_prefixes();
                // The caller may have gone (a cancelled admin request): nothing to tell.
                let _ = done.send(());
            }
        }
        true
    }

    /// While paused: takes new requests for a little while (so cancellations and resumes are
    /// noticed within it) and runs nothing. False when every handle is gone.
    fn wait_paused(&mut self) -> bool {
        let pause = Duration::from_millis(20);
        if self.sched.is_full() {
            // Full: leave the rest in the channel (its bound refuses the next ones).
            std::thread::sleep(pause);
            return true;
        }
        match self.commands.recv_timeout(pause) {
            Ok(command) => {
                self.take(command);
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
        let mut first = true;
        loop {
            let wait = self
                .sched
                .intake_wait(std::mem::replace(&mut first, false), Instant::now());
            let command = match wait {
                IntakeWait::Block => match self.commands.recv() {
                    Ok(c) => c,
                    Err(_) => return false,
                },
                IntakeWait::AtMost(wait) => match self.commands.recv_timeout(wait) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                },
                IntakeWait::No => {
                    if self.sched.is_full() {
                        return true;
                    }
                    match self.commands.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => return true,
                        Err(TryRecvError::Disconnected) => return false,
                    }
                }
            };
            if !self.take(command) || self.sched.is_full() {
                return true;
            }
        }
    }

    /// Waiting sequences past their deadline are refused as overloaded. Runs after admission,
    /// so one whose room opened in the same turn is served, not refused.
    fn expire_waiting(&mut self) {
        for s in self.sched.expire(Instant::now()) {
            let reason = format!(
                "no KV cache room or sequence slot within {:?} ({} running, {} of {} KV bytes reserved)",
                self.config.queue_timeout,
                self.sched.running().len(),
                self.budget.reserved(),
                self.budget.capacity()
            );
            s.fail(LlmError::Overloaded {
                reason,
                retry_after: Duration::from_secs(1),
            });
        }
    }

    /// Admits waiting sequences while slots and KV memory allow (the scheduler's rules), each
    /// started on its reservation from its prompt's longest cached prefix.
    fn admit(&mut self) {
        let mut room = prefixes::Admission {
            budget: &self.budget,
            prefixes: self.prefixes.as_mut(),
            weights: &self.weights,
            salt: self.config.prefix_cache_salt.as_deref(),
            stats: &self.stats,
        };
        self.sched.admit(&mut room);
        self.publish_prefixes();
    }

    fn publish(&self) {
        let (running, waiting) = (self.sched.running(), self.sched.waiting());
        self.stats.running.store(running.len(), Ordering::Relaxed);
        self.stats.waiting.store(waiting.len(), Ordering::Relaxed);
        let running = AdaptersInUse::ids(running.iter().map(Schedulable::adapter));
        let waiting = AdaptersInUse::ids(waiting.iter().map(Schedulable::adapter));
        let mut adapters = self.stats.adapters.lock();
        if adapters.running != running || adapters.waiting != waiting {
            *adapters = AdaptersInUse { running, waiting };
        }
    }
}
