//! One sequence's state in the engine: its tokens, cache, sampler, adapter lease, and the text
//! it has streamed, with stop strings held back until they can no longer match.

use std::sync::Arc;

use modelmux_grammar::TokenConstraint;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{AdapterLease, FinishReason, GenerationEvent, Usage};
use crate::kv::{KvCache, KvDtype, KvReservation};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{TextStream, TextTokenizer};

pub(crate) struct Sequence {
    pub(super) prompt: Vec<u32>,
    pub(super) generated: Vec<u32>,
    pub(super) params: SamplingParams,
    pub(super) sampler: Sampler,
    pub(super) adapter: Option<AdapterLease>,
    /// The grammar the output must match, if any.
    pub(super) constraint: Option<TokenConstraint>,
    pub(super) events: mpsc::UnboundedSender<GenerationEvent>,
    /// Set once admitted.
    pub(super) cache: Option<KvCache>,
    /// Held only until admission, then owned by the cache.
    pub(super) reservation_bytes: u64,
    pub(super) deadline: Instant,
    text: TextStream,
    /// Text not yet sent because it may be the start of a stop string.
    held: String,
    /// The log probability of the token being pushed, sent with it.
    logprob: Option<crate::TokenLogprob>,
    /// The streams of this request's other choices (`n > 1`), which become sequences of their
    /// own when the prompt is prefilled (`fork_choices`).
    choices: Vec<mpsc::UnboundedSender<GenerationEvent>>,
    /// The KV bytes one choice reserves (prompt and `max_tokens`).
    choice_bytes: u64,
    /// The prompt's log probabilities so far (tokens 1.. of the prompt), sent with the first
    /// generated token.
    prompt_logprobs: Vec<crate::TokenLogprob>,
    /// Whether they went out already.
    prompt_logprobs_sent: bool,
}

/// What happened after a sequence took a token.
pub(super) enum Progress {
    Continue,
    Finished(FinishReason),
}

impl Sequence {
    pub(super) fn new(
        prompt: Vec<u32>,
        mut params: SamplingParams,
        adapter: Option<AdapterLease>,
        constraint: Option<TokenConstraint>,
        events: mpsc::UnboundedSender<GenerationEvent>,
        deadline: Instant,
        kv_bytes_per_token: u64,
    ) -> Self {
        let reservation_bytes = kv_bytes_per_token * (prompt.len() + params.max_tokens) as u64;
        // Sorted once, searched for every generated token (`push`).
        params.stop_token_ids.sort_unstable();
        params.stop_token_ids.dedup();
        Self {
            sampler: Sampler::new(&params),
            prompt,
            generated: Vec::new(),
            params,
            adapter,
            constraint,
            events,
            cache: None,
            reservation_bytes,
            deadline,
            text: TextStream::new(),
            held: String::new(),
            logprob: None,
            choices: Vec::new(),
            choice_bytes: reservation_bytes,
            prompt_logprobs: Vec::new(),
            prompt_logprobs_sent: false,
        }
    }

