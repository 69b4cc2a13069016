//! The shapes the matrix kernels share: a panel of packed weights and a tile of quantized
//! activation rows. The product's loop (`matrix`) hands them to a kernel (`scalar`, `x86`);
//! kept apart from both so neither kernel imports the loop that calls it.

use crate::{BLOCK, PANEL};

/// Checks that rows of `k` values are whole blocks, as both weight formats need.
///
/// # Panics
/// When `k` is not a positive multiple of [`BLOCK`].
pub(crate) fn check_row_length(k: usize) {
    assert!(
        k > 0 && k.is_multiple_of(BLOCK),
        "k = {k} is not a positive multiple of {BLOCK}"
    );
}

/// 4-byte groups per block.
pub(crate) const GROUPS: usize = BLOCK / 4;

/// 64 bytes: weights `4g..4g+4` of one block of each of a panel's 16 rows, stored as
/// `q ^ 0x80` (that is `q + 128` as `u8`, what VNNI's unsigned operand wants). Aligned so
/// every vector load is one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 4 * PANEL]);

/// One panel's weights over all blocks: `lines[b * GROUPS + g]`, `scales[b * PANEL + lane]`
/// (f16 bits).
#[derive(Clone, Copy)]
pub(crate) struct Panel<'a> {
    pub(crate) lines: &'a [Line],
    pub(crate) scales: &'a [u16],
}

/// `R` consecutive rows of quantized activations: `q` is `R x k`, `scales` and `bias` are
/// `R x blocks`; `wide` is `q` sign-extended to `i16` (`R x k`) for the AVX2 kernel, empty
/// for the others.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) wide: &'a [i16],
    pub(crate) scales: &'a [f32],
    pub(crate) bias: &'a [i32],
}
