//! The small kernels of the forward pass that are not matrix products by weights: RMSNorm,
//! rotary embeddings at per-row positions, SiLU gating, and causal attention of each
//! sequence's rows over its own KV cache. Loops over slices; the hot ones (attention's dot
//! products, softmax and weighted sums, SiLU) are `modelmux_kernels::vector`'s, compiled for
//! the CPU's widest vectors. Attention is split across threads (`parallel`) when there is
//! enough of it.

use modelmux_kernels::vector;

use crate::family::{Activation, RopeStyle};
use crate::gguf::RopeScaling;
use crate::kv::{KvHead, KvLayer};
use crate::parallel;

/// `x[r] = x[r] / rms(x[r]) * weight` for every row of width `weight.len()`.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    rms_norm_into(x, weight, eps, &mut out);
    out
}

/// [`rms_norm`] into `out` (as long as `x`).
pub(crate) fn rms_norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// [`rms_norm`] in place, over rows of `weight.len()` values (Qwen3's per-head q/k norm).
pub(crate) fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for row in x.chunks_exact_mut(d) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
}

/// Adds `bias` to each row of `x` (rows of `bias.len()` values).
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
}

/// Rotary position embeddings: pair `i` of each head (dimensions `(2i, 2i+1)` in GGUF's
/// interleaved layout, `(i, i + head_dim/2)` in NeoX's) rotated by
/// `position * base^(-2i / head_dim) / factors[i]`, the factors being `rope_freqs.weight`
/// where the model has one (as llama.cpp applies Llama 3's RoPE scaling), then stretched by
/// the [`RopeScaling`], applied in place to `rows x (heads * head_dim)` values, each row at
/// its own position.
pub(crate) struct Rope {
    head_dim: usize,
    style: RopeStyle,
    /// `cos` and `sin` for every position below `max_positions`, `head_dim / 2` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub(crate) fn new(
        head_dim: usize,
        style: RopeStyle,
        base: f32,
        factors: Option<&[f32]>,
        scaling: RopeScaling,
        max_positions: usize,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        let base = f64::from(base);
        let (inv_freq, magnitude) = match scaling {
            RopeScaling::Linear(factor) => {
                let f: Vec<f64> = (0..half)
                    .map(|i| {
                        let divisor = factors.map_or(1.0, |f| f64::from(f[i]));
                        base.powf(-2.0 * i as f64 / head_dim as f64) / divisor / f64::from(factor)
                    })
                    .collect();
                (f, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                attention_factor,
            } => {
                // The pairs turning more than `beta_fast` times over the original context
                // keep their frequency, fewer than `beta_slow` are interpolated (divided by
                // the factor), and a linear ramp mixes the two between (ggml's rope_yarn).
                let dims = head_dim as f64;
                let correction = |rotations: f32| {
                    dims * (original_context as f64
                        / (f64::from(rotations) * 2.0 * std::f64::consts::PI))
                        .ln()
                        / (2.0 * base.ln())
                };
                let low = correction(beta_fast).floor().max(0.0);
                let high = correction(beta_slow).ceil().min(dims - 1.0);
                let f: Vec<f64> = (0..half)
                    .map(|i| {
                        let divisor = factors.map_or(1.0, |f| f64::from(f[i]));
                        let extrapolated = base.powf(-2.0 * i as f64 / dims) / divisor;
                        let ramp = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        extrapolated / f64::from(factor) * (1.0 - keep) + extrapolated * keep
                    })
                    .collect();
                (f, f64::from(attention_factor))
            }
        };
        for p in 0..max_positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push((angle.cos() * magnitude) as f32);
                sin.push((angle.sin() * magnitude) as f32);
            }
        }
        Self {
            head_dim,
            style,
            cos,
            sin,
        }
    }

    pub(crate) fn max_positions(&self) -> usize {
        self.cos.len() / (self.head_dim / 2)
    }

    pub(crate) fn apply(&self, x: &mut [f32], positions: &[usize], width: usize) {
        let half = self.head_dim / 2;
        for (row, &p) in x.chunks_exact_mut(width).zip(positions) {
            let cos = &self.cos[p * half..(p + 1) * half];
            let sin = &self.sin[p * half..(p + 1) * half];
            for head in row.chunks_exact_mut(self.head_dim) {
                match self.style {
                    RopeStyle::Interleaved => {
                        for ((pair, c), s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * c - b * s;
                            pair[1] = a * s + b * c;
                        }
                    }
                    RopeStyle::NeoX => {
                        let (first, second) = head.split_at_mut(half);
                        for (((a, b), c), s) in first.iter_mut().zip(second).zip(cos).zip(sin) {
                            let (x, y) = (*a, *b);
                            *a = x * c - y * s;
                            *b = x * s + y * c;
                        }
                    }
                }
            }
        }
    }
}

