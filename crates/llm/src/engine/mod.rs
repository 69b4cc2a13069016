//! The engine: one thread per replica owns the model and every sequence, and runs steps of
//! continuous batching. Requests talk to it only through channels: [`Engine::submit`] hands
//! a sequence over, a [`GenerationStream`] receives its tokens, and dropping the stream
//! cancels it (its KV memory is freed at the next step).
//!
//! Each step holds one decode row for every running sequence that has its prompt cached,
//! then prompt chunks of the others in arrival order, up to `max_batch_tokens` rows, so a
//! long prompt is prefilled over several steps without stalling the streams already running.
//! Sequences are admitted while `max_num_seqs` and the KV byte budget allow, fairly between
//! adapters: the next is the oldest waiting sequence of the adapter (the base model counting
//! as one) with the fewest running, so one adapter's flood cannot hold another's request back,
//! and prompt chunks go round-robin by adapter;
//! each reserves the KV bytes of its prompt plus `max_tokens` up front, so a running sequence
//! never runs out of memory. A request that cannot be admitted within `queue_timeout`, or
//! that finds `max_waiting` requests already queued, gets [`LlmError::Overloaded`].

mod config;
mod constrain;
mod prefix;
mod run;
mod scheduler;
mod sequence;
mod stats;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::{LlmError, Result};
use crate::kv::{KvBudget, KvDtype};
use crate::lora::AdapterLease;
use crate::model::LlamaModel;
use crate::sampling::SamplingParams;
use crate::tokenizer::TextTokenizer;

pub use config::EngineConfig;
pub use modelmux_grammar::{Constraint, TokenConstraint};
pub use stats::{AdaptersInUse, EngineSnapshot, WeightsState};
pub(crate) use stats::{EngineStats, StopFlag};

/// A generation request, tokenized.
pub struct GenerationRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Sampling and stopping.
    pub params: SamplingParams,
    /// The adapter, or `None` for the base model.
    pub adapter: Option<AdapterLease>,
    /// What the output must match (from [`Engine::compile_constraint`]), or `None`.
    pub constraint: Option<TokenConstraint>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of sequence, a stop string or a stop token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    /// OpenAI's name: `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Tokens in and out of one sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// What a sequence streams.
#[derive(Clone, Debug)]
pub enum GenerationEvent {
    /// A token and the text it completes (possibly empty: part of a character, or held
    /// back while it may begin a stop string).
    Token {
        /// The token id.
        id: u32,
        /// Text now complete.
        text: String,
        /// Its log probability and the alternatives', when the request asked for them.
        logprob: Option<crate::TokenLogprob>,
        /// With the first token, when the request asked for them: the log probabilities of
        /// the prompt's tokens after the first (each given the ones before it).
        prompt_logprobs: Option<Vec<crate::TokenLogprob>>,
    },
    /// The end.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Text held back until now.
        rest: String,
        /// Token counts.
        usage: Usage,
        /// The prompt's log probabilities, when they were asked for and no token carried
        /// them (`max_tokens: 0`).
        prompt_logprobs: Option<Vec<crate::TokenLogprob>>,
    },
    /// The sequence failed; nothing follows.
    Error(Arc<LlmError>),
}

/// The events of one sequence. Dropping it cancels the sequence.
pub struct GenerationStream {
    events: mpsc::UnboundedReceiver<GenerationEvent>,
}

/// A finished generation, collected from a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// Generated token ids (including a final stop or EOS token).
    pub tokens: Vec<u32>,
    /// The text.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
}

impl GenerationStream {
    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<GenerationEvent> {
        self.events.recv().await
    }

    /// Waits for the end and returns everything generated.
    pub async fn collect(mut self) -> Result<Generation, Arc<LlmError>> {
        let mut tokens = Vec::new();
        let mut text = String::new();
        while let Some(event) = self.next().await {
            match event {
                GenerationEvent::Token { id, text: t, .. } => {
                    tokens.push(id);
                    text.push_str(&t);
                }
                GenerationEvent::Finished {
                    reason,
                    rest,
                    usage,
                    ..
                } => {
                    text.push_str(&rest);
                    return Ok(Generation {
                        tokens,
                        text,
                        finish_reason: reason,
                        usage,
                    });
                }
                GenerationEvent::Error(e) => return Err(e),
            }
        }
        Err(Arc::new(LlmError::EngineStopped(
            "the engine ended the stream without finishing it".into(),
        )))
    }
}

/// A request for an embedding, run by the engine thread between two steps.
pub(crate) struct EmbedJob {
    pub(crate) tokens: Vec<u32>,
    pub(crate) adapter: Option<AdapterLease>,
    pub(crate) reservation: crate::kv::KvReservation,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<Vec<f32>>>,
}

