//! The f32 loops of the forward pass outside the products by weights: attention's scores,
//! softmax and weighted sums, LoRA's two small products, SiLU gating. Plain Rust, compiled
//! three times (AVX-512, AVX2 + FMA, the baseline) and chosen at run time, so each loop is
//! vectorised as wide as the CPU allows without building the whole program for one CPU.
//!
//! The only unsafe code is the call into a `#[target_feature]` copy after checking the CPU
//! has the features. Results differ between the copies in the last bits (FMA or not), never
//! between calls on one machine.
#![allow(unsafe_code)]

use std::sync::OnceLock;

/// Accumulators of a dot product: one AVX-512 vector, two AVX2 ones.
pub(crate) const LANES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Base,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // Every feature the AVX-512 copy is compiled with.
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma");
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            level_for(crate::Isa::cap(), avx512, avx2)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Level::Base
    })
}

/// The widest copy a CPU with these features runs, at most as wide as the kernel `cap`
/// ([`crate::KERNEL_ENV`]) allows: `avx2` leaves the AVX2 copies, `scalar` the baseline.
#[cfg(target_arch = "x86_64")]
fn level_for(cap: Option<crate::Isa>, avx512: bool, avx2: bool) -> Level {
    let allows = |isa| cap.is_none_or(|cap| isa <= cap);
    if avx512 && allows(crate::Isa::Avx512Vnni) {
        Level::Avx512
    } else if avx2 && allows(crate::Isa::Avx2) {
        Level::Avx2
    } else {
        Level::Base
    }
}

/// A function that runs `$body::<FMA>` (or `$body::<FMA, T>` for `=> body<T>`) in the widest
/// copy the CPU supports.
macro_rules! multiversion {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:ident) => {
        multiversion!($(#[$doc])* $vis fn $name($($arg: $ty),*) $(-> $ret)? => $body<>);
    };
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:ident<$($t:ty)?>) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body::<true $(, $t)?>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body::<true $(, $t)?>($($arg),*)
                }
                match level() {
                    // SAFETY: `level` found AVX-512 F and VL, AVX2 and FMA on this CPU.
                    Level::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `level` found AVX2 and FMA on this CPU.
                    Level::Avx2 => return unsafe { avx2($($arg),*) },
                    Level::Base => {}
                }
            }
            $body::<false $(, $t)?>($($arg),*)
        }
    };
}
pub(crate) use multiversion;

mod half;
mod int8;
pub(crate) use crate::attend::KvValue;
#[cfg(test)]
pub(crate) use crate::attend::dot_fixed;
pub use crate::attend::{attend, attend_f16};
pub(crate) use half::half_to_f32;
pub use half::{axpys_f16, dots_f16};
pub use int8::{axpys_i8, dots_i8};

/// `dst[i]` = `src[i]` in IEEE binary16 (bits), rounded to nearest even; values past its
/// largest finite one (65504) are clamped to it, so a finite value stays finite. How a KV
/// cache in binary16 stores what [`attend_f16`] reads.
///
/// # Panics
/// When the slices' lengths differ.
pub fn f16_bits(src: &[f32], dst: &mut [u16]) {
    use ::half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    const MAX: f32 = 65504.0;
    assert_eq!(src.len(), dst.len(), "as many binary16 values as f32 ones");
    let mut clamped = [0.0f32; 256];
    for (s, d) in src.chunks(256).zip(dst.chunks_mut(256)) {
        let c = &mut clamped[..s.len()];
        for (c, s) in c.iter_mut().zip(s) {
            *c = s.clamp(-MAX, MAX);
        }
        d.reinterpret_cast_mut::<::half::f16>()
            .convert_from_f32_slice(c);
    }
}

/// Asks the CPU to start reading `values` into its L2 cache, one 64-byte line at a time: a
/// hint, which never faults and changes no result (nothing on other architectures). For data
/// read in short streams after something larger has pushed it out of the caches: each
/// adapter's matrices, read once per step after the base model's weights. The hardware
/// prefetcher follows long streams; a rank-8 matrix is 8 rows of about a kilobyte each, and
/// its lines, asked for one at a time by the loops, arrive at DRAM latency (on an Intel Xeon
/// with AVX-512, one thread, 9 KB matrices out of 72 MB: 5.4 GB/s without the hint, 8.8 with
/// it).
pub fn prefetch<T>(values: &[T]) {
    prefetch_range(values.as_ptr() as usize, std::mem::size_of_val(values));
}

