//! The 4-bit product against the f64 reference, every SIMD kernel against the scalar one bit
//! for bit, and the format against GGUF's Q4_1 definition.

mod common;

use common::{
    check_against_reference, every_kernel_agrees, first_split_disagreement, product, values,
};
use modelmux_kernels::{BLOCK, Int4Matrix, Int8Rows};
use proptest::prelude::*;

#[test]
fn weights_come_back_within_half_a_step_of_q4_1() {
    let (n, k) = (19, 96);
    let w = values(n * k, 1, 0.1);
    let m = Int4Matrix::quantize(&w, n, k);
    let mut row = vec![0.0; k];
    for o in 0..n {
        m.dequantize_row(o, &mut row);
        for b in 0..k / BLOCK {
            let block = &w[o * k + b * BLOCK..][..BLOCK];
            let min = block.iter().copied().fold(f32::INFINITY, f32::min);
            let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let step = (max - min) / 15.0;
            // The scale and offset are f16: their rounding moves a value by up to
            // 15 * 2^-11 of the step plus 2^-11 of the offset.
            let slack = step * (0.5 + 16.0 / 2048.0) + min.abs() / 2048.0;
            for (c, v) in block.iter().enumerate() {
                let back = row[b * BLOCK + c];
                assert!((back - v).abs() <= slack, "{o} {b} {c}: {back} vs {v}");
            }
        }
    }
    // 20 bytes per 32 weights, 2 panels.
    assert_eq!(m.size_bytes(), 2 * 16 * (k / BLOCK) * 20);
}

#[test]
fn blocks_set_by_hand_read_back_as_d_q_plus_m() {
    let (n, k) = (20, 64);
    let mut m = Int4Matrix::zeros(n, k);
    let q: [u8; BLOCK] = std::array::from_fn(|i| (i * 7 % 16) as u8);
    m.set_block(17, 1, 0.5, -3.0, &q);
    let mut row = vec![f32::NAN; k];
    m.dequantize_row(17, &mut row);
    assert!(row[..BLOCK].iter().all(|&v| v == 0.0));
    for (c, v) in row[BLOCK..].iter().enumerate() {
        assert_eq!(*v, 0.5 * q[c] as f32 - 3.0, "weight {c}");
    }
    m.dequantize_row(16, &mut row);
    assert!(
        row.iter().all(|&v| v == 0.0),
        "a neighbouring row is untouched"
    );
    let too_big = std::panic::catch_unwind(move || {
        let mut m = Int4Matrix::zeros(1, BLOCK);
        m.set_block(0, 0, 1.0, 0.0, &[16; BLOCK]);
    });
    assert!(too_big.is_err(), "a 5-bit value is refused");
}

#[test]
fn a_product_of_256_rows_matches_the_reference_and_the_scalar_kernel() {
    let (n, k, rows) = (40, 288, 256);
    let m = Int4Matrix::quantize(&values(n * k, 2, 0.05), n, k);
    let x = values(rows * k, 3, 4.0);
    let mut q = Int8Rows::new();
    q.quantize(&x, k);
    every_kernel_agrees(&m, &x, &q, "256 rows");
}

/// Every nibble 15 against activations of `±127` in every block: the AVX2 kernel adds a
/// block's 8 pair sums in 16 bits, exact only if the largest (30,480) does not wrap. Rows 1
/// to 8 cover every tile size.
#[test]
fn products_at_the_edge_of_the_ranges_are_exact_in_every_kernel() {
    let (n, k) = (32, 4 * BLOCK);
    let mut m = Int4Matrix::zeros(n, k);
    for row in 0..n {
        for block in 0..k / BLOCK {
            let d = if (row + block) % 2 == 0 { 1.0 } else { -1.0 };
            m.set_block(row, block, d, 0.25 * row as f32, &[15; BLOCK]);
        }
    }
    for rows in 1..=8 {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if (i / BLOCK + i / k).is_multiple_of(3) {
                    -2.0
                } else {
                    2.0
                }
            })
            .collect();
        let mut q = Int8Rows::new();
        q.quantize(&x, k);
        assert!(q.quantized(0).iter().all(|v| v.abs() == 127));
        every_kernel_agrees(&m, &x, &q, &format!("{rows} rows"));
    }
}

#[test]
fn a_wrong_nibble_fails_the_reference_check() {
    let (n, k) = (16, 64);
    let x = values(k, 5, 1.0);
    let mut m = Int4Matrix::quantize(&values(n * k, 4, 0.05), n, k);
    let mut q = Int8Rows::new();
    q.quantize(&x, k);
    let y = product(modelmux_kernels::Isa::Scalar, &m, &q);
    check_against_reference(&m, &x, &q, &y);
    // Weight 5 of row 3 one step up, the block's scale and offset kept.
    let mut row = vec![0.0; k];
    m.dequantize_row(3, &mut row);
    let block = &row[..BLOCK];
    let min = block.iter().copied().fold(f32::INFINITY, f32::min);
    let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let mut nibbles: [u8; BLOCK] = std::array::from_fn(|c| ((block[c] - min) / d).round() as u8);
    let j = (0..BLOCK)
        .filter(|&c| nibbles[c] < 15)
        .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
        .expect("a nibble below 15");
    nibbles[j] += 1;
    m.set_block(3, 0, d, min, &nibbles);
    let result = std::panic::catch_unwind(|| check_against_reference(&m, &x, &q, &y));
    assert!(result.is_err(), "one step on weight {j} went unnoticed");
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
        let m = Int4Matrix::quantize(&values(n * k, seed, 0.08), n, k);
        let x = values(rows * k, seed ^ 0xA5A5, 3.0);
        let mut q = Int8Rows::new();
        q.quantize(&x, k);
        let want = product(modelmux_kernels::Isa::Scalar, &m, &q);
        check_against_reference(&m, &x, &q, &want);
        prop_assert_eq!(first_split_disagreement(&m, &q, &want, split), None);
    }
}