pub(crate) enum Command {
    Submit(Box<sequence::Sequence>),
    Embed(Box<EmbedJob>),
    /// Look at the flags (sleep, wake up) now, even if idle.
    Poke,
    /// Drop every cached prefix, then say so.
    ResetPrefixCache(tokio::sync::oneshot::Sender<()>),
}

/// The handle to an engine thread; cloning shares it. The thread stops when the last
/// handle is dropped, failing the sequences it still holds.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    commands: std::sync::mpsc::SyncSender<Command>,
    stats: Arc<EngineStats>,
    budget: KvBudget,
    config: EngineConfig,
    tokenizer: Arc<TextTokenizer>,
    model_config: crate::LlamaConfig,
    kv_dtype: KvDtype,
    /// Bytes of KV one token of a sequence reserves.
    kv_bytes_per_token: u64,
    can_reload: bool,
    grammars: constrain::Grammars,
}

/// Builds the model again (from its file) when a sleeping engine wakes up.
pub type ModelReloader = Arc<dyn Fn() -> Result<Arc<LlamaModel>> + Send + Sync>;

impl Engine {
    /// Starts the engine thread for `model`.
    pub fn start(
        model: Arc<LlamaModel>,
        tokenizer: Arc<TextTokenizer>,
        config: EngineConfig,
    ) -> Result<Self> {
        Self::start_with_reload(model, None, tokenizer, config)
    }

