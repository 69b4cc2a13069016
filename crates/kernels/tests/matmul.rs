//! The int8 product against an independent f64 reference, and every SIMD kernel against the
//! scalar one, bit for bit, over random shapes.

use modelmux_kernels::{BLOCK, ColumnChunks, ColumnsMut, Int8Matrix, Int8Rows, Isa, PANEL};
use proptest::prelude::*;

/// Deterministic values in `-scale..scale`, with every 5th block 50x smaller, every 7th
/// zero and an outlier now and then, so blocks get very different scales.
fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
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

fn product(isa: Isa, m: &Int8Matrix, x: &Int8Rows) -> Vec<f32> {
    let n = m.out_dim();
    let mut y = vec![f32::NAN; x.rows() * n];
    m.matmul_with(isa, x, ColumnsMut::new(&mut y, n));
    y
}

fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

/// Checks `y` against `sum(w_deq * x)` in f64 (the weights as stored, the activations
/// unquantized). Quantizing a block of activations moves each value by at most half a step
/// (`d_a / 2`), so the block's error is at most `d_a / 2 * sum|w_deq|`; the f32 arithmetic
/// adds a relative `1e-5` of `sum|w_deq * x|` at most for these sizes (k <= 2048: one
/// rounding per block and per product of scales).
fn check_against_reference(m: &Int8Matrix, x: &[f32], rows: &Int8Rows, y: &[f32]) {
    let (n, k) = (m.out_dim(), m.in_dim());
    let mut w = vec![0.0f32; k];
    for o in 0..n {
        m.dequantize_row(o, &mut w);
        for r in 0..rows.rows() {
            let xr = &x[r * k..(r + 1) * k];
            let exact: f64 = w.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let magnitude: f64 = w
                .iter()
                .zip(xr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let quantization: f64 = (0..k / BLOCK)
                .map(|b| {
                    let abs_w: f64 = w[b * BLOCK..(b + 1) * BLOCK]
                        .iter()
                        .map(|v| v.abs() as f64)
                        .sum();
                    rows.scale(r, b) as f64 / 2.0 * abs_w
                })
                .sum();
            let bound = quantization * (1.0 + 1e-4) + 1e-5 * magnitude + 1e-30;
            let got = y[r * n + o] as f64;
            assert!(
                (got - exact).abs() <= bound,
                "row {r} column {o}: {got} vs {exact} (bound {bound})"
            );
        }
    }
}

#[test]
fn weights_come_back_within_half_a_step() {
    let (n, k) = (19, 96);
    let w = values(n * k, 1, 0.1);
    let m = Int8Matrix::quantize(&w, n, k);
    let mut row = vec![0.0; k];
    for o in 0..n {
        m.dequantize_row(o, &mut row);
        for b in 0..k / BLOCK {
            let block = &w[o * k + b * BLOCK..][..BLOCK];
            let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let step = half::f16::from_f32(amax / 127.0).to_f32();
            for (c, v) in block.iter().enumerate() {
                let back = row[b * BLOCK + c];
                assert!(
                    (back - v).abs() <= step * 0.5001,
                    "{o} {b} {c}: {back} vs {v}"
                );
            }
        }
    }
    assert_eq!(m.size_bytes(), 2 * 16 * (k / BLOCK) * 34);
}

#[test]
fn a_product_of_256_rows_matches_the_reference_and_the_scalar_kernel() {
    let (n, k, rows) = (40, 288, 256);
    let w = values(n * k, 2, 0.05);
    let x = values(rows * k, 3, 4.0);
    let m = Int8Matrix::quantize(&w, n, k);
    let mut q = Int8Rows::new();
    q.quantize(&x, k);
    let want = product(Isa::Scalar, &m, &q);
    check_against_reference(&m, &x, &q, &want);
    for isa in available() {
        assert_eq!(
            product(isa, &m, &q)
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{isa:?}"
        );
    }
}

#[test]
fn a_wrong_weight_fails_the_reference_check() {
    // The reference check must be able to fail: one weight changed by 3 steps after
    // quantizing is outside the bound.
    let (n, k) = (16, 64);
    let w = values(n * k, 4, 0.05);
    let x = values(k, 5, 1.0);
    let mut m = Int8Matrix::quantize(&w, n, k);
    let mut q = Int8Rows::new();
    q.quantize(&x, k);
    let mut row = vec![0.0; k];
    m.dequantize_row(3, &mut row);
    let y = product(Isa::Scalar, &m, &q);
    row[0] += 0.05 / 127.0 * 3.0 * x[0].signum() * 20.0;
    m.set_rows(3, &row);
    let result = std::panic::catch_unwind(|| check_against_reference(&m, &x, &q, &y));
    assert!(result.is_err());
}

#[test]
fn threads_sharing_column_chunks_write_every_column() {
    let (n, k, rows) = (200, 64, 3);
    let m = Int8Matrix::quantize(&values(n * k, 6, 1.0), n, k);
    let mut q = Int8Rows::new();
    q.quantize(&values(rows * k, 7, 1.0), k);
    let want = product(Isa::Scalar, &m, &q);
    let mut y = vec![f32::NAN; rows * n];
    {
        let chunks = ColumnChunks::new(ColumnsMut::new(&mut y, n), 2 * PANEL);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while let Some(c) = chunks.next() {
                        m.matmul(&q, c);
                    }
                });
            }
        });
    }
    assert_eq!(y, want);
}

proptest! {
    // 64 cases by default; `PROPTEST_CASES` (1000 in `scripts/test`) raises it.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn every_kernel_equals_the_scalar_one_and_the_reference(
        n in 1usize..70,
        blocks in 1usize..20,
        rows in 1usize..18,
        seed in any::<u64>(),
        split in 0usize..5,
    ) {
        let k = blocks * BLOCK;
        let w = values(n * k, seed, 0.08);
        let x = values(rows * k, seed ^ 0xA5A5, 3.0);
        let m = Int8Matrix::quantize(&w, n, k);
        let mut q = Int8Rows::new();
        q.quantize(&x, k);
        let want = product(Isa::Scalar, &m, &q);
        check_against_reference(&m, &x, &q, &want);
        for isa in available() {
            // The columns in two parts split at a panel boundary, as threads split them.
            let at = (split * PANEL).min(n);
            let mut y = vec![f32::NAN; rows * n];
            let (left, right) = ColumnsMut::new(&mut y, n).split_at(at);
            m.matmul_with(isa, &q, left);
            m.matmul_with(isa, &q, right);
            prop_assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{:?}", isa
            );
        }
    }
}
