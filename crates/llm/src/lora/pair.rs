//! One adapted projection. By default stored compactly ([`AdapterPrecision::Half`]): `A` and
//! `B^T * scale` in IEEE binary16 (half the bytes of f32), each matrix divided by one f32
//! factor first so its largest value is 2^14 and its values use the top of binary16's range.
//! Eight sequences on eight adapters read every adapter's matrices once per step (5 MB per
//! rank-8 adapter on SmolLM2's q, v, o and down in f32), next to the base model's 136 MB: the
//! bytes are what adapters cost. With f32 weights (the reference arithmetic) they stay f32
//! ([`AdapterPrecision::Exact`]).
//!
//! With [`AdapterPrecision::Int8`] (`lora_config.adapter_dtype: int8`) each row of `A` and of
//! `B^T` is int8 with its own scale: a quarter of f32's bytes.
//!
//! The precision against f32: binary16 keeps 11 significant bits (a relative error of at most
//! 2^-12 per value); values below the largest one over 2^28 become zero (binary16 has no
//! smaller normal numbers, and the loops read no subnormals). int8 rounds each value to the
//! nearest of 255 steps of its row's largest magnitude (an error of at most half a step).
//! `crates/llm/tests/llm/reference.rs` measures the logits with every test adapter against the
//! numpy reference in f32, for both.

use std::ops::Range;

use modelmux_kernels::vector;

use crate::parallel;

/// The largest value of a matrix once divided by its factor.
const TOP: f32 = 16384.0;

/// How an adapter's matrices are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdapterPrecision {
    /// IEEE binary16, each matrix scaled to the top of its range: half the bytes (the
    /// default).
    #[default]
    Half,
    /// int8, each row of `A` and of `B^T` with its own f32 scale (its largest value over
    /// 127): a quarter of f32's bytes, less precise than binary16 (see `reference.rs`).
    Int8,
    /// f32, as read: the reference arithmetic (with `WeightFormat::F32`).
    Exact,
}

impl AdapterPrecision {
    /// The precision that goes with base weights in `format`: exact with f32 weights, half
    /// otherwise.
    pub fn for_weights(format: crate::WeightFormat) -> Self {
        if format == crate::WeightFormat::F32 {
            Self::Exact
        } else {
            Self::Half
        }
    }
}

/// One adapted projection: `y += (x A^T) B^T * scale`, with `scale` folded into `B^T`.
pub(crate) struct LoraPair {
    rank: usize,
    stored: Stored,
}

enum Stored {
    /// `a`: `rank x in`; `bt`: `rank x out`, `B^T * scale`, q/k rows in GGUF order.
    Exact { a: Vec<f32>, bt: Vec<f32> },
    /// The same in binary16, divided by factors whose product is `factor` (what `x A^T` read
    /// from the stored values is multiplied by).
    Half {
        a: Vec<u16>,
        bt: Vec<u16>,
        factor: f32,
    },
    /// The same as int8 rows, each with its scale.
    Int8 { a: Rows8, bt: Rows8 },
}

/// Rows of int8 values and each row's scale: row `j`'s values are `values[j * len..]` times
/// `scales[j]`.
struct Rows8 {
    values: Vec<i8>,
    scales: Vec<f32>,
}

impl Rows8 {
    /// `rows` (of `len` values each, finite) rounded to the nearest of 255 steps of their
    /// row's largest magnitude.
    fn quantize(rows: &[f32], len: usize) -> Self {
        let mut values = Vec::with_capacity(rows.len());
        let mut scales = Vec::with_capacity(rows.len() / len.max(1));
        for row in rows.chunks(len.max(1)) {
            let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = max / 127.0;
            let inverse = if max == 0.0 { 0.0 } else { 127.0 / max };
            values.extend(
                row.iter()
                    .map(|v| (v * inverse).round().clamp(-127.0, 127.0) as i8),
            );
            scales.push(scale);
        }
        Self { values, scales }
    }
}