/// `out = act(gate) * up` for rows of `gate_up` that hold `gate` then `up`, each `width`
/// values, into rows of `width` values of `out`.
pub(crate) fn gated_stacked(
    activation: Activation,
    gate_up: &[f32],
    width: usize,
    out: &mut [f32],
) {
    for (row, out) in gate_up
        .chunks_exact(2 * width)
        .zip(out.chunks_exact_mut(width))
    {
        let (gate, up) = row.split_at(width);
        match activation {
            Activation::Silu => vector::silu_mul(gate, up, out),
            Activation::GeluTanh => vector::gelu_tanh_mul(gate, up, out),
        }
    }
}

/// `acc += x`.
pub(crate) fn add_assign(acc: &mut [f32], x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += v;
    }
}

/// The shape of attention: query heads, key/value heads, head size; and how scores are
/// made: the queries' scale, a soft cap, a sliding window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionShape {
    pub(crate) n_head: usize,
    pub(crate) n_kv_head: usize,
    pub(crate) head_dim: usize,
    /// Scores are `q · k * scale`.
    pub(crate) scale: f32,
    /// Scores pass through `cap * tanh(s / cap)` (Gemma 2).
    pub(crate) softcap: Option<f32>,
    /// A row attends to the last `window` positions only, its own included.
    pub(crate) window: Option<usize>,
}

/// One sequence's rows in a step: queries `rows` of the batch, at positions
/// `start..start + rows.len()`, over keys and values holding positions `0..start + rows.len()`.
pub(crate) struct AttentionSpan<'a> {
    pub(crate) first_row: usize,
    pub(crate) rows: usize,
    pub(crate) start: usize,
    pub(crate) kv: KvLayer<'a>,
}

