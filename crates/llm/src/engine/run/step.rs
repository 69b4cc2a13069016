//! The engine loop's step: the scheduler's plan (which sequences take part, with how many
//! tokens), one forward pass over all of them (shared with the other engines of the model),
//! then sampling and streaming each sequence's next token.

use std::sync::atomic::Ordering;

use super::EngineLoop;
use crate::engine::EngineStats;
use crate::engine::FinishReason;
use crate::engine::constrain::{self, RowMask};
use crate::engine::scheduler::StepPlan;
use crate::engine::sequence::{Progress, Sequence};
use crate::error::LlmError;
use crate::model::OwnedSegment;
use crate::tokenizer::TextTokenizer;

/// One row of a step, as the forward pass takes it.
struct Input {
    /// The running sequence's index.
    seq: usize,
    tokens: Vec<u32>,
    /// Whether these tokens complete its prompt (its next token is sampled from the logits).
    completes: bool,
    /// Whether every row's logits are wanted (a prompt chunk whose log probabilities were
    /// asked for).
    all_logits: bool,
}

/// Each row's logits (`None` for rows that sample nothing), and the grammar masks of the rows
/// that sample under a constraint.
type Forwarded = (Vec<Option<Vec<f32>>>, Vec<RowMask>);

/// How sampling left the step's sequences.
#[derive(Default)]
struct Sampled {
    /// Sequences that ended, by index, and how.
    ended: Vec<(usize, Result<FinishReason, LlmError>)>,
    /// Choices forked from a prompt just prefilled, to run from the next step.
    born: Vec<Sequence>,
}

impl EngineLoop {
    /// One forward pass over the running sequences the scheduler plans for, then sampling.
    pub(super) fn step(&mut self) -> crate::Result<()> {
        let plan = self.sched.plan();
        let mut inputs = self.inputs(&plan);
        if self.stats.inject_panic.swap(false, Ordering::SeqCst) {
            panic!("injected fault: a panic in the step's forward pass");
        }
        let (logits, masks) = self.forward(&mut inputs)?;
        self.stats
            .prompt_tokens
            .fetch_add(plan.prompt_tokens() as u64, Ordering::Relaxed);
        // Prompts completed by this step are kept for later prompts with the same prefix.
        for input in &inputs {
            let s = &self.sched.running()[input.seq];
            if input.completes
                && s.generated.is_empty()
                && s.prefilled() == s.prompt.len()
                && !input.tokens.is_empty()
            {
                self.keep_prefix(input.seq);
            }
        }
        self.publish_prefixes();
        let sampled = self.sample(&inputs, logits, masks);
        self.retire(sampled);
        Ok(())
    }

    /// The rows' tokens, as `plan` says.
    fn inputs(&self, plan: &StepPlan) -> Vec<Input> {
        let running = self.sched.running();
        plan.rows
            .iter()
            .map(|row| {
                let s = &running[row.seq];
                let tokens = s.next_input(row.tokens).to_vec();
                Input {
                    seq: row.seq,
                    completes: s.prefilled() + tokens.len() >= s.prompt.len(),
                    all_logits: row.prompt && s.params.prompt_logprobs.is_some(),
                    tokens,
                }
            })
            .collect()
    }

    /// The forward pass over `inputs`, with the grammar masks of the rows that sample
    /// computed beside it. The segments own what they use for the pass (the caches move out
    /// of their sequences and back), so that the other engines of this model can run theirs
    /// in the same pass (`LlamaModel::forward_shared`).
    fn forward(&mut self, inputs: &mut [Input]) -> crate::Result<Forwarded> {
        let model = self.weights.model.clone().ok_or_else(|| {
            LlmError::Internal("a step ran while the weights were released".into())
        })?;
        let member = self.weights.member;
        let ((segments, logits), masks) = {
            let mut by_index: Vec<Option<&mut Sequence>> =
                self.sched.running_mut().iter_mut().map(Some).collect();
            let mut segments: Vec<OwnedSegment> = Vec::with_capacity(inputs.len());
            let mut constrained = Vec::new();
            for (row, input) in inputs.iter_mut().enumerate() {
                let s = by_index[input.seq]
                    .take()
                    .expect("each sequence once per step");
                let Sequence {
                    cache,
                    adapter,
                    constraint,
                    ..
                } = s;
                if input.completes
                    && let Some(c) = constraint.as_mut()
                {
                    constrained.push((row, c));
                }
                segments.push(OwnedSegment {
                    tokens: std::mem::take(&mut input.tokens),
                    cache: cache.take().expect("admitted sequences have a cache"),
                    adapter: adapter.clone(),
                    want_logits: input.completes,
                    all_logits: input.all_logits,
                });
            }
            constrain::forward_with_masks(constrained, || model.forward_shared(member, segments))
        };
        let running = self.sched.running_mut();
        for (input, segment) in inputs.iter_mut().zip(segments) {
            input.tokens = segment.tokens;
            running[input.seq].cache = Some(segment.cache);
        }
        Ok((logits.map_err(LlmError::Internal)?, masks))
    }

