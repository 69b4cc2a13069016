//! Single-thread throughput of each kernel on SmolLM2-135M's matrix shapes.
//!
//! ```sh
//! cargo run --release -p modelmux-kernels --example bench_matmul [FILTER]
//! ```
//!
//! FILTER keeps the lines containing it (`Avx512Vnni int4 3072x576`, `rows 8`). Each shape
//! runs in both weight formats: `int8` (34 bytes per 32 weights) and `int4` (20).

// A CPU loop timed by the wall clock; this crate has no async runtime to pause.
#![allow(clippy::disallowed_types)]

use std::time::Instant;

use modelmux_kernels::{ColumnsMut, Int4Matrix, Int8Matrix, Int8Rows, Isa};

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let shapes = [
        (960, 576),
        (576, 576),
        (3072, 576),
        (576, 1536),
        (49152, 576),
        // 108 MiB: larger than any L3 here, so the weights come from memory, as in a step.
        (196608, 576),
    ];
    for isa in Isa::ALL
        .into_iter()
        .filter(|i| i.is_available() && *i != Isa::Scalar)
    {
        for &(n, k) in &shapes {
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 31 % 199) as f32 - 99.0) / 1000.0)
                .collect();
            let int8 = Int8Matrix::quantize(&w, n, k);
            let int4 = Int4Matrix::quantize(&w, n, k);
            for (format, rows) in ["int8", "int4"]
                .into_iter()
                .flat_map(|f| [1, 8, 64, 256].map(|r| (f, r)))
            {
                if !format!("{isa:?} {format} {n}x{k} rows {rows}").contains(&filter) {
                    continue;
                }
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 17 % 101) as f32 - 50.0) / 10.0)
                    .collect();
                let mut q = Int8Rows::new();
                let mut y = vec![0.0; rows * n];
                // Many short samples, the best kept: on a shared machine, time slices lost to
                // other processes only ever make a sample slower.
                let reps = (1e8 / (2.0 * (n * k * rows) as f64)).clamp(1.0, 200.0) as usize;
                let mut best = f64::MAX;
                for _ in 0..30 {
                    let t = Instant::now();
                    for _ in 0..reps {
                        q.quantize(&x, k);
                        let out = ColumnsMut::new(&mut y, n);
                        match format {
                            "int8" => int8.matmul_with(isa, &q, out),
                            _ => int4.matmul_with(isa, &q, out),
                        }
                    }
                    best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                }
                let gflops = 2.0 * (n * k * rows) as f64 / best / 1e9;
                let bytes = match format {
                    "int8" => int8.size_bytes(),
                    _ => int4.size_bytes(),
                };
                let gbs = bytes as f64 / best / 1e9;
                println!(
                    "{isa:?} {format} {n}x{k} rows {rows}: {:.1} us, {gflops:.0} GFLOP/s, weights {gbs:.1} GB/s",
                    best * 1e6
                );
            }
        }
    }
}
