//! Which instruction set the CPU backend runs on, chosen once at construction.
//!
//! Results are bitwise reproducible for a given `Isa` (that is what the determinism contract
//! needs: one process, one ISA). Different ISAs may differ in the last bits: the AVX-512 and AVX2
//! GEMMs use fused multiply-add, the portable code separate multiply and add.

/// The code path of the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F intrinsics for the GEMM; the other kernels are auto-vectorised for AVX-512.
    Avx512,
    /// AVX2 + FMA intrinsics for the GEMM; the other kernels are the portable ones compiled for
    /// AVX2 (same bits as `Portable` for those).
    Avx2,
    /// Plain Rust for any CPU.
    Portable,
}

impl Isa {
    /// The fastest path this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args..)` that runs the `#[inline(always)]` body `$body`
/// compiled for the given ISA: the same Rust source auto-vectorised three ways. Rust never fuses
/// a separate multiply and add, so the three variants give the same bits.
macro_rules! isa_variants {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:path;) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(isa: $crate::cpu::isa::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v512($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v256($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                match isa {
                    // SAFETY: the backend only selects an ISA that `Isa::is_supported` confirmed.
                    $crate::cpu::isa::Isa::Avx512 => return unsafe { v512($($arg),*) },
                    $crate::cpu::isa::Isa::Avx2 => return unsafe { v256($($arg),*) },
                    $crate::cpu::isa::Isa::Portable => {}
                }
            }
            let _ = isa;
            $body($($arg),*)
        }
    };
}
pub(crate) use isa_variants;