/// [`prefetch`] of the `bytes` bytes at address `start`, which need not be memory of this
/// process any more (a prefetch never faults: see [`Prefetches`]).
pub fn prefetch_range(start: usize, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        for offset in (0..bytes).step_by(64) {
            // SAFETY: SSE, which `_mm_prefetch` needs, is part of x86_64. A prefetch is a hint:
            // it never faults, whatever the address, and reads nothing the program sees.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(offset) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, bytes);
}

/// Memory to ask the CPU for later, perhaps from another thread ([`Prefetches::issue`]): the
/// addresses and lengths of slices, not the slices, so the list can outlive them. Asking for
/// memory that has since been freed is harmless: a prefetch is a hint and never faults.
#[derive(Debug, Default)]
pub struct Prefetches(Vec<(usize, usize)>);

impl Prefetches {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `values`' memory to the list.
    pub fn push<T>(&mut self, values: &[T]) {
        self.push_range(values.as_ptr() as usize, std::mem::size_of_val(values));
    }

    /// Adds the `bytes` bytes at address `start` to the list.
    pub fn push_range(&mut self, start: usize, bytes: usize) {
        self.0.push((start, bytes));
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Asks for every line of every range on the list ([`prefetch_range`]).
    pub fn issue(&self) {
        for &(start, bytes) in &self.0 {
            prefetch_range(start, bytes);
        }
    }
}

/// `a * b + c`, fused where the copy has FMA.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// The lanes of a dot product's accumulators summed pairwise, halves first (the order every
/// dot product here sums its lanes in).
#[inline(always)]
pub(crate) fn tree_sum<const N: usize>(mut acc: [f32; N]) -> f32 {
    let mut width = N;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    dot_of::<FMA, f32>(a, b, |v| v)
}

/// `a · b` with `b`'s values read by `value` (f32 as they are, or converted).
#[inline(always)]
pub(crate) fn dot_of<const FMA: bool, T: Copy>(
    a: &[f32],
    b: &[T],
    value: impl Fn(T) -> f32,
) -> f32 {
    let mut acc = [0.0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] = madd::<FMA>(x[i], value(y[i]), acc[i]);
        }
    }
    let mut sum = tree_sum(acc);
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        sum = madd::<FMA>(*x, value(*y), sum);
    }
    sum
}

/// `e^x` within 2 ulp (Cephes' `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`,
/// `2^n` from the exponent bits), without branches or libm calls so loops over it
/// vectorise. Clamped to the finite, normal range.
#[inline(always)]
fn exp<const FMA: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = madd::<FMA>(x, std::f32::consts::LOG2_E, MAGIC);
    let n = shifted - MAGIC;
    let r = madd::<FMA>(n, -0.693_359_4, x);
    let r = madd::<FMA>(n, 2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4;
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = madd::<FMA>(p, r, c);
    }
    let y = madd::<FMA>(p, r * r, r) + 1.0;
    // The low bits of `shifted` hold n + 2^22; n is within -126..=127 after the clamp.
    let n = shifted.to_bits() as i32 - MAGIC.to_bits() as i32;
    y * f32::from_bits(((n + 127) as u32) << 23)
}

#[inline(always)]
fn dots_body<const FMA: bool>(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot::<FMA>(x, &rows[j * stride..j * stride + x.len()]);
    }
}

#[inline(always)]
fn axpys_body<const FMA: bool>(y: &mut [f32], coefficients: &[f32], rows: &[f32], stride: usize) {
    for (j, c) in coefficients.iter().enumerate() {
        let row = &rows[j * stride..j * stride + y.len()];
        for (y, r) in y.iter_mut().zip(row) {
            *y = madd::<FMA>(*c, *r, *y);
        }
    }
}

