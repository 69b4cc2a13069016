//! Log probabilities of generated tokens: the log-softmax of the model's logits at that step
//! (the adapter's delta included; before the logit bias, penalties, temperature and any
//! constraint, as vLLM reports "raw" log probabilities), for the chosen token and the most
//! likely alternatives.

/// The most alternatives a request may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A generated token's log probability and the `top` most likely tokens at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// `ln p(token)`.
    pub logprob: f32,
    /// The most likely tokens and their log probabilities, most likely first (lowest id on
    /// ties).
    pub top: Vec<(u32, f32)>,
}

/// The log probability of `token` and of the `top` most likely tokens under `logits`. Computed
/// in f64 (the normaliser sums tens of thousands of terms).
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    let log_z = max + sum.ln();
    let logprob = |l: f32| (l as f64 - log_z) as f32;
    let chosen = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| logprob(l));
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        let by_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() || (best.len() == top && l <= best[top - 1].1) {
                continue;
            }
            best.push((i as u32, l));
            best.sort_unstable_by(by_desc);
            best.truncate(top);
        }
    }
    TokenLogprob {
        logprob: chosen,
        top: best.into_iter().map(|(t, l)| (t, logprob(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_a_small_distribution() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let got = token_logprob(&logits, 2, 3);
        assert!((got.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        // Most likely first, the lower id first on ties.
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        let total: f64 = logits
            .iter()
            .map(|&l| (token_logprob(&logits, 0, 0).logprob as f64 + (l - 1.0) as f64).exp())
            .sum();
        assert!(
            (total - 1.0).abs() < 1e-6,
            "probabilities add up to 1: {total}"
        );
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let mut logits = vec![-1e4f32; 50_000];
        logits[7] = 1e4;
        let got = token_logprob(&logits, 7, 1);
        assert!(got.logprob.abs() < 1e-6 && got.top == vec![(7, got.logprob)]);
        assert!(token_logprob(&logits, 8, 0).logprob < -1e4);
    }
}
