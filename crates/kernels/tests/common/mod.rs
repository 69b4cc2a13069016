//! What the product tests of both weight formats share: deterministic values, the kernels
//! this CPU runs, an f64 reference written from the formats' definitions, and the check that
//! every kernel equals the scalar one bit for bit.
#![allow(dead_code, unreachable_pub)]

use modelmux_kernels::{BLOCK, ColumnsMut, Int4Matrix, Int8Matrix, Int8Rows, Isa, PANEL};

/// A weight matrix in either format, as the tests use it.
pub trait Weights: std::panic::RefUnwindSafe {
    /// Output rows.
    fn out_dim(&self) -> usize;
    /// Input columns.
    fn in_dim(&self) -> usize;
    /// Row `row` as the kernels multiply by it.
    fn dequantize_row(&self, row: usize, out: &mut [f32]);
    /// The product with kernel `isa`.
    fn matmul_with(&self, isa: Isa, x: &Int8Rows, out: ColumnsMut<'_>);
    /// Whether each block's weights are `d * q + m` (the kernels add `m * sum(a)` apart), not
    /// `d * q`.
    fn has_offsets(&self) -> bool;
}

macro_rules! weights {
    ($t:ty, $offsets:literal) => {
        impl Weights for $t {
            fn out_dim(&self) -> usize {
                <$t>::out_dim(self)
            }
            fn in_dim(&self) -> usize {
                <$t>::in_dim(self)
            }
            fn dequantize_row(&self, row: usize, out: &mut [f32]) {
                <$t>::dequantize_row(self, row, out)
            }
            fn matmul_with(&self, isa: Isa, x: &Int8Rows, out: ColumnsMut<'_>) {
                <$t>::matmul_with(self, isa, x, out)
            }
            fn has_offsets(&self) -> bool {
                $offsets
            }
        }
    };
}
weights!(Int8Matrix, false);
weights!(Int4Matrix, true);

/// Deterministic values in `-scale..scale`, with every 5th block 50x smaller, every 7th
/// zero and an outlier now and then, so blocks get very different scales.
pub fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let block = i / BLOCK;
            let v = if block % 7 == 3 {
                0.0
            } else if block % 5 == 1 {
                u * scale / 50.0
            } else {
                u * scale
            };
            if s.is_multiple_of(97) { v * 8.0 } else { v }
        })
        .collect()
}

pub fn product(isa: Isa, m: &dyn Weights, x: &Int8Rows) -> Vec<f32> {
    let n = m.out_dim();
    let mut y = vec![f32::NAN; x.rows() * n];
    m.matmul_with(isa, x, ColumnsMut::new(&mut y, n));
    y
}

/// The kernels this CPU runs. Those it cannot are named once per test binary, on standard
/// error and in the suite's list of parts not run (`MODELMUX_TEST_GAPS`, which `scripts/test`
/// repeats in its closing line): a CPU feature is not something the test command can install,
/// so the gap is reported, not failed.
pub fn available() -> Vec<Isa> {
    static REPORTED: std::sync::Once = std::sync::Once::new();
    let (runs, cannot): (Vec<Isa>, Vec<Isa>) = Isa::ALL.into_iter().partition(|i| i.is_available());
    if !cannot.is_empty() {
        REPORTED.call_once(|| {
            let line = format!(
                "kernels this CPU cannot run, not compared with the scalar one: {cannot:?}"
            );
            eprintln!("{line}");
            if let Ok(path) = std::env::var("MODELMUX_TEST_GAPS") {
                use std::io::Write as _;
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("the gaps file opens");
                file.write_all(format!("{line}\n").as_bytes())
                    .expect("the gaps file takes a line");
            }
        });
    }
    runs
}