/// Causal attention of every span's rows; `q` and the result are `rows x (n_head * head_dim)`.
pub(crate) fn attention(q: &[f32], spans: &[AttentionSpan<'_>], shape: AttentionShape) -> Vec<f32> {
    let AttentionShape {
        n_head,
        n_kv_head,
        head_dim,
        scale,
        softcap,
        window,
    } = shape;
    let cap = softcap.unwrap_or(0.0);
    let width = n_head * head_dim;
    let mut out = vec![0.0; q.len()];
    // The step's rows: (span, row within span).
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut work = 0usize;
    for (s, span) in spans.iter().enumerate() {
        for i in 0..span.rows {
            items.push((s, i));
            work += window.map_or(span.start + i + 1, |w| w.min(span.start + i + 1));
        }
    }
    let group = n_head / n_kv_head;
    // One work item per (row, key/value head): the `group` query heads of one key/value
    // head are next to each other in a row, so its output is one slice of `out`.
    let group_width = group * head_dim;
    let item = |index: usize, out: &mut [f32], scores: &mut Vec<f32>| {
        let (s, i) = items[index / n_kv_head];
        let kvh = index % n_kv_head;
        let span = &spans[s];
        let row = span.first_row + i;
        let len = span.start + i + 1;
        let first = window.map_or(0, |w| len.saturating_sub(w));
        let q = &q[row * width + kvh * group_width..][..group_width];
        // The head's positions `first..len`, one after another.
        let positions = first * head_dim..len * head_dim;
        match span.kv.head(kvh) {
            KvHead::F32 { keys, values } => {
                let (keys, values) = (&keys[positions.clone()], &values[positions]);
                vector::attend(q, keys, values, head_dim, head_dim, scale, cap, scores, out);
            }
            KvHead::F16 { keys, values } => {
                let (keys, values) = (&keys[positions.clone()], &values[positions]);
                vector::attend_f16(q, keys, values, head_dim, head_dim, scale, cap, scores, out);
            }
        }
    };
    // Decode steps of a few short sequences are cheaper on one thread than a fork-join.
    // Past about 28 positions of SmolLM2's shape it pays to split even one sequence by its
    // key/value heads: its keys and values come from memory (the step's weights pushed
    // them out of cache) while the other core would wait (Zen 3, single-stream decode at
    // 46-174 positions: 2^17 -> 2^14 here gave +3%, 9 alternating runs).
    let count = items.len() * n_kv_head;
    let chunk_items = if work * n_head * head_dim < 1 << 14 {
        count
    } else {
        count.div_ceil(8 * parallel::threads())
    };
    parallel::for_each_chunk(&mut out, chunk_items * group_width, |chunk, out| {
        let mut scores = Vec::new();
        for (i, out) in out.chunks_exact_mut(group_width).enumerate() {
            item(chunk * chunk_items + i, out, &mut scores);
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvCache, KvDtype};

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Attention written the textbook way, in f64, with an explicit causal mask.
    fn reference_attention(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        start: usize,
        rows: usize,
        shape: AttentionShape,
    ) -> Vec<f32> {
        let AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            scale,
            softcap,
            window,
        } = shape;
        let total = start + rows;
        let mut out = vec![0.0f32; rows * n_head * head_dim];
        for i in 0..rows {
            for h in 0..n_head {
                let kvh = h * n_kv_head / n_head;
                let qv = &q[(i * n_head + h) * head_dim..][..head_dim];
                let mut w = vec![f64::NEG_INFINITY; total];
                for (j, wj) in w.iter_mut().enumerate().take(start + i + 1) {
                    if window.is_some_and(|window| start + i - j >= window) {
                        continue;
                    }
                    let k = &keys[(j * n_kv_head + kvh) * head_dim..][..head_dim];
                    let s = qv
                        .iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64;
                    *wj = softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh());
                }
                let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = w.iter().map(|x| (x - m).exp()).sum();
                for d in 0..head_dim {
                    let mut acc = 0.0;
                    for (j, wj) in w.iter().enumerate() {
                        acc += (wj - m).exp() / z
                            * values[(j * n_kv_head + kvh) * head_dim + d] as f64;
                    }
                    out[(i * n_head + h) * head_dim + d] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn attention_matches_the_textbook_form_for_mixed_spans() {
        let plain = AttentionShape {
            n_head: 6,
            n_kv_head: 2,
            head_dim: 16,
            scale: 0.25,
            softcap: None,
            window: None,
        };
        // Gemma's: another scale, soft-capped scores, a window shorter than most spans.
        let gemma = AttentionShape {
            scale: 0.4,
            softcap: Some(2.0),
            window: Some(7),
            ..plain
        };
        for half in [false, true] {
            attention_matches_for(plain, half);
            attention_matches_for(gemma, half);
        }
    }

    /// With `half`, the keys and values are stored in binary16, and the reference is given
    /// the values they round to. The spans read real caches, so their layout is checked too.
    fn attention_matches_for(shape: AttentionShape, half: bool) {
        let width = shape.n_head * shape.head_dim;
        let kv_width = shape.n_kv_head * shape.head_dim;
        let mut seed = 7;
        // A decode row at position 40, a prefill chunk of 5 rows at 0..5, a chunk of 3 at 9..12,
        // and a big prefill so the threaded path runs too.
        let cases = [(40usize, 1usize), (0, 5), (9, 3), (0, 300)];
        let rows: usize = cases.iter().map(|c| c.1).sum();
        let q: Vec<f32> = (0..rows * width).map(|_| lcg(&mut seed)).collect();
        // Each span's keys and values, position after position, in a cache of one layer (of
        // the type `half` says); the reference gets them as the cache holds them.
        let dtype = if half { KvDtype::F16 } else { KvDtype::F32 };
        let held = |x: Vec<f32>| -> Vec<f32> {
            if !half {
                return x;
            }
            let mut b = vec![0u16; x.len()];
            vector::f16_bits(&x, &mut b);
            b.iter()
                .map(|b| half::f16::from_bits(*b).to_f32())
                .collect()
        };
        let mut caches = Vec::new();
        let mut inputs = Vec::new();
        for &(start, n) in &cases {
            let len = (start + n) * kv_width;
            let keys: Vec<f32> = (0..len).map(|_| lcg(&mut seed)).collect();
            let values: Vec<f32> = (0..len).map(|_| lcg(&mut seed)).collect();
            let mut cache =
                KvCache::with_shape(1, shape.n_kv_head, shape.head_dim, dtype, start + n, None);
            cache.append(0, &keys, &values);
            cache.advance(start + n);
            caches.push(cache);
            inputs.push([held(keys), held(values)]);
        }
        let mut spans = Vec::new();
        let mut first_row = 0;
        for (cache, &(start, n)) in caches.iter().zip(&cases) {
            spans.push(AttentionSpan {
                first_row,
                rows: n,
                start,
                kv: cache.layer(0),
            });
            first_row += n;
        }
        let got = attention(&q, &spans, shape);
        for (span, [keys, values]) in spans.iter().zip(&inputs) {
            let q_rows = &q[span.first_row * width..(span.first_row + span.rows) * width];
            let want = reference_attention(q_rows, keys, values, span.start, span.rows, shape);
            let got = &got[span.first_row * width..(span.first_row + span.rows) * width];
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        let rope = Rope::new(
            4,
            RopeStyle::Interleaved,
            10_000.0,
            None,
            RopeScaling::Linear(1.0),
            16,
        );
        let mut x = vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        rope.apply(&mut x, &[0, 3], 4);
        assert_eq!(&x[..4], &[1.0, 0.0, 1.0, 0.0]);
        // Pair 0 turns by 3 rad, pair 1 by 3 / 100 rad.
        assert!((x[4] - 3f32.cos()).abs() < 1e-6 && (x[5] - 3f32.sin()).abs() < 1e-6);
        assert!((x[6] - 0.03f32.cos()).abs() < 1e-6 && (x[7] - 0.03f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn rms_norm_matches_plain_sums() {
        let mut seed = 3;
        let x: Vec<f32> = (0..2 * 37).map(|_| lcg(&mut seed)).collect();
        let w: Vec<f32> = (0..37).map(|_| lcg(&mut seed)).collect();
        let y = rms_norm(&x, &w, 1e-5);
        for r in 0..2 {
            let row = &x[r * 37..(r + 1) * 37];
            let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 37.0;
            for i in 0..37 {
                let want = row[i] as f64 / (ms + 1e-5).sqrt() * w[i] as f64;
                assert!((y[r * 37 + i] as f64 - want).abs() < 1e-5);
            }
        }
    }
}