impl LoraPair {
    /// The pair of `a` (`rank x in`) and `bt` (`rank x out`, scaled), stored in `precision`.
    /// Refuses non-finite values, naming the matrix.
    pub(crate) fn new(
        rank: usize,
        a: Vec<f32>,
        bt: Vec<f32>,
        precision: AdapterPrecision,
    ) -> Result<Self, String> {
        if let Some(name) = [("lora_A", &a), ("lora_B", &bt)]
            .iter()
            .find_map(|(name, m)| m.iter().any(|v| !v.is_finite()).then_some(*name))
        {
            return Err(format!("{name} holds a value that is not finite"));
        }
        let stored = match precision {
            AdapterPrecision::Exact => Stored::Exact { a, bt },
            AdapterPrecision::Half => {
                let (a, a_factor) = compact(&a);
                let (bt, b_factor) = compact(&bt);
                Stored::Half {
                    a,
                    bt,
                    factor: a_factor * b_factor,
                }
            }
            AdapterPrecision::Int8 => {
                let in_dim = a.len() / rank.max(1);
                let out_dim = bt.len() / rank.max(1);
                Stored::Int8 {
                    a: Rows8::quantize(&a, in_dim),
                    bt: Rows8::quantize(&bt, out_dim),
                }
            }
        };
        Ok(Self { rank, stored })
    }

    /// Bytes its matrices occupy.
    pub(crate) fn size_bytes(&self) -> u64 {
        match &self.stored {
            Stored::Exact { a, bt } => 4 * (a.len() + bt.len()) as u64,
            Stored::Half { a, bt, .. } => 2 * (a.len() + bt.len()) as u64,
            Stored::Int8 { a, bt } => {
                (a.values.len() + bt.values.len() + 4 * (a.scales.len() + bt.scales.len())) as u64
            }
        }
    }

    /// Where its two matrices are: (address, bytes) of `A` and of `B^T`, as stored.
    fn regions(&self) -> [(usize, usize); 2] {
        fn region<T>(values: &[T]) -> (usize, usize) {
            (values.as_ptr() as usize, std::mem::size_of_val(values))
        }
        match &self.stored {
            Stored::Exact { a, bt } => [region(a), region(bt)],
            Stored::Half { a, bt, .. } => [region(a), region(bt)],
            Stored::Int8 { a, bt } => [region(&a.values), region(&bt.values)],
        }
    }

    /// Starts reading its matrices into the cache (a hint; see [`vector::prefetch`]).
    pub(crate) fn prefetch(&self) {
        for (start, bytes) in self.regions() {
            vector::prefetch_range(start, bytes);
        }
    }

    /// Adds its matrices to `list`, to be asked for later.
    pub(crate) fn prefetch_later(&self, list: &mut vector::Prefetches) {
        for (start, bytes) in self.regions() {
            list.push_range(start, bytes);
        }
    }

    /// Adds this projection's delta for the rows of `x` (`rows x in_dim`) to `columns` of
    /// `y` (rows of `y_width` values: the projection's output may be stacked with others').
    pub(crate) fn apply(
        &self,
        x: &[f32],
        in_dim: usize,
        y: &mut [f32],
        y_width: usize,
        columns: Range<usize>,
    ) {
        let out_dim = columns.len();
        let one_row = |(x, y): (&[f32], &mut [f32])| {
            let y = &mut y[columns.clone()];
            let mut u = [0.0f32; 64];
            let mut big = Vec::new();
            let u: &mut [f32] = if self.rank <= 64 {
                &mut u[..self.rank]
            } else {
                big.resize(self.rank, 0.0);
                &mut big
            };
            match &self.stored {
                Stored::Exact { a, bt } => {
                    vector::dots(x, a, in_dim, u);
                    vector::axpys(y, u, bt, out_dim);
                }
                Stored::Half { a, bt, factor } => {
                    vector::dots_f16(x, a, in_dim, u);
                    u.iter_mut().for_each(|u| *u *= factor);
                    vector::axpys_f16(y, u, bt, out_dim);
                }
                Stored::Int8 { a, bt } => {
                    vector::dots_i8(x, &a.values, in_dim, u);
                    // Row j of `A`'s scale, then row j of `B^T`'s: the coefficient of row j.
                    for ((u, sa), sb) in u.iter_mut().zip(&a.scales).zip(&bt.scales) {
                        *u *= sa * sb;
                    }
                    vector::axpys_i8(y, u, &bt.values, out_dim);
                }
            }
        };
        let rows = x.len() / in_dim;
        let chunk_rows = if rows * self.rank * (in_dim + out_dim) < 1 << 20 {
            rows
        } else {
            rows.div_ceil(4 * parallel::threads())
        };
        parallel::for_each_chunk(y, chunk_rows * y_width, |chunk, y| {
            let x = &x[chunk * chunk_rows * in_dim..];
            x.chunks_exact(in_dim)
                .zip(y.chunks_exact_mut(y_width))
                .for_each(&one_row);
        });
    }
}

