//! What the selector and the statistics know of a backend's grouped-GEMM variants: the
//! description every backend shares ([`MoeVariant`]), and [`BackendVariant`], the trait of the
//! enum of variants each backend declares with [`moe_variants!`](crate::moe_variants).

use serde::Serialize;

use crate::error::{KernelError, Result};

/// A grouped-GEMM variant of a backend, as the selector and the statistics see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoeVariant {
    /// Stable name, used in configs, cost-model caches and metrics labels.
    pub name: &'static str,
    /// Rows per work tile (one expert's rows are cut into tiles of at most this many).
    pub tile_rows: u32,
    /// Partial tiles are padded to `tile_rows` rows, computed and discarded (GPU tensor-core
    /// tiles; the CPU mirrors of BLOCK_M 64/128).
    pub padded: bool,
    pub description: &'static str,
}

impl MoeVariant {
    /// Rows this variant computes for an expert holding `n` rows.
    pub fn computed_rows(&self, n: u32) -> u64 {
        if self.padded && n > 0 {
            n.div_ceil(self.tile_rows) as u64 * self.tile_rows as u64
        } else {
            n as u64
        }
    }
}

/// One backend's variants as an enum. The order of [`BackendVariant::ALL`] is the backend's
/// `Backend::moe_variants` order: the index that [`crate::MoeSelect::Fixed`] and
/// [`crate::MoeLayerStats::variant`] carry across the backend-generic interface.
pub trait BackendVariant: Copy + Eq + std::fmt::Debug + std::str::FromStr<Err = KernelError> + 'static {
    /// The backend, as error messages name it.
    const BACKEND: &'static str;
    /// Every variant, in the backend's order.
    const ALL: &'static [Self];
    /// The stable name (configs, cost-model caches, metrics labels, `/stats`).
    fn name(self) -> &'static str;
    /// Position in [`BackendVariant::ALL`].
    fn index(self) -> usize;
    /// The description the selector and the statistics see.
    fn describe(self) -> MoeVariant;

    /// The variant at `index` of [`BackendVariant::ALL`], or the error naming the range.
    fn from_index(index: usize) -> Result<Self> {
        Self::ALL.get(index).copied().ok_or_else(|| {
            KernelError::Shape(format!("moe variant {index} of {} ({})", Self::ALL.len(), Self::names().join(", ")))
        })
    }

    /// The variant named `name`, or the error naming it and listing the backend's variants.
    fn from_name(name: &str) -> Result<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name).ok_or_else(|| {
            KernelError::Unsupported(format!(
                "unknown {} MoE variant '{name}' (one of {})",
                Self::BACKEND,
                Self::names().join(", ")
            ))
        })
    }

    /// Every variant's name, in order.
    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.name()).collect()
    }

    /// Every variant's description, in order: a backend's `moe_variants()`.
    fn descriptions() -> Vec<MoeVariant> {
        Self::ALL.iter().map(|v| v.describe()).collect()
    }
}

/// Declares a backend's enum of MoE variants and implements [`BackendVariant`], `FromStr` and
/// `Display` for it, so that each backend lists its variants once (name, tile, padding,
/// description) and none repeats the conversions:
///
/// ```text
/// moe_variants! {
///     /// The CPU's variants.
///     pub enum CpuMoeVariant for "CPU" {
///         /// Tall tiles.
///         Grouped => "grouped", tile_rows: 126, padded: false, "items of ≤126 rows …",
///     }
/// }
/// ```
#[macro_export]
macro_rules! moe_variants {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident for $backend:literal {
            $(
                $(#[$vmeta:meta])*
                $variant:ident => $label:literal, tile_rows: $tile:expr, padded: $padded:expr, $description:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $crate::moe::BackendVariant for $name {
            const BACKEND: &'static str = $backend;
            const ALL: &'static [Self] = &[$($name::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $label),+
                }
            }

            fn index(self) -> usize {
                // Fieldless, default discriminants: the declaration order, which is `ALL`'s.
                self as usize
            }

            fn describe(self) -> $crate::moe::MoeVariant {
                match self {
                    $($name::$variant => $crate::moe::MoeVariant {
                        name: $label,
                        tile_rows: $tile,
                        padded: $padded,
                        description: $description,
                    }),+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::KernelError;

            fn from_str(s: &str) -> $crate::Result<Self> {
                <Self as $crate::moe::BackendVariant>::from_name(s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::moe::BackendVariant::name(*self))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::moe_variants! {
        enum Demo for "demo" {
            Big => "big", tile_rows: 128, padded: true, "a padded tile",
            Small => "small", tile_rows: 3, padded: false, "exact rows",
        }
    }

    #[test]
    fn names_indices_and_parsing_agree() {
        assert_eq!(Demo::ALL, &[Demo::Big, Demo::Small]);
        for (i, &v) in Demo::ALL.iter().enumerate() {
            assert_eq!(v.index(), i);
            assert_eq!(Demo::from_index(i).unwrap(), v);
            assert_eq!(v.name().parse::<Demo>().unwrap(), v);
            assert_eq!(v.to_string(), v.name());
            assert_eq!(v.describe().name, v.name());
        }
        assert_eq!(
            Demo::descriptions()[0],
            MoeVariant { name: "big", tile_rows: 128, padded: true, description: "a padded tile" }
        );
        assert!(Demo::from_index(2).unwrap_err().to_string().contains("big, small"));
        let err = "tiny".parse::<Demo>().unwrap_err().to_string();
        assert!(err.contains("'tiny'") && err.contains("big, small") && err.contains("demo"), "{err}");
    }
}