/// Checks `y` against an f64 reference written from the format's definition, in two parts:
/// - the activations: each value of `rows` (`scale * q`, as stored) is within half a step
///   (`scale / 2`, plus the f32 rounding of `x / scale`: `1e-4` of a step covers `|q| <= 127`)
///   of the unquantized `x`, and the block's scale is `max|x| / 127`;
/// - the product: `y` equals `sum(w_deq * x_deq)` in f64 (both operands as stored) to the f32
///   arithmetic's error, a relative `1e-5` of `sum|w_deq * x_deq|` at most for these sizes
///   (k <= 2048: the integer dot products are exact, one rounding per block and per product
///   of scales). A single weight off by one quantization step is outside this bound. For
///   the 4-bit format, whose kernels add `d * q * a` and `m * a` apart, the magnitude counts
///   both.
pub fn check_against_reference(m: &dyn Weights, x: &[f32], rows: &Int8Rows, y: &[f32]) {
    let (n, k) = (m.out_dim(), m.in_dim());
    let mut x_deq = vec![0.0f64; rows.rows() * k];
    for r in 0..rows.rows() {
        let q = rows.quantized(r);
        for b in 0..k / BLOCK {
            let scale = rows.scale(r, b) as f64;
            let block = &x[r * k + b * BLOCK..][..BLOCK];
            let amax = block.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64));
            assert!(
                (scale - amax / 127.0).abs() <= amax / 127.0 * 1e-6,
                "row {r} block {b}: scale {scale}, max {amax}"
            );
            for c in 0..BLOCK {
                let i = b * BLOCK + c;
                let back = scale * q[i] as f64;
                assert!(
                    (back - x[r * k + i] as f64).abs() <= scale * (0.5 + 1e-4),
                    "row {r} value {i}: {back} vs {} (scale {scale}, q {})",
                    x[r * k + i],
                    q[i]
                );
                x_deq[r * k + i] = back;
            }
        }
    }
    let mut w = vec![0.0f32; k];
    for o in 0..n {
        m.dequantize_row(o, &mut w);
        for r in 0..rows.rows() {
            let xr = &x_deq[r * k..(r + 1) * k];
            let exact: f64 = w.iter().zip(xr).map(|(a, b)| *a as f64 * b).sum();
            let mut magnitude: f64 = w.iter().zip(xr).map(|(a, b)| (*a as f64 * b).abs()).sum();
            if m.has_offsets() {
                // `d * q * a` and `m * a` are added apart: each is at most `|w a| + |m a|`,
                // and `m` is the block's smallest weight (some `q` is 0 in every block).
                for (wb, xb) in w.chunks_exact(BLOCK).zip(xr.chunks_exact(BLOCK)) {
                    let min = wb.iter().fold(f64::INFINITY, |m, v| m.min(*v as f64));
                    magnitude += 2.0 * min.abs() * xb.iter().map(|v| v.abs()).sum::<f64>();
                }
            }
            let bound = 1e-5 * magnitude + 1e-30;
            let got = y[r * n + o] as f64;
            assert!(
                (got - exact).abs() <= bound,
                "row {r} column {o}: {got} vs {exact} (bound {bound})"
            );
        }
    }
}

/// The scalar kernel's product within the reference's bound, and every other kernel this CPU
/// has equal to it bit for bit.
pub fn every_kernel_agrees(m: &dyn Weights, x: &[f32], q: &Int8Rows, what: &str) {
    let want = product(Isa::Scalar, m, q);
    check_against_reference(m, x, q, &want);
    for isa in available() {
        assert_eq!(
            product(isa, m, q)
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{isa:?}, {what}"
        );
    }
}

/// The first kernel this CPU runs whose product, its columns computed in two parts split at
/// panel `split` (as threads split them), is not `want` bit for bit.
pub fn first_split_disagreement(
    m: &dyn Weights,
    q: &Int8Rows,
    want: &[f32],
    split: usize,
) -> Option<Isa> {
    let n = m.out_dim();
    available().into_iter().find(|&isa| {
        let mut y = vec![f32::NAN; q.rows() * n];
        let (left, right) = ColumnsMut::new(&mut y, n).split_at((split * PANEL).min(n));
        m.matmul_with(isa, q, left);
        m.matmul_with(isa, q, right);
        y.iter()
            .map(|v| v.to_bits())
            .ne(want.iter().map(|v| v.to_bits()))
    })
}
