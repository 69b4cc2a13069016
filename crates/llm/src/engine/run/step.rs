//! The engine loop's step: which sequences take part and with how many tokens (decodes
//! first, prompt chunks round-robin by adapter within the row budget), one forward pass over
//! all of them (shared with the other engines of the model), then sampling and streaming each
//! sequence's next token.

use std::sync::atomic::Ordering;

use super::{EngineLoop, adapter_id};
use crate::engine::FinishReason;
use crate::engine::sequence::{Progress, Sequence};
use crate::engine::{EngineStats, constrain};
use crate::error::LlmError;
use crate::model::OwnedSegment;
use crate::tokenizer::TextTokenizer;

impl EngineLoop {
    /// One forward pass over every running sequence, then sampling.
    pub(super) fn step(&mut self) -> crate::Result<()> {
        // Which sequences take part, and with how many tokens: decodes first, then prompt
        // chunks within the row budget.
        let mut budget = self.config.max_batch_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            if s.prefilled() == s.prompt.len() {
                plan.push((i, 1));
                budget -= 1;
            }
        }
        // Prompt chunks round-robin by adapter: every adapter's oldest prompt before any
        // adapter's second, and so on.
        let mut prompts: Vec<(usize, usize)> = Vec::new();
        let mut seen: std::collections::HashMap<Option<&str>, usize> = Default::default();
        for (i, s) in self.running.iter().enumerate() {
            if s.prefilled() < s.prompt.len() {
                let turn = seen.entry(adapter_id(s)).or_default();
                prompts.push((*turn, i));
                *turn += 1;
            }
        }
        prompts.sort_unstable();
        for (_, i) in prompts {
            let s = &self.running[i];
            let left = s.prompt.len() - s.prefilled();
            if budget > 0 {
                let n = left.min(budget);
                plan.push((i, n));
                budget -= n;
            }
        }
        // Rows of one adapter side by side, so each adapter runs once per projection.
        plan.sort_by_key(|&(i, _)| (self.running[i].adapter.as_ref().map(|a| a.serial()), i));
        let prompt_rows: usize = plan
            .iter()
            .filter(|&&(i, _)| self.running[i].prefilled() < self.running[i].prompt.len())
            .map(|&(_, n)| n)
            .sum();

