//! How keys and values are stored: the element type, and one stream of stored values.

use crate::weights::WeightFormat;

/// How a KV cache stores keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// f32, as computed: the reference arithmetic (with [`WeightFormat::F32`] weights).
    F32,
    /// IEEE binary16, rounded to nearest (llama.cpp's and vLLM's default): half the memory,
    /// so twice the tokens in a KV budget, and half the bytes each decode step reads. Its
    /// rounding (relative 2^-11) is far below that of quantized weights.
    #[default]
    F16,
}

impl KvDtype {
    /// The type for weights held as `format`: f32 with f32 weights (whose results are the
    /// reference's), binary16 with quantized ones.
    pub fn for_weights(format: WeightFormat) -> Self {
        if format == WeightFormat::F32 {
            KvDtype::F32
        } else {
            KvDtype::F16
        }
    }

    /// Bytes one stored value takes.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// Values (one key/value head's keys, say) as a cache stores them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum KvRows {
    F32(Vec<f32>),
    /// IEEE binary16 bits.
    F16(Vec<u16>),
}

impl KvRows {
    pub(super) fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => KvRows::F32(Vec::new()),
            KvDtype::F16 => KvRows::F16(Vec::new()),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
        }
    }

    pub(super) fn capacity(&self) -> usize {
        match self {
            KvRows::F32(v) => v.capacity(),
            KvRows::F16(v) => v.capacity(),
        }
    }

    /// Makes room for `total` values in all (never more, however `Vec` would grow).
    pub(super) fn reserve_total(&mut self, total: usize) {
        match self {
            KvRows::F32(v) => v.reserve_exact(total - v.len()),
            KvRows::F16(v) => v.reserve_exact(total - v.len()),
        }
    }

    /// Appends values computed in f32, converted to this storage.
    pub(super) fn push_f32(&mut self, x: &[f32]) {
        match self {
            KvRows::F32(v) => v.extend_from_slice(x),
            KvRows::F16(v) => {
                let at = v.len();
                v.resize(at + x.len(), 0);
                modelmux_kernels::vector::f16_bits(x, &mut v[at..]);
            }
        }
    }

    /// Appends stored values of the same type.
    ///
    /// # Panics
    /// When `x` is of the other type (caches of one engine all store one type).
    pub(super) fn push_rows(&mut self, x: &KvRows) {
        match (self, x) {
            (KvRows::F32(v), KvRows::F32(x)) => v.extend_from_slice(x),
            (KvRows::F16(v), KvRows::F16(x)) => v.extend_from_slice(x),
            _ => panic!("KV rows of another type"),
        }
    }

    /// A copy of `range`.
    pub(super) fn slice(&self, range: std::ops::Range<usize>) -> KvRows {
        match self {
            KvRows::F32(v) => KvRows::F32(v[range].to_vec()),
            KvRows::F16(v) => KvRows::F16(v[range].to_vec()),
        }
    }
}