    /// Records the log probabilities of the prompt tokens that the `rows` rows of `logits`
    /// (the chunk just run, ending at the cache's length) predict.
    pub(super) fn record_prompt_logprobs(&mut self, logits: &[f32], rows: usize, vocab: usize) {
        let Some(top) = self.params.prompt_logprobs else {
            return;
        };
        let end = self.cache.as_ref().map_or(0, |c| c.len());
        let start = end - rows;
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let next = start + r + 1;
            if let Some(&token) = self.prompt.get(next) {
                self.prompt_logprobs
                    .push(crate::token_logprob(row, token, top));
            }
        }
    }

    /// Adds the streams of the request's other choices; admission then reserves their KV and
    /// sequence slots with this one's.
    pub(super) fn add_choices(
        &mut self,
        choices: impl IntoIterator<Item = mpsc::UnboundedSender<GenerationEvent>>,
    ) {
        self.choices.extend(choices);
        self.reservation_bytes = self.choice_bytes * (1 + self.choices.len() as u64);
    }

    /// The sequence slots this sequence takes: its own and its choices' to come.
    pub(super) fn slots(&self) -> usize {
        1 + self.choices.len()
    }

    /// The other choices, as sequences of their own that start from this one's prompt (its
    /// KV copied, computed once) with their own sampler (`seed + index`), adapter lease and
    /// constraint; each takes its share of this sequence's KV reservation. Empty once done.
    pub(super) fn fork_choices(&mut self) -> Vec<Sequence> {
        let choices = std::mem::take(&mut self.choices);
        let mut forks = Vec::with_capacity(choices.len());
        for (i, events) in choices.into_iter().enumerate() {
            let mut params = self.params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64 + 1));
            let cache = self.cache.as_mut().map(|c| c.fork(self.choice_bytes));
            forks.push(Sequence {
                prompt: self.prompt.clone(),
                generated: Vec::new(),
                sampler: Sampler::new(&params),
                params,
                adapter: self.adapter.clone(),
                constraint: self.constraint.clone(),
                events,
                cache,
                reservation_bytes: self.choice_bytes,
                deadline: self.deadline,
                text: TextStream::new(),
                held: String::new(),
                logprob: None,
                choices: Vec::new(),
                choice_bytes: self.choice_bytes,
                prompt_logprobs: self.prompt_logprobs.clone(),
                prompt_logprobs_sent: false,
            });
        }
        self.reservation_bytes = self.choice_bytes;
        forks
    }

    pub(super) fn admit(
        &mut self,
        config: &crate::LlamaConfig,
        dtype: KvDtype,
        reservation: Option<KvReservation>,
    ) {
        let max_tokens = self.prompt.len() + self.params.max_tokens;
        self.cache = Some(KvCache::new(config, dtype, max_tokens, reservation));
    }

    /// Whether whoever asked is still listening (to this choice or one still to come).
    pub(super) fn is_abandoned(&self) -> bool {
        self.events.is_closed() && self.choices.iter().all(|c| c.is_closed())
    }

    /// Prompt tokens already in the cache.
    pub(super) fn prefilled(&self) -> usize {
        self.cache
            .as_ref()
            .map_or(0, |c| c.len())
            .min(self.prompt.len())
    }

    /// The tokens this sequence feeds next, at most `budget` of them: the next chunk of its
    /// prompt, or its last generated token.
    pub(super) fn next_input(&self, budget: usize) -> &[u32] {
        let done = self.prefilled();
        if done < self.prompt.len() {
            let end = (done + budget).min(self.prompt.len());
            &self.prompt[done..end]
        } else {
            // A sequence whose prompt is cached has generated at least one token.
            &self.generated[self.generated.len() - 1..]
        }
    }

    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated.len(),
        }
    }

    /// Takes token `id` sampled for this sequence and streams what it adds.
    pub(super) fn push(
        &mut self,
        id: u32,
        logprob: Option<crate::TokenLogprob>,
        tokenizer: &TextTokenizer,
        eos: &[u32],
    ) -> Progress {
        self.generated.push(id);
        self.logprob = logprob;
        if self.params.stop_token_ids.binary_search(&id).is_ok()
            || (!self.params.ignore_eos && eos.contains(&id))
        {
            self.send_token(id, String::new());
            return Progress::Finished(FinishReason::Stop);
        }
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&self.text.push(tokenizer.token_bytes(id)));
        // A stop string anywhere in the new text (it may have begun in held-back text).
        let first_stop = self
            .params
            .stop
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            text.truncate(at);
            self.send_token(id, text);
            return Progress::Finished(FinishReason::Stop);
        }
        // Hold back the longest tail that could still grow into a stop string.
        let hold = self
            .params
            .stop
            .iter()
            .map(|s| longest_suffix_prefix(&text, s))
            .max()
            .unwrap_or(0);
        self.held = text.split_off(text.len() - hold);
        self.send_token(id, text);
        // A complete constrained output ends here: the grammar allows nothing but the end.
        if self.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            return Progress::Finished(FinishReason::Stop);
        }
        if self.generated.len() >= self.params.max_tokens {
            return Progress::Finished(FinishReason::Length);
        }
        Progress::Continue
    }

    fn send_token(&mut self, id: u32, text: String) {
        let logprob = self.logprob.take();
        let prompt_logprobs = (self.params.prompt_logprobs.is_some()
            && !std::mem::replace(&mut self.prompt_logprobs_sent, true))
        .then(|| std::mem::take(&mut self.prompt_logprobs));
        let _ = self.events.send(GenerationEvent::Token {
            id,
            text,
            logprob,
            prompt_logprobs,
        });
    }

    /// Sends what is left and the end of the stream.
    pub(super) fn finish(mut self, reason: FinishReason) {
        self.release();
        let mut rest = std::mem::take(&mut self.held);
        if reason == FinishReason::Length {
            rest.push_str(&self.text.finish());
        }
        let usage = self.usage();
        let prompt_logprobs = (self.params.prompt_logprobs.is_some() && !self.prompt_logprobs_sent)
            .then(|| std::mem::take(&mut self.prompt_logprobs));
        let _ = self.events.send(GenerationEvent::Finished {
            reason,
            rest,
            usage,
            prompt_logprobs,
        });
    }

    /// Gives back the KV memory and the adapter lease before the end is announced: a client
    /// that reads the engine's figures after its answer sees them returned.
    fn release(&mut self) {
        self.cache = None;
        self.adapter = None;
    }

    /// Fails this sequence and the choices it has not started yet.
    pub(super) fn fail(mut self, error: crate::LlmError) {
        self.release();
        let error = Arc::new(error);
        for choice in &self.choices {
            let _ = choice.send(GenerationEvent::Error(error.clone()));
        }
        let _ = self.events.send(GenerationEvent::Error(error));
    }
}

