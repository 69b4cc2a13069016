//! Single-thread time of `vector::attend` (f32 keys and values) and `vector::attend_f16`
//! (binary16) over SmolLM2-135M's attention shape (3 key/value heads of 64 values, 3 query
//! heads each): 8 sequences x `--positions` positions x 30 layers, the work of one 8-stream
//! decode step, with the keys and values in cache (one buffer reused) and from memory (a
//! buffer per sequence and layer, 37 MB in f32 at 100 positions). Each head's positions lie
//! one after another, as the engine's KV cache stores them. The loops run at the widest the
//! CPU has; `MODELMUX_KERNEL=avx2` holds them to AVX2, to compare.
//!
//! ```sh
//! cargo run --release -p modelmux-kernels --example bench_attend [POSITIONS]
//! ```

// A CPU loop timed by the wall clock; this crate has no async runtime to pause.
#![allow(clippy::disallowed_types)]

use std::time::Instant;

use modelmux_kernels::vector::{attend, attend_f16, f16_bits};

/// Keys or values of one sequence and layer, as a cache of either type stores them.
enum Stored {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

fn main() {
    let positions: usize = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(100);
    let (kv_heads, head_dim, group, calls) = (3, 64, 3, 8 * 30);
    // As the engine's KV cache lays them out: each key/value head's positions one after
    // another (`kv/rows.rs`), the heads apart.
    let stride = head_dim;
    let buffer = |seed: usize, half: bool| -> Stored {
        let x: Vec<f32> = (0..positions * kv_heads * head_dim)
            .map(|i| (((i + seed) * 7919 % 211) as f32 - 105.0) / 60.0)
            .collect();
        if half {
            let mut bits = vec![0u16; x.len()];
            f16_bits(&x, &mut bits);
            Stored::F16(bits)
        } else {
            Stored::F32(x)
        }
    };
    let q: Vec<f32> = (0..group * head_dim)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 50.0)
        .collect();
    for (dtype, half) in [("f32", false), ("f16", true)] {
        for (name, buffers) in [("in cache", 1), ("from memory", calls)] {
            let keys: Vec<Stored> = (0..buffers).map(|b| buffer(b, half)).collect();
            let values: Vec<Stored> = (0..buffers).map(|b| buffer(b + calls, half)).collect();
            let (mut out, mut scores) = (vec![0.0; group * head_dim], Vec::new());
            // Many samples, the best kept: other work on a shared machine only slows a sample.
            let mut best = f64::MAX;
            for _ in 0..30 {
                let t = Instant::now();
                for call in 0..calls {
                    for h in 0..kv_heads {
                        let span = h * positions * head_dim..(h + 1) * positions * head_dim;
                        match (&keys[call % buffers], &values[call % buffers]) {
                            (Stored::F32(k), Stored::F32(v)) => attend(
                                &q,
                                &k[span.clone()],
                                &v[span],
                                stride,
                                head_dim,
                                0.125,
                                0.0,
                                &mut scores,
                                &mut out,
                            ),
                            (Stored::F16(k), Stored::F16(v)) => attend_f16(
                                &q,
                                &k[span.clone()],
                                &v[span],
                                stride,
                                head_dim,
                                0.125,
                                0.0,
                                &mut scores,
                                &mut out,
                            ),
                            _ => unreachable!("keys and values are stored alike"),
                        }
                    }
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let flops = (calls * kv_heads * group * positions * head_dim * 4) as f64;
            let bytes =
                (calls * kv_heads * positions * head_dim * 2 * if half { 2 } else { 4 }) as f64;
            println!(
                "{dtype} {name}: {:.0} us per step, {:.1} GFLOP/s, keys and values {:.1} GB/s",
                best * 1e6,
                flops / best / 1e9,
                bytes / best / 1e9
            );
        }
    }
}
