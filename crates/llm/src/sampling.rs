//! Choosing the next token from logits: greedy, or temperature with top-k and top-p, from a
//! per-sequence random stream (ChaCha8, seeded by the request when it gives a seed, so a
//! seeded request gives the same tokens every time, whatever else is in the batch).

use std::hash::{BuildHasher, Hasher};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{LlmError, Result};

/// How one request samples and when it stops.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (the most likely token, lowest id on ties); up to 2.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to `top_p` (1: all).
    pub top_p: f32,
    /// Seed of the random stream; `None` draws one.
    pub seed: Option<u64>,
    /// Most tokens to generate: at least 1, or 0 with `prompt_logprobs` (the prompt's log
    /// probabilities alone, as evaluation harnesses ask with `echo` and `max_tokens: 0`).
    pub max_tokens: usize,
    /// Stop when the generated text contains one of these (it is not part of the output).
    pub stop: Vec<String>,
    /// Stop after generating one of these tokens (not part of the text); at most
    /// [`MAX_STOP_TOKEN_IDS`].
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Added to a token's logit before sampling (OpenAI's `logit_bias`: -100 to 100; -100
    /// bans the token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Subtracted from the logit of every token already generated (-2 to 2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (-2 to 2).
    pub frequency_penalty: f32,
    /// Report each generated token's log probability and this many most likely alternatives
    /// (at most [`MAX_TOP_LOGPROBS`](crate::MAX_TOP_LOGPROBS)); `None` reports none.
    pub logprobs: Option<usize>,
    /// Report the prompt tokens' log probabilities (with this many alternatives each), with
    /// the first generated token; `None` reports none.
    pub prompt_logprobs: Option<usize>,
    /// Only requests with the same salt (and adapter content) share cached prompt prefixes
    /// (vLLM's `cache_salt`); `None` takes the engine's default salt.
    pub cache_salt: Option<String>,
}

/// Most `logit_bias` entries one request may carry.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Most `stop_token_ids` one request may give (the engine looks each generated token up in
/// them: a sorted list, searched in O(log n)).
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
            prompt_logprobs: None,
            cache_salt: None,
        }
    }
}

/// The most stop strings a request may give, and their longest length in bytes.
pub const MAX_STOP_STRINGS: usize = 16;
/// See [`MAX_STOP_STRINGS`].
pub const MAX_STOP_BYTES: usize = 256;

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_tokens,
            ..Self::default()
        }
    }

    /// Checks every field, naming the one out of range.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let bad = |m: String| Err(LlmError::InvalidRequest(m));
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad(format!(
                "temperature must be between 0 and 2, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.max_tokens == 0 && self.prompt_logprobs.is_none() {
            return bad(
                "max_tokens must be at least 1 (0 only to score the prompt: echo with logprobs)"
                    .into(),
            );
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return bad(format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                self.stop.len()
            ));
        }
        if let Some(s) = self
            .stop
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return bad(format!(
                "stop strings must be 1 to {MAX_STOP_BYTES} bytes long, got {} bytes",
                s.len()
            ));
        }
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return bad(format!("{name} must be between -2 and 2, got {value}"));
            }
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return bad(format!(
                "stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                self.stop_token_ids.len()
            ));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad(format!(
                "logit_bias may bias at most {MAX_LOGIT_BIAS} tokens, got {}",
                self.logit_bias.len()
            ));
        }
        if let Some((token, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return bad(format!(
                "logit_bias values must be between -100 and 100, got {bias} for token {token}"
            ));
        }
        if let Some(n) = self
            .logprobs
            .or(self.prompt_logprobs)
            .filter(|&n| n > crate::MAX_TOP_LOGPROBS)
        {
            return bad(format!(
                "top_logprobs must be at most {}, got {n}",
                crate::MAX_TOP_LOGPROBS
            ));
        }
        let biased: Vec<u32> = self.logit_bias.iter().map(|(t, _)| *t).collect();
        crate::check_token_ids("logit_bias", &biased, vocab_size)?;
        crate::check_token_ids("stop_token_ids", &self.stop_token_ids, vocab_size)
    }
}

