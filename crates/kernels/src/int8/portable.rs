//! The portable kernel, and the reference the SIMD kernels must equal bit for bit: each
//! block's integer dot product `sum(w * a)`, then `acc = fma(sum, d_w * d_a, acc)` per block
//! in order, as the SIMD lanes do.

use half::f16;

use crate::panel::{GROUPS, Panel, Tile};
use crate::{BLOCK, PANEL};

pub(crate) fn tile(panel: Panel<'_>, x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    let blocks = panel.scales.len() / PANEL;
    let k = blocks * BLOCK;
    for (r, out) in out.iter_mut().enumerate() {
        *out = [0.0; PANEL];
        for b in 0..blocks {
            let a = &x.q[r * k + b * BLOCK..][..BLOCK];
            let da = x.scales[r * blocks + b];
            for (lane, acc) in out.iter_mut().enumerate() {
                let mut sum = 0i32;
                for g in 0..GROUPS {
                    let w = &panel.lines[b * GROUPS + g].0[lane * 4..lane * 4 + 4];
                    for j in 0..4 {
                        sum += (w[j] ^ 0x80) as i8 as i32 * a[g * 4 + j] as i32;
                    }
                }
                let dw = f16::from_bits(panel.scales[b * PANEL + lane]).to_f32();
                *acc = (sum as f32).mul_add(dw * da, *acc);
            }
        }
    }
}