    /// Samples each row's next token from its logits (rows that complete no prompt have
    /// none) and streams it; forks the other choices of a prompt just prefilled.
    fn sample(
        &mut self,
        inputs: &[Input],
        logits: Vec<Option<Vec<f32>>>,
        masks: Vec<RowMask>,
    ) -> Sampled {
        let mut masks = masks.into_iter().peekable();
        let mut out = Sampled::default();
        let vocab = self.weights.config.vocab_size;
        for (row, (input, logits)) in inputs.iter().zip(logits).enumerate() {
            let mask = masks.next_if(|(r, _)| *r == row).map(|(_, m)| m);
            let Some(mut logits) = logits else { continue };
            let s = &mut self.sched.running_mut()[input.seq];
            if input.all_logits {
                // Each row's logits predict the next prompt token: its log probability.
                s.record_prompt_logprobs(&logits, input.tokens.len(), vocab);
                if !input.completes {
                    continue;
                }
                logits.drain(..logits.len() - vocab);
            }
            if s.params.max_tokens == 0 {
                // The prompt scored, nothing to generate (`echo` with `max_tokens: 0`).
                for choice in s.fork_choices() {
                    choice.finish(FinishReason::Length);
                }
                out.ended.push((input.seq, Ok(FinishReason::Length)));
                continue;
            }
            let mask = match mask.transpose() {
                Ok(mask) => mask,
                Err(e) => {
                    out.ended
                        .push((input.seq, Err(LlmError::Internal(e.to_string()))));
                    continue;
                }
            };
            // The other choices of an `n > 1` request start here, from the prompt's KV and
            // these logits, each sampling its own first token.
            let (eos, tokenizer, stats) = (&self.eos, &*self.tokenizer, &*self.stats);
            for mut choice in s.fork_choices() {
                match Self::sample_into(
                    &mut choice,
                    logits.clone(),
                    mask.as_ref(),
                    eos,
                    tokenizer,
                    stats,
                ) {
                    None => out.born.push(choice),
                    Some(Ok(reason)) => choice.finish(reason),
                    Some(Err(e)) => choice.fail(e),
                }
            }
            if let Some(outcome) =
                Self::sample_into(s, logits, mask.as_ref(), eos, tokenizer, stats)
            {
                out.ended.push((input.seq, outcome));
            }
        }
        out
    }

    /// Finished sequences leave now, freeing their KV memory and adapter lease; forked
    /// choices join. The counts are published before the ends are announced, so a client
    /// that reads the engine's figures after its answer sees its sequence gone.
    fn retire(&mut self, sampled: Sampled) {
        let Sampled { ended, born } = sampled;
        let indices: Vec<usize> = ended.iter().map(|(i, _)| *i).collect();
        let gone = self.sched.retire(&indices);
        self.sched.extend_running(born);
        if !gone.is_empty() {
            self.publish();
        }
        for (s, (_, outcome)) in gone.into_iter().zip(ended) {
            match outcome {
                Ok(reason) => s.finish(reason),
                Err(e) => s.fail(e),
            }
        }
    }

    /// Samples `s`'s next token from `logits` under `mask`, advances its constraint, and
    /// streams the token: `None` while it goes on, else how it ended.
    fn sample_into(
        s: &mut Sequence,
        mut logits: Vec<f32>,
        mask: Option<&modelmux_grammar::TokenMask>,
        eos: &[u32],
        tokenizer: &TextTokenizer,
        stats: &EngineStats,
    ) -> Option<Result<FinishReason, LlmError>> {
        // Log probabilities come from the model's own logits, before the constraint, the bias
        // and the penalties change them for sampling.
        let raw = s.params.logprobs.map(|_| logits.clone());
        if let Some(mask) = mask {
            mask.apply(&mut logits);
        }
        let token = s.sampler.sample(&mut logits);
        stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = s.constraint.as_mut()
            && !eos.contains(&token)
            && let Err(e) = c.consume(token)
        {
            return Some(Err(LlmError::Internal(e.to_string())));
        }
        let logprob =
            raw.map(|raw| crate::token_logprob(&raw, token, s.params.logprobs.unwrap_or_default()));
        match s.push(token, logprob, tokenizer, eos) {
            Progress::Finished(reason) => Some(Ok(reason)),
            Progress::Continue => None,
        }
    }
}
