//! The forward pass of a Llama-family model over a batch of sequences, each with its own KV
//! cache, positions and LoRA adapter (or none). One call runs one engine step: decode rows
//! and prefill chunks of any sequences, mixed, in one pass, so every weight matrix is read
//! once per step whatever the batch holds.

use crate::error::Result;
use crate::gguf::LlamaConfig;
use crate::kv::{KvCache, KvDtype};
use crate::lockstep::Lockstep;
use crate::lora::{AdapterLease, LoraAdapter};
use crate::ops::Rope;
use crate::parallel;
use crate::weights::{LlamaWeights, WeightFormat};

mod pass;
mod project;

/// One sequence's part of a step: the tokens it adds (one to decode, or a chunk of its
/// prompt), its cache (holding every token before them) and its adapter.
pub struct Segment<'a> {
    /// The tokens, at positions `cache.len()..cache.len() + tokens.len()`.
    pub tokens: &'a [u32],
    /// The sequence's KV cache; the tokens are appended to it.
    pub cache: &'a mut KvCache,
    /// The adapter applied to this sequence's rows, or `None` for the base model.
    pub adapter: Option<&'a LoraAdapter>,
    /// Whether the logits after the last token are wanted (the prompt's last chunk, or a
    /// decode step).
    pub want_logits: bool,
    /// Whether the logits after every token of the segment are wanted (prompt log
    /// probabilities): then its entry holds `tokens.len()` rows of logits, the last row last.
    pub all_logits: bool,
}

/// One sequence's part of a step, owned: what a [`Segment`] borrows, for an engine that
/// hands its step over to a pass shared with the other engines of the model
/// ([`LlamaModel::forward_shared`]).
pub(crate) struct OwnedSegment {
    pub(crate) tokens: Vec<u32>,
    pub(crate) cache: KvCache,
    pub(crate) adapter: Option<AdapterLease>,
    pub(crate) want_logits: bool,
    pub(crate) all_logits: bool,
}

impl OwnedSegment {
    fn borrowed(&mut self) -> Segment<'_> {
        Segment {
            tokens: &self.tokens,
            cache: &mut self.cache,
            adapter: self.adapter.as_deref(),
            want_logits: self.want_logits,
            all_logits: self.all_logits,
        }
    }
}

/// A step's segments given back after a shared pass, with their logits (as
/// [`LlamaModel::forward`] returns them) or why the pass failed.
pub(crate) type SharedStep = (
    Vec<OwnedSegment>,
    std::result::Result<Vec<Option<Vec<f32>>>, String>,
);

/// How long an engine leading a shared pass waits for the other engines of the previous pass
/// to hand their next steps over (`lockstep`). An engine hands its next step over as soon as
/// it has sampled from the last one, and says when it stops stepping; this only bounds the
/// wait for one that is held up (an embedding run between steps, a busy machine).
const STEP_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

/// A Llama-family model ready to run: its weights and rotary tables.
pub struct LlamaModel {
    weights: LlamaWeights,
    rope: Rope,
    /// The sliding-window layers' table, where their base or scaling differs (Gemma 3).
    window_rope: Option<Rope>,
    /// Where the engines sharing this model meet to run their steps as one pass.
    lockstep: Lockstep<Vec<OwnedSegment>, SharedStep>,
}

impl LlamaModel {
    /// A model that runs sequences of at most `max_positions` tokens.
    pub fn new(weights: LlamaWeights, max_positions: usize) -> Self {
        let config = &weights.config;
        let table = |base: f32, scaling| {
            Rope::new(
                config.head_dim,
                config.family.rope,
                base,
                weights.rope_factors.as_deref(),
                scaling,
                max_positions,
            )
        };
        let rope = table(config.rope_base, config.rope_scaling);
        let window_rope = (config.window_layers.iter().any(|w| *w)
            && (config.rope_base_window, config.rope_scaling_window)
                != (config.rope_base, config.rope_scaling))
            .then(|| table(config.rope_base_window, config.rope_scaling_window));
        Self {
            weights,
            rope,
            window_rope,
            lockstep: Lockstep::new(STEP_WINDOW),
        }
    }