impl super::scheduler::Schedulable for Sequence {
    fn adapter(&self) -> Option<&str> {
        self.adapter.as_ref().map(|a| a.id())
    }
    fn adapter_serial(&self) -> Option<u64> {
        self.adapter.as_ref().map(|a| a.serial())
    }
    fn slots(&self) -> usize {
        Sequence::slots(self)
    }
    fn prompt_left(&self) -> usize {
        self.prompt.len() - self.prefilled()
    }
    fn kv_bytes(&self) -> u64 {
        self.reservation_bytes
    }
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn is_abandoned(&self) -> bool {
        Sequence::is_abandoned(self)
    }
}

/// The length of the longest proper suffix of `text` that is a prefix of `stop`, on a
/// character boundary of `text`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine thread looks every generated token up in the request's `stop_token_ids`:
    /// the lookup must not scan them (a request once could send millions, and each token
    /// scanned them all, for every sequence in the batch).
    #[test]
    fn stop_token_ids_are_looked_up_without_a_scan() {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm-prefix.gguf");
        let tokenizer = TextTokenizer::from_gguf(&crate::GgufFile::open(fixture).unwrap()).unwrap();
        let (stop, tokens) = (3u32, 20_000);
        // More than the API allows (1024): the engine's own cost, whatever reaches it.
        let mut stop_token_ids: Vec<u32> = (1_000_000..5_000_000).rev().collect();
        stop_token_ids.push(stop);
        let params = SamplingParams {
            max_tokens: tokens + 1,
            stop_token_ids,
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let (events, _receiver) = mpsc::unbounded_channel();
        let mut sequence = Sequence::new(vec![1], params, None, None, events, Instant::now(), 0);
        let started = Instant::now();
        for i in 0..tokens {
            let id = 10 + (i % 50) as u32;
            assert!(matches!(
                sequence.push(id, None, &tokenizer, &[]),
                Progress::Continue
            ));
        }
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_secs(1),
            "{tokens} tokens took {took:?} against 4,000,001 stop ids"
        );
        assert!(matches!(
            sequence.push(stop, None, &tokenizer, &[]),
            Progress::Finished(FinishReason::Stop)
        ));
    }

    #[test]
    fn suffix_prefix_overlap() {
        assert_eq!(longest_suffix_prefix("hello wo", "world"), 2);
        assert_eq!(longest_suffix_prefix("hello", "world"), 0);
        assert_eq!(longest_suffix_prefix("ab", "abc"), 2);
        assert_eq!(longest_suffix_prefix("x€", "€y"), 3);
        assert_eq!(longest_suffix_prefix("", "abc"), 0);
    }
}