/// One sequence's sampler.
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    rng: ChaCha8Rng,
    scratch: Vec<(f32, u32)>,
    logit_bias: Vec<(u32, f32)>,
    presence_penalty: f32,
    frequency_penalty: f32,
    /// How often each token was generated so far (kept only when a penalty is set).
    generated: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler following `params`.
    pub fn new(params: &SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0);
            h.finish()
        });
        Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            rng: ChaCha8Rng::seed_from_u64(seed),
            scratch: Vec::new(),
            logit_bias: params.logit_bias.clone(),
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            generated: std::collections::HashMap::new(),
        }
    }

    /// The next token, after the logit bias and the penalties are applied to `logits` (in
    /// place), as OpenAI defines them: `logit[j] + bias[j] - count[j] * frequency_penalty -
    /// (count[j] > 0) * presence_penalty`, `count[j]` being how often `j` was generated so far
    /// in this sequence (the prompt does not count, as in vLLM).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        for &(token, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(token as usize) {
                *l += bias;
            }
        }
        let penalised = self.presence_penalty != 0.0 || self.frequency_penalty != 0.0;
        if penalised {
            for (&token, &count) in &self.generated {
                if let Some(l) = logits.get_mut(token as usize) {
                    *l -= count as f32 * self.frequency_penalty + self.presence_penalty;
                }
            }
        }
        let token = self.pick(logits);
        if penalised {
            *self.generated.entry(token).or_default() += 1;
        }
        token
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.temperature == 0.0 || self.top_k == 1 {
            return argmax(logits);
        }
        let candidates = &mut self.scratch;
        candidates.clear();
        candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (l / self.temperature, i as u32)),
        );
        if candidates.is_empty() {
            return 0;
        }
        let by_logit_desc =
            |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if self.top_k > 0 && self.top_k < candidates.len() {
            candidates.select_nth_unstable_by(self.top_k - 1, by_logit_desc);
            candidates.truncate(self.top_k);
        }
        candidates.sort_unstable_by(by_logit_desc);
        let max = candidates[0].0;
        let mut total = 0.0f64;
        for c in candidates.iter_mut() {
            c.0 = (c.0 - max).exp();
            total += c.0 as f64;
        }
        if self.top_p < 1.0 {
            let mut kept = 0.0f64;
            let mut n = 0;
            for c in candidates.iter() {
                kept += c.0 as f64;
                n += 1;
                if kept >= self.top_p as f64 * total {
                    break;
                }
            }
            candidates.truncate(n);
            total = kept;
        }
        let mut target = self.rng.random::<f64>() * total;
        for c in candidates.iter() {
            target -= c.0 as f64;
            if target <= 0.0 {
                return c.1;
            }
        }
        candidates.last().map_or(0, |c| c.1)
    }
}

