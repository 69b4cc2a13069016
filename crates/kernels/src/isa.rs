//! Which instruction set the kernels use: what the CPU has, capped by [`KERNEL_ENV`].

use std::sync::OnceLock;

/// The environment variable that caps the instruction set the kernels use: `scalar`, `avx2`
/// or `avx512-vnni` (any other value is ignored; a kernel the CPU lacks is never picked). It
/// caps the matrix kernel [`Isa::detect`] picks and the width of the [`vector`](crate::vector) loops alike,
/// so `avx2` runs the whole forward pass as on a CPU without AVX-512.
pub const KERNEL_ENV: &str = "MODELMUX_KERNEL";

/// An instruction set a kernel is written for (ordered slowest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust; any CPU. Also the reference the SIMD kernels are tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW + VNNI (`vpdpbusd`).
    Avx512Vnni,
}

impl Isa {
    /// Every kernel, slowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni];

    /// The fastest kernel this CPU runs (checked once), at most the one the environment
    /// variable [`KERNEL_ENV`] names, if it names one (to compare kernels on one machine).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let cap = Isa::cap();
            Isa::ALL
                .into_iter()
                .rev()
                .filter(|isa| cap.is_none_or(|cap| *isa <= cap))
                .find(|isa| isa.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// The cap [`KERNEL_ENV`] sets, if it names a kernel.
    pub(crate) fn cap() -> Option<Isa> {
        std::env::var(KERNEL_ENV)
            .ok()
            .and_then(|name| Isa::from_name(&name))
    }

    /// The kernel called `name` (`scalar`, `avx2`, `avx512-vnni`), as [`Isa::name`] says.
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|isa| isa.name() == name)
    }

    /// The kernel's name, as [`KERNEL_ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Whether this CPU runs this kernel.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => has_avx512_vnni(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Activation rows one kernel call multiplies together (they share each weight load).
    pub(crate) fn tile_rows(self) -> usize {
        match self {
            Isa::Scalar => 4,
            Isa::Avx2 => 8,
            Isa::Avx512Vnni => 8,
        }
    }
}

/// Whether the CPU has AVX2, FMA and F16C (what every AVX2 kernel here needs).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether the CPU has AVX-512 F, BW and VNNI.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}
