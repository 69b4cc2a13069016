//! One sequence's keys and values in every layer. Each key/value head's keys (and values)
//! are one contiguous stream, position after position: attention reads a head's positions
//! in order, a sequential stream the hardware prefetcher follows, where one stream per
//! layer (heads side by side in each position) made it jump a row's other heads at every
//! position (2.3x slower from memory at 500 positions of SmolLM2's shape: `bench_attend`).

use super::KvReservation;
use super::rows::{KvDtype, KvRows};
use crate::gguf::LlamaConfig;

/// One layer's keys and values, a stream per key/value head (`head_dim` values a position).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LayerRows {
    keys: Vec<KvRows>,
    values: Vec<KvRows>,
}

impl LayerRows {
    fn new(heads: usize, dtype: KvDtype) -> Self {
        Self {
            keys: (0..heads).map(|_| KvRows::new(dtype)).collect(),
            values: (0..heads).map(|_| KvRows::new(dtype)).collect(),
        }
    }

    fn streams(&self) -> impl Iterator<Item = &KvRows> {
        self.keys.iter().chain(&self.values)
    }
}

/// One layer of a cache, as attention reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KvLayer<'a> {
    rows: &'a LayerRows,
}

impl<'a> KvLayer<'a> {
    /// Key/value head `head`'s keys and values, position `p` at `p * head_dim`.
    pub(crate) fn head(&self, head: usize) -> KvHead<'a> {
        match (&self.rows.keys[head], &self.rows.values[head]) {
            (KvRows::F32(keys), KvRows::F32(values)) => KvHead::F32 { keys, values },
            (KvRows::F16(keys), KvRows::F16(values)) => KvHead::F16 { keys, values },
            _ => unreachable!("a cache stores keys and values alike"),
        }
    }
}

/// One key/value head's keys and values, borrowed as the cache stores them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum KvHead<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    /// IEEE binary16 bits.
    F16 {
        keys: &'a [u16],
        values: &'a [u16],
    },
}

/// One sequence's keys and values in every layer, `len` tokens long.
pub struct KvCache {
    layers: Vec<LayerRows>,
    len: usize,
    max_tokens: usize,
    n_kv_head: usize,
    head_dim: usize,
    dtype: KvDtype,
    _reservation: Option<KvReservation>,
}

impl KvCache {
    /// An empty cache of `dtype` for at most `max_tokens` tokens of a model shaped `config`,
    /// holding `reservation` (if any) for as long as it lives.
    pub fn new(
        config: &LlamaConfig,
        dtype: KvDtype,
        max_tokens: usize,
        reservation: Option<KvReservation>,
    ) -> Self {
        Self::with_shape(
            config.n_layer,
            config.n_kv_head,
            config.head_dim,
            dtype,
            max_tokens,
            reservation,
        )
    }

    /// An empty cache of `n_layer` layers of `n_kv_head` heads of `head_dim` values.
    pub(crate) fn with_shape(
        n_layer: usize,
        n_kv_head: usize,
        head_dim: usize,
        dtype: KvDtype,
        max_tokens: usize,
        reservation: Option<KvReservation>,
    ) -> Self {
        Self {
            layers: (0..n_layer)
                .map(|_| LayerRows::new(n_kv_head, dtype))
                .collect(),
            len: 0,
            max_tokens,
            n_kv_head,
            head_dim,
            dtype,
            _reservation: reservation,
        }
    }

    /// A copy of this cache's tokens for another sequence (a choice of an `n > 1` request,
    /// which starts from the prompt computed once), holding `reservation_bytes` moved out of
    /// this cache's reservation.
    pub(crate) fn fork(&mut self, reservation_bytes: u64) -> KvCache {
        let reservation = self
            ._reservation
            .as_mut()
            .map(|r| r.split_off(reservation_bytes));
        KvCache {
            layers: self.layers.clone(),
            len: self.len,
            max_tokens: self.max_tokens,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
            dtype: self.dtype,
            _reservation: reservation,
        }
    }

    /// Layers.
    pub(crate) fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens this cache may hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Bytes allocated now (never more than the reservation).
    pub fn allocated_bytes(&self) -> u64 {
        let values: usize = self
            .layers
            .iter()
            .flat_map(LayerRows::streams)
            .map(KvRows::capacity)
            .sum();
        (values * self.dtype.bytes()) as u64
    }

    /// Makes room in `layer` for `n` more tokens: doubling, within the reservation
    /// (amortised appends, bounded memory).
    fn grow(&mut self, layer: usize, n: usize) {
        let max = self.max_tokens * self.head_dim;
        let head_dim = self.head_dim;
        let len = self.len;
        let l = &mut self.layers[layer];
        for stream in l.keys.iter_mut().chain(&mut l.values) {
            debug_assert_eq!(stream.len(), len * head_dim);
            let needed = stream.len() + n * head_dim;
            assert!(needed <= max, "KV cache grown past its reservation");
            let capacity = stream.capacity();
            if needed > capacity {
                let target = (capacity * 2).max(needed).max(64 * head_dim).min(max);
                stream.reserve_total(target);
            }
        }
    }