/// The index of the largest value (the lowest on ties; NaN never wins; 0 when nothing is
/// larger than negative infinity).
///
/// Two passes that the compiler vectorises: the largest value, 16 lanes at a time, then the
/// first index holding it. One branch per value, as a plain loop has, costs 20-30 us over a
/// 49152-token vocabulary, paid for every sequence of every step while the pool waits.
pub fn argmax(values: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            // Not `f32::max`: NaN must never be taken.
            *m = if v > *m { v } else { *m };
        }
    }
    let max = (lanes.iter().chain(chunks.remainder()))
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return 0;
    }
    values.iter().position(|&v| v == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: Some(seed),
            ..SamplingParams::default()
        }
    }

    proptest::proptest! {
        /// The vectorised argmax agrees with the definition (a plain loop keeping the first
        /// strictly larger value) on values drawn from a few, so ties are common, with NaNs
        /// and infinities among them, at lengths around the 16 lanes.
        #[test]
        fn argmax_is_the_first_strict_maximum(
            picks in proptest::collection::vec(0usize..7, 0..80),
        ) {
            let pool = [-1.0, 0.5, 2.0, 2.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY];
            let values: Vec<f32> = picks.iter().map(|&i| pool[i]).collect();
            let mut want = 0;
            let mut best = f32::NEG_INFINITY;
            for (i, &v) in values.iter().enumerate() {
                if v > best {
                    (want, best) = (i as u32, v);
                }
            }
            proptest::prop_assert_eq!(argmax(&values), want);
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
        let mut s = Sampler::new(&SamplingParams::greedy(1));
        assert_eq!(s.sample(&mut [0.0, -1.0, 5.0]), 2);
    }

    #[test]
    fn seeded_streams_repeat_and_differ_by_seed() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(&params(1.0, 0, 1.0, seed));
            (0..50)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        // Probabilities ~ 0.6, 0.3, 0.1 and a long tail of tiny ones.
        let mut logits = vec![-30.0f32; 50];
        logits[10] = (0.6f32).ln();
        logits[20] = (0.3f32).ln();
        logits[30] = (0.1f32).ln();
        let mut s = Sampler::new(&params(1.0, 2, 1.0, 1));
        for _ in 0..500 {
            assert!(matches!(s.sample(&mut logits.clone()), 10 | 20));
        }
        let mut s = Sampler::new(&params(1.0, 0, 0.85, 1));
        let mut seen = [0usize; 50];
        for _ in 0..2000 {
            seen[s.sample(&mut logits.clone()) as usize] += 1;
        }
        assert_eq!(seen[30], 0);
        assert!(seen[10] > seen[20] && seen[20] > 300, "{seen:?}");
    }

    /// OpenAI's definition, written out on its own: the adjusted logits for a sequence that
    /// generated `history`.
    fn openai_adjusted(
        logits: &[f32],
        history: &[u32],
        bias: &[(u32, f32)],
        presence: f32,
        frequency: f32,
    ) -> Vec<f32> {
        let mut out = logits.to_vec();
        for (j, l) in out.iter_mut().enumerate() {
            let count = history.iter().filter(|&&t| t as usize == j).count() as f32;
            let biased: f32 = bias
                .iter()
                .filter(|(t, _)| *t as usize == j)
                .map(|(_, b)| b)
                .sum();
            *l = *l + biased - count * frequency - if count > 0.0 { presence } else { 0.0 };
        }
        out
    }

    #[test]
    fn penalties_and_bias_follow_openais_definition() {
        // Greedy over 40 steps of varied logits, each penalty and bias setting: every token is
        // the argmax of the logits adjusted by the definition above, for the history so far.
        for (presence, frequency, bias) in [
            (0.0, 0.7, vec![]),
            (0.9, 0.0, vec![]),
            (0.4, 0.3, vec![(3u32, 2.0f32), (7, -100.0)]),
            (-0.5, -0.2, vec![(1, 0.5)]),
            (0.0, 0.0, vec![(5, 100.0)]),
        ] {
            let params = SamplingParams {
                presence_penalty: presence,
                frequency_penalty: frequency,
                logit_bias: bias.clone(),
                ..SamplingParams::greedy(40)
            };
            let mut s = Sampler::new(&params);
            let mut history = Vec::new();
            for step in 0..40 {
                let logits: Vec<f32> = (0..12)
                    .map(|i| ((i * 7 + step) as f32 * 0.61).sin() * 2.0)
                    .collect();
                let want = argmax(&openai_adjusted(
                    &logits, &history, &bias, presence, frequency,
                ));
                let got = s.sample(&mut logits.clone());
                assert_eq!(got, want, "step {step}, {presence}/{frequency}/{bias:?}");
                history.push(got);
            }
            if bias.contains(&(7, -100.0)) {
                assert!(!history.contains(&7), "a -100 bias bans the token");
            }
            if bias.contains(&(5, 100.0)) {
                assert!(history.iter().all(|&t| t == 5), "a 100 bias forces it");
            }
            if frequency > 0.5 {
                let distinct: std::collections::HashSet<_> = history.iter().collect();
                assert!(distinct.len() > 3, "repetition is penalised: {history:?}");
            }
        }
    }

    #[test]
    fn validation_names_the_field() {
        let v = 100;
        for (p, field) in [
            (
                SamplingParams {
                    temperature: 3.0,
                    ..SamplingParams::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    max_tokens: 0,
                    ..SamplingParams::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..SamplingParams::default()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![100],
                    ..SamplingParams::default()
                },
                "stop_token_ids",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1],
                    ..SamplingParams::default()
                },
                "stop_token_ids may hold at most 1024",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..SamplingParams::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -3.0,
                    ..SamplingParams::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 101.0)],
                    ..SamplingParams::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(100, 1.0)],
                    ..SamplingParams::default()
                },
                "logit_bias",
            ),
        ] {
            let e = p.validate(v).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        SamplingParams::default().validate(v).unwrap();
    }
}