    /// Forward passes run for engines so far, each holding the steps of every engine of this
    /// model that had one ready: fewer than the engines' steps together when they shared.
    pub fn passes(&self) -> u64 {
        self.lockstep.rounds()
    }

    /// A number for an engine that runs its steps through
    /// [`forward_shared`](Self::forward_shared).
    pub(crate) fn step_member(&self) -> u64 {
        self.lockstep.member()
    }

    /// Engine `member` runs no step until its next [`forward_shared`](Self::forward_shared):
    /// the others do not wait for it.
    pub(crate) fn step_leave(&self, member: u64) {
        self.lockstep.leave(member);
    }

    /// [`forward`](Self::forward) of `segments`, engine `member`'s step, in one pass with the
    /// steps the other engines of this model hand over meanwhile (`lockstep`): N replicas
    /// of one model in a process read the weights once per step, as one replica does. Blocks
    /// until the pass is done; gives the segments back.
    pub(crate) fn forward_shared(&self, member: u64, segments: Vec<OwnedSegment>) -> SharedStep {
        self.lockstep
            .meet(member, segments, |steps| self.forward_steps(steps))
    }

    /// One pass over several engines' steps; each step's segments and logits back.
    fn forward_steps(&self, mut steps: Vec<Vec<OwnedSegment>>) -> Vec<SharedStep> {
        // A step that cannot run fails alone, before the pass: one engine's fault never
        // fails another's sequences.
        let faults: Vec<Option<String>> = steps
            .iter_mut()
            .map(|step| {
                step.iter_mut()
                    .find_map(|s| self.check(&s.borrowed()).err())
                    .map(|e| e.to_string())
            })
            .collect();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut segments: Vec<Segment<'_>> = steps
                .iter_mut()
                .zip(&faults)
                .filter(|(_, fault)| fault.is_none())
                .flat_map(|(step, _)| step.iter_mut().map(OwnedSegment::borrowed))
                .collect();
            self.forward(&mut segments)
        }));
        let mut logits = match result {
            Ok(Ok(logits)) => Ok(logits.into_iter()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!(
                "the forward pass panicked: {}",
                modelmux_cache::panic_message(&*panic)
            )),
        };
        steps
            .into_iter()
            .zip(faults)
            .map(|(step, fault)| {
                let answer = match (fault, &mut logits) {
                    (Some(fault), _) => Err(fault),
                    (None, Ok(all)) => Ok(all.by_ref().take(step.len()).collect()),
                    (None, Err(message)) => Err(message.clone()),
                };
                (step, answer)
            })
            .collect()
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// How a KV cache of this model stores keys and values unless told otherwise: f32 with
    /// f32 weights, binary16 with quantized ones ([`KvDtype::for_weights`]).
    pub fn kv_dtype(&self) -> KvDtype {
        KvDtype::for_weights(self.weights.format)
    }

    /// The longest sequence this model runs.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// Runs one step. Returns, for each segment, the logits after its last token when it
    /// asked for them.
    pub fn forward(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        if self.weights.format == WeightFormat::Auto {
            parallel::run(|| self.step(segments, false))
        } else {
            // candle's kernels split their work on their own pools: a step inside rayon's
            // would leave two pools' threads spinning against each other.
            self.step(segments, false)
        }
    }

    /// Embeddings: for each segment, the mean over its tokens of the last hidden states (after
    /// the final norm), scaled to length 1. The tokens are appended to the caches as by
    /// [`forward`](Self::forward); `want_logits` is ignored.
    pub fn embed(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Vec<f32>>> {
        let pooled = if self.weights.format == WeightFormat::Auto {
            parallel::run(|| self.step(segments, true))?
        } else {
            self.step(segments, true)?
        };
        Ok(pooled.into_iter().map(Option::unwrap_or_default).collect())
    }
}