    /// Appends `keys` and `values` (`n` rows of `n_kv_head * head_dim` each, as computed)
    /// of the tokens at positions `len..len + n` to `layer`, stored as this cache's type.
    /// Every layer gets the same tokens in one step, then [`advance`](Self::advance) moves
    /// `len`.
    pub(crate) fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        let width = self.n_kv_head * self.head_dim;
        self.grow(layer, keys.len() / width);
        let l = &mut self.layers[layer];
        for (k, v) in keys.chunks_exact(width).zip(values.chunks_exact(width)) {
            let heads = k
                .chunks_exact(self.head_dim)
                .zip(v.chunks_exact(self.head_dim));
            for ((k, v), (keys, values)) in heads.zip(l.keys.iter_mut().zip(&mut l.values)) {
                keys.push_f32(k);
                values.push_f32(v);
            }
        }
    }

    /// Appends stored tokens (copied from caches of the same type, one after another) to
    /// `layer`, as [`append`](Self::append) does.
    pub(crate) fn append_rows(&mut self, layer: usize, rows: &[&LayerRows]) {
        let values: usize = rows.iter().map(|r| r.keys[0].len()).sum();
        self.grow(layer, values / self.head_dim);
        let l = &mut self.layers[layer];
        for r in rows {
            let streams = l.keys.iter_mut().chain(&mut l.values);
            for (stream, copied) in streams.zip(r.keys.iter().chain(&r.values)) {
                stream.push_rows(copied);
            }
        }
    }

    /// A copy of the keys and values of tokens `tokens` in `layer`, as stored.
    pub(crate) fn rows(&self, layer: usize, tokens: std::ops::Range<usize>) -> LayerRows {
        let l = &self.layers[layer];
        let values = tokens.start * self.head_dim..tokens.end * self.head_dim;
        let copy = |streams: &[KvRows]| -> Vec<KvRows> {
            streams.iter().map(|s| s.slice(values.clone())).collect()
        };
        LayerRows {
            keys: copy(&l.keys),
            values: copy(&l.values),
        }
    }

    /// Marks `n` more tokens as cached, after every layer got them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// The keys and values of `layer` (after this step's append).
    pub(crate) fn layer(&self, layer: usize) -> KvLayer<'_> {
        KvLayer {
            rows: &self.layers[layer],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary16_cache_holds_the_rounded_values_per_head_in_half_the_bytes() {
        let (layers, heads, head_dim, tokens) = (2, 3, 8, 70);
        let width = heads * head_dim;
        let keys: Vec<f32> = (0..tokens * width)
            .map(|i| (i as f32 - 300.0) * 0.37 + [0.0, 1e-6, 7e4, -1e5][i % 4])
            .collect();
        let values: Vec<f32> = keys.iter().map(|k| -0.5 * k).collect();
        let mut caches = [KvDtype::F32, KvDtype::F16]
            .map(|dtype| KvCache::with_shape(layers, heads, head_dim, dtype, tokens, None));
        for cache in &mut caches {
            // A prefill chunk of one token, then the rest.
            for layer in 0..layers {
                cache.append(layer, &keys[..width], &values[..width]);
            }
            cache.advance(1);
            for layer in 0..layers {
                cache.append(layer, &keys[width..], &values[width..]);
            }
            cache.advance(tokens - 1);
        }
        let [full, half] = &caches;
        assert_eq!(full.allocated_bytes(), 2 * half.allocated_bytes());
        assert_eq!(
            full.allocated_bytes(),
            (layers * 2 * tokens * width * 4) as u64,
            "grown to the reservation, never past it"
        );
        // Nearest binary16, and past its range its largest finite value.
        let rounded = |x: f32| ::half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_f32();
        for h in 0..heads {
            // Head `h` of position `p` is values `p * width + h * head_dim..` of a row.
            let at = |p: usize, d: usize| p * width + h * head_dim + d;
            let KvHead::F16 { keys: k, values: v } = half.layer(1).head(h) else {
                panic!("a binary16 cache gives binary16 heads");
            };
            let KvHead::F32 {
                keys: fk,
                values: fv,
            } = full.layer(1).head(h)
            else {
                panic!("an f32 cache gives f32 heads");
            };
            for p in 0..tokens {
                for d in 0..head_dim {
                    let i = p * head_dim + d;
                    let (x, y) = (keys[at(p, d)], values[at(p, d)]);
                    assert_eq!((fk[i], fv[i]), (x, y), "head {h} position {p}");
                    let got = ::half::f16::from_bits(k[i]).to_f32();
                    assert_eq!(got, rounded(x), "{x}");
                    assert_eq!(::half::f16::from_bits(v[i]).to_f32(), rounded(y));
                }
            }
        }
    }

    #[test]
    fn copied_rows_append_as_the_tokens_they_hold() {
        let (heads, head_dim) = (2, 4);
        let row = |t: usize| -> Vec<f32> {
            (0..heads * head_dim)
                .map(|i| (t * 100 + i) as f32)
                .collect()
        };
        let mut source = KvCache::with_shape(1, heads, head_dim, KvDtype::F16, 10, None);
        let rows: Vec<f32> = (0..10).flat_map(row).collect();
        source.append(0, &rows, &rows);
        source.advance(10);
        // Tokens 4..6 then 6..10 copied into an empty cache are tokens 4..10 appended.
        let mut copy = KvCache::with_shape(1, heads, head_dim, KvDtype::F16, 6, None);
        copy.append_rows(0, &[&source.rows(0, 4..6), &source.rows(0, 6..10)]);
        copy.advance(6);
        let mut want = KvCache::with_shape(1, heads, head_dim, KvDtype::F16, 6, None);
        want.append(0, &rows[4 * 8..], &rows[4 * 8..]);
        want.advance(6);
        assert_eq!(copy.layer(0), want.layer(0));
        assert_ne!(copy.layer(0), source.layer(0));
    }
}