        // (sequence, tokens, whether they complete its prompt, whether every row's logits
        // are wanted: a prompt chunk whose log probabilities were asked for).
        let mut inputs: Vec<(usize, Vec<u32>, bool, bool)> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                let in_prompt = s.prefilled() < s.prompt.len();
                let tokens = s.next_input(n).to_vec();
                let completes = s.prefilled() + tokens.len() >= s.prompt.len();
                let all = in_prompt && s.params.prompt_logprobs.is_some();
                (i, tokens, completes, all)
            })
            .collect();
        if self.stats.inject_panic.swap(false, Ordering::SeqCst) {
            panic!("injected fault: a panic in the step's forward pass");
        }
        let model = self.model.clone().ok_or_else(|| {
            LlmError::Internal("a step ran while the weights were released".into())
        })?;
        // The segments own what they use for the pass (the caches move out of their
        // sequences and back), so that the other engines of this model can run theirs in the
        // same pass (`LlamaModel::forward_shared`).
        let ((segments, logits), masks) = {
            let mut by_index: Vec<Option<&mut Sequence>> =
                self.running.iter_mut().map(Some).collect();
            let mut segments: Vec<OwnedSegment> = Vec::with_capacity(inputs.len());
            let mut constrained = Vec::new();
            for (row, (i, tokens, completes, all)) in inputs.iter_mut().enumerate() {
                let s = by_index[*i].take().expect("each sequence once per step");
                let Sequence {
                    cache,
                    adapter,
                    constraint,
                    ..
                } = s;
                if *completes && let Some(c) = constraint.as_mut() {
                    constrained.push((row, c));
                }
                segments.push(OwnedSegment {
                    tokens: std::mem::take(tokens),
                    cache: cache.take().expect("admitted sequences have a cache"),
                    adapter: adapter.clone(),
                    want_logits: *completes,
                    all_logits: *all,
                });
            }
            let member = self.member;
            constrain::forward_with_masks(constrained, || model.forward_shared(member, segments))
        };
        for ((i, tokens, _, _), segment) in inputs.iter_mut().zip(segments) {
            *tokens = segment.tokens;
            self.running[*i].cache = Some(segment.cache);
        }
        let logits = logits.map_err(LlmError::Internal)?;
        self.stats
            .prompt_tokens
            .fetch_add(prompt_rows as u64, Ordering::Relaxed);

        // Prompts completed by this step are kept for later prompts with the same prefix.
        for (i, tokens, completes, _) in &inputs {
            let s = &self.running[*i];
            if *completes
                && s.generated.is_empty()
                && s.prefilled() == s.prompt.len()
                && !tokens.is_empty()
            {
                self.keep_prefix(*i);
            }
        }
        self.publish_prefixes();
        let mut masks = masks.into_iter().peekable();
        let mut ended = Vec::new();
        let mut born = Vec::new();
        let vocab = self.model_config.vocab_size;
        for (row, ((i, tokens, completes, all), logits)) in inputs.iter().zip(logits).enumerate() {
            let mask = masks.next_if(|(r, _)| *r == row).map(|(_, m)| m);
            let Some(mut logits) = logits else { continue };
            if *all {
                // Each row's logits predict the next prompt token: its log probability.
                let s = &mut self.running[*i];
                s.record_prompt_logprobs(&logits, tokens.len(), vocab);
                if !*completes {
                    continue;
                }
                logits.drain(..logits.len() - vocab);
            }
            let s = &mut self.running[*i];
            if s.params.max_tokens == 0 {
                // The prompt scored, nothing to generate (`echo` with `max_tokens: 0`).
                for choice in s.fork_choices() {
                    choice.finish(FinishReason::Length);
                }
                ended.push((*i, Ok(FinishReason::Length)));
                continue;
            }
            let mask = match mask {
                Some(Ok(mask)) => Some(mask),
                Some(Err(e)) => {
                    ended.push((*i, Err(LlmError::Internal(e.to_string()))));
                    continue;
                }
                None => None,
            };
            let s = &mut self.running[*i];
            // The other choices of an `n > 1` request start here, from the prompt's KV and
            // these logits, each sampling its own first token.
            for mut choice in s.fork_choices() {
                let outcome = self.take_token(&mut choice, logits.clone(), mask.as_ref());
                match outcome {
                    None => born.push(choice),
                    Some(Ok(reason)) => choice.finish(reason),
                    Some(Err(e)) => choice.fail(e),
                }
            }
            let s = &mut self.running[*i];
            if let Some(outcome) = Self::sample_into(
                s,
                logits,
                mask.as_ref(),
                &self.eos,
                &self.tokenizer,
                &self.stats,
            ) {
                ended.push((*i, outcome));
            }
        }
        // Finished sequences leave now, freeing their KV memory and adapter lease. The counts
        // are published before their ends are announced, so a client that reads the engine's
        // figures after its answer sees its sequence gone.
        ended.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        let ended: Vec<_> = ended
            .into_iter()
            .map(|(i, outcome)| (self.running.remove(i), outcome))
            .collect();
        self.running.extend(born);
        if !ended.is_empty() {
            self.publish();
        }
        for (s, outcome) in ended {
            match outcome {
                Ok(reason) => s.finish(reason),
                Err(e) => s.fail(e),
            }
        }
        Ok(())
    }

    fn take_token(
        &self,
        s: &mut Sequence,
        logits: Vec<f32>,
        mask: Option<&modelmux_grammar::TokenMask>,
    ) -> Option<Result<FinishReason, LlmError>> {
        Self::sample_into(s, logits, mask, &self.eos, &self.tokenizer, &self.stats)
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