#[inline(always)]
pub(crate) fn softmax_body<const FMA: bool>(x: &mut [f32]) {
    // Lane-wise max and sum (a single running value would keep the loops scalar).
    let whole = x.len() / LANES * LANES;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for c in x[..whole].chunks_exact(LANES) {
        for i in 0..LANES {
            lanes[i] = lanes[i].max(c[i]);
        }
    }
    let max = x[whole..]
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    for v in x.iter_mut() {
        *v = exp::<FMA>(*v - max);
    }
    let mut lanes = [0.0f32; LANES];
    for c in x[..whole].chunks_exact(LANES) {
        for i in 0..LANES {
            lanes[i] += c[i];
        }
    }
    let total = x[whole..].iter().chain(&lanes).sum::<f32>();
    let inverse = 1.0 / total;
    for v in x.iter_mut() {
        *v *= inverse;
    }
}

#[inline(always)]
fn silu_mul_body<const FMA: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp::<FMA>(-g)) * u;
    }
}

/// `tanh(x) = 1 - 2 / (e^(2x) + 1)`, on [`exp`] so that loops over it vectorise.
#[inline(always)]
fn tanh<const FMA: bool>(x: f32) -> f32 {
    1.0 - 2.0 / (exp::<FMA>(2.0 * x) + 1.0)
}

#[inline(always)]
fn gelu_tanh_mul_body<const FMA: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    // 0.5 g (1 + tanh(u)) = g sigmoid(2u), u = sqrt(2 / pi) (g + 0.044715 g^3).
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        let inner = TWO_SQRT_2_OVER_PI * madd::<FMA>(0.044_715 * g * g, *g, *g);
        *o = g / (1.0 + exp::<FMA>(-inner)) * u;
    }
}

/// `s = cap * tanh(s / cap)` for every score, when `cap > 0`.
#[inline(always)]
pub(crate) fn soft_cap<const FMA: bool>(scores: &mut [f32], cap: f32) {
    if cap > 0.0 {
        let inverse = 1.0 / cap;
        for s in scores {
            *s = cap * tanh::<FMA>(*s * inverse);
        }
    }
}

#[inline(always)]
fn exp_body<const FMA: bool>(x: f32) -> f32 {
    exp::<FMA>(x)
}

multiversion! {
    /// `out[j] = x · rows[j * stride..j * stride + x.len()]` for every `j < out.len()`.
    ///
    /// # Panics
    /// When a row runs past the end of `rows`.
    pub fn dots(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) => dots_body
}

multiversion! {
    /// `y += Σ_j coefficients[j] * rows[j * stride..j * stride + y.len()]`.
    ///
    /// # Panics
    /// When a row runs past the end of `rows`.
    pub fn axpys(y: &mut [f32], coefficients: &[f32], rows: &[f32], stride: usize) => axpys_body
}

multiversion! {
    /// `x = softmax(x)` in place (`e^(x - max) / Σ`).
    pub fn softmax(x: &mut [f32]) => softmax_body
}

multiversion! {
    /// `out = silu(gate) * up` (`silu(g) = g / (1 + e^-g)`), over the shortest of the three.
    pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) => silu_mul_body
}

multiversion! {
    /// `out = gelu(gate) * up`, GELU with the tanh approximation
    /// (`0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))`), over the shortest of the three.
    pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) => gelu_tanh_mul_body
}

multiversion! {
    /// `cap * tanh(x / cap)` for every `x` (soft-capping of logits).
    pub fn soft_cap_in_place(x: &mut [f32], cap: f32) => soft_cap
}