/// `values / factor` in binary16 (bits), and `factor` (the values are finite).
fn compact(values: &[f32]) -> (Vec<u16>, f32) {
    let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if max == 0.0 {
        return (vec![0; values.len()], 0.0);
    }
    let factor = max / TOP;
    let mut bits = vec![0u16; values.len()];
    // Scaled a block at a time, converted with the CPU's binary16 instructions (a call of
    // `f16::from_f32` per value was most of an adapter's parse).
    let mut scaled = [0.0f32; 256];
    for (v, h) in values.chunks(256).zip(bits.chunks_mut(256)) {
        let scaled = &mut scaled[..v.len()];
        for (s, v) in scaled.iter_mut().zip(v) {
            *s = v / factor;
        }
        modelmux_kernels::vector::f16_bits(scaled, h);
    }
    for h in &mut bits {
        if is_subnormal(*h) {
            *h = 0;
        }
    }
    (bits, factor)
}

/// Whether binary16 bits `h` are a subnormal number (exponent 0, mantissa not).
fn is_subnormal(h: u16) -> bool {
    h & 0x7c00 == 0 && h & 0x03ff != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each int8 value reads back within half a step (its row's largest magnitude over 254)
    /// of the original; a row of zeros stays zeros, and each row's largest value is exact.
    #[test]
    fn int8_rows_read_back_within_half_a_step() {
        let len = 37;
        let values: Vec<f32> = (0..4 * len)
            .map(|i| ((i * 7919 % 4001) as f32 - 2000.0) * 1e-5 * (1.0 + (i / len) as f32))
            .chain(std::iter::repeat_n(0.0, len))
            .collect();
        let rows = Rows8::quantize(&values, len);
        assert_eq!(rows.scales.len(), 5);
        for (j, row) in values.chunks(len).enumerate() {
            let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = rows.scales[j];
            for (i, v) in row.iter().enumerate() {
                let back = f32::from(rows.values[j * len + i]) * scale;
                assert!(
                    (back - v).abs() <= max / 254.0 * 1.0001,
                    "{v} read back as {back}"
                );
                if v.abs() == max {
                    assert!(
                        (back - v).abs() <= max * 1e-6,
                        "the largest, {v}, as {back}"
                    );
                }
            }
        }
        assert!(rows.values[4 * len..].iter().all(|v| *v == 0));
    }

    /// Stored and read back, every value is within binary16's rounding of the original
    /// (relative 2^-11 of the value, or below the largest one over 2^27 for those flushed).
    #[test]
    fn compact_values_read_back_within_binary16_rounding() {
        let values: Vec<f32> = (0..4096)
            .map(|i| ((i * 7919 % 4001) as f32 - 2000.0) * 1e-6 * (1.0 + (i % 13) as f32))
            .chain([1e-12, -3e-13, 0.0, 0.031])
            .collect();
        let (bits, factor) = compact(&values);
        let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (v, h) in values.iter().zip(&bits) {
            let back = half::f16::from_bits(*h).to_f32() * factor;
            let bound = (v.abs() * 2f32.powi(-11)).max(max * 2f32.powi(-27));
            assert!((back - v).abs() <= bound, "{v} read back as {back}");
            assert!(!is_subnormal(*h), "{v} stored as a subnormal");
        }
        assert_eq!(compact(&[0.0, 0.0]), (vec![0, 0], 0.0));
        for precision in [
            AdapterPrecision::Half,
            AdapterPrecision::Int8,
            AdapterPrecision::Exact,
        ] {
            let err = LoraPair::new(1, vec![1.0, f32::NAN], vec![1.0], precision).err();
            assert_eq!(
                err.as_deref(),
                Some("lora_A holds a value that is not finite")
            );
            let err = LoraPair::new(1, vec![1.0], vec![f32::INFINITY], precision).err();
            assert_eq!(
                err.as_deref(),
                Some("lora_B holds a value that is not finite")
            );
        }
    }
}
