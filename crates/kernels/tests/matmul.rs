//! The int8 product against an independent f64 reference, and every SIMD kernel against the
//! scalar one, bit for bit, over random shapes.

mod common;

use common::{
    available, check_against_reference, every_kernel_agrees, first_split_disagreement, product,
    values,
};
use modelmux_kernels::{BLOCK, ColumnChunks, ColumnsMut, Int8Matrix, Int8Rows, Isa, PANEL};
use proptest::prelude::*;

#[test]
fn every_kernel_this_cpu_has_is_tested() {
    // What the CPU reports, read independently of the crate's own detection.
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flag = |name: &str| cpu.split_whitespace().any(|f| f == name);
    let runs = available();
    assert!(runs.contains(&Isa::Scalar));
    if cfg!(target_arch = "x86_64") && !cpu.is_empty() {
        assert_eq!(
            runs.contains(&Isa::Avx2),
            flag("avx2") && flag("fma") && flag("f16c"),
            "AVX2 kernel"
        );
        assert_eq!(
            runs.contains(&Isa::Avx512Vnni),
            flag("avx512f") && flag("avx512bw") && flag("avx512_vnni"),
            "AVX-512 VNNI kernel"
        );
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
    every_kernel_agrees(&m, &x, &q, "256 rows");
}

/// Every weight and activation at the edge of the int8 range (`±127` in every block, in
/// every sign pattern the rows give): the AVX2 kernels' 16-bit pair sums are exact only if
/// no intermediate saturates or wraps, so the largest products must come out as the scalar
/// kernel's. Rows 1 to 8 cover every tile size of both AVX2 kernels.
#[test]
fn products_at_the_edge_of_the_int8_range_are_exact_in_every_kernel() {
    let (n, k) = (32, 4 * BLOCK);
    let w: Vec<f32> = (0..n * k)
        .map(|i| if (i / 3 + i / k) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let m = Int8Matrix::quantize(&w, n, k);
    for rows in 1..=8 {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| if (i / 5 + i / k) % 3 == 0 { -2.0 } else { 2.0 })
            .collect();
        let mut q = Int8Rows::new();
        q.quantize(&x, k);
        assert!(q.quantized(0).iter().all(|v| v.abs() == 127));
        every_kernel_agrees(&m, &x, &q, &format!("{rows} rows"));
    }
}

#[test]
fn a_wrong_weight_fails_the_reference_check() {
    // The reference check must be able to fail: one weight changed by a single quantization
    // step after the product was taken is outside the bound. The weight is taken where the
    // activation is largest, and is not its block's largest (so the block's scale, and every
    // other weight, stay as they were).
    let (n, k) = (16, 64);
    let w = values(n * k, 4, 0.05);
    let x = values(k, 5, 1.0);
    let mut m = Int8Matrix::quantize(&w, n, k);
    let mut q = Int8Rows::new();
    q.quantize(&x, k);
    let y = product(Isa::Scalar, &m, &q);
    check_against_reference(&m, &x, &q, &y);
    let mut row = vec![0.0; k];
    m.dequantize_row(3, &mut row);
    let j = (0..k)
        .filter(|&j| {
            let block = &row[j / BLOCK * BLOCK..][..BLOCK];
            block.iter().any(|v| v.abs() > row[j].abs() * 1.5)
        })
        .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
        .expect("a weight below its block's largest");
    let block = &row[j / BLOCK * BLOCK..][..BLOCK];
    let step =
        half::f16::from_f32(block.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0).to_f32();
    row[j] += step;
    m.set_rows(3, &row);
    let mut changed = vec![0.0; k];
    m.dequantize_row(3, &mut changed);
    assert_eq!(
        changed.iter().zip(&row).filter(|(a, b)| a != b).count(),
        0,
        "the changed row is stored as written"
    );
    let result = std::panic::catch_unwind(|| check_against_reference(&m, &x, &q, &y));
    assert!(result.is_err(), "one step on weight {j} went unnoticed");
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
        prop_assert_eq!(first_split_disagreement(&m, &q, &want, split), None);
    }
}