    /// Starts the engine thread for `model`; `reload` builds the model again after a
    /// [`sleep`](Self::sleep) (without it, the engine cannot sleep).
    pub fn start_with_reload(
        model: Arc<LlamaModel>,
        reload: Option<ModelReloader>,
        tokenizer: Arc<TextTokenizer>,
        config: EngineConfig,
    ) -> Result<Self> {
        config.validate()?;
        if config.max_model_len > model.max_positions() {
            return Err(LlmError::InvalidRequest(format!(
                "max_model_len must be at most the model's {} positions, got {}",
                model.max_positions(),
                config.max_model_len
            )));
        }
        let kv_dtype = config.kv_dtype(model.weights().format);
        config.check_fits(model.config(), model.weights().format)?;
        let budget = KvBudget::new(config.kv_cache_bytes);
        let stats = Arc::new(EngineStats::default());
        let (commands, receiver) = std::sync::mpsc::sync_channel(config.max_waiting);
        let model_config = model.config().clone();
        let can_reload = reload.is_some();
        let state = run::EngineLoop::new(
            model,
            reload,
            tokenizer.clone(),
            config.clone(),
            budget.clone(),
            stats.clone(),
            receiver,
        );
        std::thread::Builder::new()
            .name("modelmux-llm-engine".into())
            .spawn(move || state.run())
            .map_err(|e| LlmError::EngineStopped(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                commands,
                stats,
                budget,
                config,
                grammars: constrain::Grammars::new(tokenizer.clone(), model_config.vocab_size),
                tokenizer,
                kv_bytes_per_token: model_config.kv_bytes_per_token(kv_dtype),
                model_config,
                kv_dtype,
                can_reload,
            }),
        })
    }

    /// The engine's limits.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.inner.tokenizer
    }

    /// The model's shape.
    pub fn model_config(&self) -> &crate::LlamaConfig {
        &self.inner.model_config
    }

    /// How the KV cache stores keys and values.
    pub fn kv_dtype(&self) -> KvDtype {
        self.inner.kv_dtype
    }

    /// Bytes of KV cache one token of a sequence takes (and reserves from the budget).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.inner.kv_bytes_per_token
    }

    /// Checks `request` and queues it. Errors here are the request's own (too long, bad
    /// parameters) or an immediate overload (`max_waiting` full).
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream> {
        let mut streams = self.submit_choices(request, 1)?;
        Ok(streams.remove(0))
    }

    /// Queues `request` for `n` choices (OpenAI's `n`): the prompt is prefilled once and its
    /// KV copied to each choice, which then samples on its own (choice `i` with `seed + i`
    /// when the request has a seed). Admission reserves the KV of all `n` and `n` sequence
    /// slots at once, so `n` must be at most `max_num_seqs`. One stream per choice, in order.
    pub fn submit_choices(
        &self,
        request: GenerationRequest,
        n: usize,
    ) -> Result<Vec<GenerationStream>> {
        let inner = &self.inner;
        request.params.validate(inner.model_config.vocab_size)?;
        let most = inner
            .config
            .max_running_per_adapter
            .map_or(inner.config.max_num_seqs, |cap| {
                cap.min(inner.config.max_num_seqs)
            });
        if n == 0 || n > most {
            return Err(LlmError::InvalidRequest(format!(
                "n must be from 1 to {most} (max_num_seqs, or the per-adapter cap), got {n}"
            )));
        }
        self.check_prompt(&request.prompt, request.params.max_tokens)?;
        let bytes_per_token = inner.kv_bytes_per_token;
        let needed =
            bytes_per_token * (request.prompt.len() + request.params.max_tokens) as u64 * n as u64;
        if needed > inner.budget.capacity() {
            return Err(LlmError::ContextOverflow {
                prompt_tokens: request.prompt.len(),
                max_tokens: request.params.max_tokens * n,
                context: (inner.budget.capacity() / bytes_per_token) as usize,
            });
        }
        let mut receivers = Vec::with_capacity(n);
        let mut senders = Vec::with_capacity(n);
        for _ in 0..n {
            let (events, receiver) = mpsc::unbounded_channel();
            senders.push(events);
            receivers.push(GenerationStream { events: receiver });
        }
        let mut senders = senders.into_iter();
        let mut sequence = sequence::Sequence::new(
            request.prompt,
            request.params,
            request.adapter,
            request.constraint,
            senders.next().expect("n >= 1"),
            tokio::time::Instant::now() + inner.config.queue_timeout,
            bytes_per_token,
        );
        sequence.add_choices(senders);
        self.send(Command::Submit(Box::new(sequence)))?;
        Ok(receivers)
    }

    /// Compiles `constraint` for this engine's tokenizer (the first call indexes the
    /// vocabulary). A constraint the grammar library cannot compile is an
    /// [`LlmError::InvalidRequest`] naming `what`, the request field it came from.
    pub fn compile_constraint(
        &self,
        constraint: &Constraint,
        what: &str,
    ) -> Result<TokenConstraint> {
        self.inner.grammars.compile(constraint, what)
    }

    /// Checks a prompt that `more` tokens will follow: not empty, in the vocabulary, within
    /// the context.
    fn check_prompt(&self, prompt: &[u32], more: usize) -> Result<()> {
        let vocab = self.inner.model_config.vocab_size;
        if prompt.is_empty() {
            return Err(LlmError::InvalidRequest("the prompt is empty".into()));
        }
        crate::check_token_ids("prompt", prompt, vocab)?;
        let context = self.inner.config.max_model_len;
        if prompt.len().saturating_add(more) > context {
            return Err(LlmError::ContextOverflow {
                prompt_tokens: prompt.len(),
                max_tokens: more,
                context,
            });
        }
        Ok(())
    }

    /// Queues a command for the engine thread without waiting: a full queue is an overload.
    fn send(&self, command: Command) -> Result<()> {
        match self.inner.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(_)) => Err(LlmError::Overloaded {
                reason: format!(
                    "{} requests are already waiting",
                    self.inner.config.max_waiting
                ),
                retry_after: Duration::from_secs(1),
            }),
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
                Err(LlmError::EngineStopped("the engine thread is gone".into()))
            }
        }
    }

    /// Whether the engine thread still runs (it stops only when every handle is dropped, or
    /// if it dies of a bug outside a step, which health checks then catch).
    pub fn is_running(&self) -> bool {
        !self.inner.stats.stopped.load(Ordering::SeqCst)
    }

    /// Releases the weights' memory (Ray's and vLLM's `sleep`): generation stops as with
    /// [`pause`](Self::pause) until [`wake_up`](Self::wake_up) loads them again; sequences keep
    /// their KV caches and go on afterwards. Only an engine started with a way to reload its
    /// weights ([`start_with_reload`](Self::start_with_reload)) can sleep.
    pub fn sleep(&self) -> Result<()> {
        if !self.inner.can_reload {
            return Err(LlmError::InvalidRequest(
                "this engine cannot load its weights again, so it cannot sleep".into(),
            ));
        }
        self.inner.stats.want_sleep.store(true, Ordering::SeqCst);
        // An idle engine waits for a command: give it one. A full channel means it is busy
        // and will see the flag between steps anyway.
        let _ = self.inner.commands.try_send(Command::Poke);
        Ok(())
    }

    /// Loads the weights again after [`sleep`](Self::sleep) (on the engine's thread, at its
    /// next turn); [`is_asleep`](Self::is_asleep) turns false when they are back. A failed
    /// earlier load is forgotten: [`weights_state`](Self::weights_state) reads `Released`
    /// until this attempt ends.
    pub fn wake_up(&self) {
        self.inner.stats.weights.send_if_modified(|state| {
            let failed = matches!(state, WeightsState::ReloadFailed(_));
            if failed {
                *state = WeightsState::Released;
            }
            failed
        });
        self.inner.stats.want_sleep.store(false, Ordering::SeqCst);
        let _ = self.inner.commands.try_send(Command::Poke);
    }

    /// Whether the weights are released now.
    pub fn is_asleep(&self) -> bool {
        *self.inner.stats.weights.borrow() != WeightsState::Loaded
    }

    /// Why the last wake-up failed (the engine then stays asleep), if it did.
    pub fn wake_error(&self) -> Option<String> {
        match &*self.inner.stats.weights.borrow() {
            WeightsState::ReloadFailed(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Where the weights are now.
    pub fn weights_state(&self) -> WeightsState {
        self.inner.stats.weights.borrow().clone()
    }

    /// Waits until the weights are in a state `done` accepts (woken by the engine thread's
    /// change, not by polling) and returns it; `None` if `timeout` passes first or the
    /// engine thread has stopped (see [`is_running`](Self::is_running)).
    pub async fn wait_for_weights(
        &self,
        mut done: impl FnMut(&WeightsState) -> bool,
        timeout: Duration,
    ) -> Option<WeightsState> {
        let stats = &self.inner.stats;
        let mut changes = stats.weights.subscribe();
        // The sender lives in the engine's stats, which this handle keeps: the wait cannot
        // fail for a dropped sender. A stopping engine thread wakes it (`StopFlag`).
        let wait = changes.wait_for(|s| done(s) || stats.stopped.load(Ordering::SeqCst));
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(state)) if done(&state) => Some(state.clone()),
            _ => None,
        }
    }

    /// Stops generating: no step runs and nothing is admitted until [`resume`](Self::resume);
    /// running sequences keep their KV memory, new requests queue (bounded by `max_waiting`),
    /// and cancelled ones are still freed. Ray's and vLLM's `pause_generation`.
    pub fn pause(&self) {
        self.inner.stats.paused.store(true, Ordering::SeqCst);
    }

    /// Drops every cached prompt prefix (Ray's and vLLM's `reset_prefix_cache`) and returns
    /// once the engine thread has done so (within a step): the cache's memory is free and
    /// its figures read zero by then, and requests submitted afterwards compute their
    /// prompts whole.
    pub async fn reset_prefix_cache(&self) -> Result<()> {
        let (done, dropped) = tokio::sync::oneshot::channel();
        self.send(Command::ResetPrefixCache(done))?;
        dropped
            .await
            .map_err(|_| LlmError::EngineStopped("the engine stopped before the reset".into()))
    }

    /// Generates again after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.inner.stats.paused.store(false, Ordering::SeqCst);
    }

    /// Whether the engine is paused.
    pub fn is_paused(&self) -> bool {
        self.inner.stats.paused.load(Ordering::SeqCst)
    }

    /// The embedding of `tokens` (with `adapter`, or the base model): the mean of the last
    /// hidden states, normalised (see [`LlamaModel::embed`]). Runs on the engine thread
    /// between two steps, with its KV memory taken from the budget for as long as it runs;
    /// an asleep engine runs it when it wakes up.
    pub async fn embed(&self, tokens: Vec<u32>, adapter: Option<AdapterLease>) -> Result<Vec<f32>> {
        let inner = &self.inner;
        self.check_prompt(&tokens, 0)?;
        let bytes = inner.kv_bytes_per_token * tokens.len() as u64;
        let reservation = inner
            .budget
            .try_reserve(bytes)
            .ok_or_else(|| LlmError::Overloaded {
                reason: "the KV cache budget is in use".into(),
                retry_after: Duration::from_secs(1),
            })?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = EmbedJob {
            tokens,
            adapter,
            reservation,
            reply,
        };
        self.send(Command::Embed(Box::new(job)))?;
        answer
            .await
            .map_err(|_| LlmError::EngineStopped("the engine dropped the request".into()))?
    }

    /// Fault injection for tests: the next step panics inside the forward pass, as a bug in
    /// the model code would, so a test can check that it fails that step's sequences only.
    #[doc(hidden)]
    pub fn inject_step_panic(&self) {
        self.inner.stats.inject_panic.store(true, Ordering::SeqCst);
    }

    /// The adapters its running and waiting sequences use, as of the last step.
    pub fn adapters_in_use(&self) -> AdaptersInUse {
        self.inner.stats.adapters.lock().clone()
    }

    /// Live figures.
    pub fn snapshot(&self) -> EngineSnapshot {
        let s = &self.inner.stats;
        let prefix_bytes = s.prefix_bytes.load(Ordering::Relaxed);
        EngineSnapshot {
            running: s.running.load(Ordering::Relaxed),
            waiting: s.waiting.load(Ordering::Relaxed),
            steps: s.steps.load(Ordering::Relaxed),
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
            prefix_cache_queries: s.prefix_queries.load(Ordering::Relaxed),
            prefix_cache_hits: s.prefix_hits.load(Ordering::Relaxed),
            prefix_cache_bytes: prefix_bytes,
            // The prefix cache's entries give their memory back whenever sequences need it:
            // in use is what live sequences hold (vLLM counts cached blocks as free too).
            kv_reserved_bytes: self.inner.budget.reserved().saturating_sub(prefix_bytes),
            kv_capacity_bytes: self.inner.budget.capacity(),
        }
    }
}