multiversion! {
    /// `e^x` (within 2 ulp; clamped to the normal range), as the other functions compute it.
    pub fn exp_f32(x: f32) -> f32 => exp_body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `MODELMUX_KERNEL` caps the loops' width as it caps the matrix kernel: a cap never widens
    /// them past what the CPU has, and no cap leaves the widest.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernel_cap_limits_the_loops_width() {
        use crate::Isa;
        for (cap, avx512, avx2, want) in [
            (None, true, true, Level::Avx512),
            (Some(Isa::Avx512Vnni), true, true, Level::Avx512),
            (Some(Isa::Avx2), true, true, Level::Avx2),
            (Some(Isa::Scalar), true, true, Level::Base),
            (None, false, true, Level::Avx2),
            (Some(Isa::Avx512Vnni), false, true, Level::Avx2),
            (Some(Isa::Scalar), false, true, Level::Base),
            (None, false, false, Level::Base),
            (Some(Isa::Avx2), false, false, Level::Base),
        ] {
            assert_eq!(
                level_for(cap, avx512, avx2),
                want,
                "{cap:?} {avx512} {avx2}"
            );
        }
    }

    /// A list of prefetches outlives the memory it names: issued after the memory is gone (a
    /// 4 MiB buffer, which the allocator maps and unmaps on its own), and for addresses that
    /// were never mapped, it neither faults nor changes anything.
    #[test]
    fn prefetches_of_memory_gone_or_never_mapped_do_not_fault() {
        let mut list = Prefetches::new();
        assert!(list.is_empty());
        let kept = vec![1.0f32; 1024];
        list.push(&kept);
        let gone = vec![7u8; 4 << 20];
        list.push(&gone);
        drop(gone);
        list.push_range(0, 1 << 16);
        list.push_range(usize::MAX - 4095, 4096);
        list.issue();
        assert!(!list.is_empty());
        assert!(kept.iter().all(|&v| v == 1.0));
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        for i in -8700..8800 {
            let x = i as f32 / 100.0 + 0.0037;
            let (got, want) = (exp_f32(x), x.exp());
            let ulp = want.to_bits().abs_diff(got.to_bits());
            assert!(ulp <= 2, "e^{x}: {got} vs {want} ({ulp} ulp)");
            let plain = exp::<false>(x).to_bits().abs_diff(want.to_bits());
            assert!(plain <= 2, "e^{x} without FMA: {plain} ulp");
        }
        let floor = (-87.0f32).exp().to_bits();
        assert!(exp_f32(-1000.0).to_bits().abs_diff(floor) <= 2);
        assert!(exp_f32(f32::INFINITY).is_finite());
    }

    #[test]
    fn loops_match_plain_f64_sums() {
        let v = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * s).collect()
        };
        let (x, rows) = (v(70, 0.1), v(5 * 80, 0.03));
        let mut out = [0.0; 5];
        dots(&x, &rows, 80, &mut out);
        for (j, o) in out.iter().enumerate() {
            let want: f64 = (0..70).map(|i| x[i] as f64 * rows[j * 80 + i] as f64).sum();
            assert!((*o as f64 - want).abs() < 1e-5, "{o} vs {want}");
        }
        let mut y = v(70, 0.2);
        let before = y.clone();
        axpys(&mut y, &out, &rows, 80);
        for i in 0..70 {
            let want = before[i] as f64
                + (0..5)
                    .map(|j| out[j] as f64 * rows[j * 80 + i] as f64)
                    .sum::<f64>();
            assert!((y[i] as f64 - want).abs() < 1e-5);
        }
        let mut p = v(37, 0.5);
        let logits = p.clone();
        softmax(&mut p);
        let z: f64 = logits.iter().map(|l| (*l as f64).exp()).sum();
        for (p, l) in p.iter().zip(&logits) {
            assert!((*p as f64 - (*l as f64).exp() / z).abs() < 1e-7);
        }
        let (gate, up) = (v(33, 0.7), v(33, 0.3));
        let mut out = vec![0.0; 33];
        silu_mul(&gate, &up, &mut out);
        for i in 0..33 {
            let g = gate[i] as f64;
            let want = g / (1.0 + (-g).exp()) * up[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6 * want.abs().max(1.0));
        }
        // GELU (tanh form) over a wide range, against its definition in f64.
        let gate: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.09).collect();
        let up = v(200, 0.3);
        let mut out = vec![0.0; 200];
        gelu_tanh_mul(&gate, &up, &mut out);
        for i in 0..200 {
            let g = gate[i] as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            let want = 0.5 * g * (1.0 + inner.tanh()) * up[i] as f64;
            assert!(
                (out[i] as f64 - want).abs() < 1e-6 * want.abs().max(1.0),
                "gelu({g}) * {}: {} vs {want}",
                up[i],
                out[i]
            );
        }
        let mut capped: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 1.7).collect();
        let raw = capped.clone();
        soft_cap_in_place(&mut capped, 30.0);
        for (c, r) in capped.iter().zip(&raw) {
            let want = 30.0 * (*r as f64 / 30.0).tanh();
            assert!(
                (*c as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
                "{c} vs {want}"
            );
        }
    }
}
