//! The device primitives the kernels are built from, replayed on the CPU: bf16 conversion and the
//! warp/block reductions of kernels/cuda/common.cuh, in the same order.

/// f32 → bf16 bits, round to nearest even (PTX `cvt.rn.bf16.f32`).
pub fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// bf16 bits → f32 (exact).
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Rounds through bf16 and back: what storing an f32 in a bf16 buffer does to it.
pub fn round_bf16(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

pub fn to_bf16_vec(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|&x| to_bf16(x)).collect()
}

/// `warp_sum`: xor butterfly over 32 lane values (offsets 16, 8, 4, 2, 1). Lane l adds lane
/// l ^ o's value; float addition is commutative, so all lanes agree and lane 0 is the result.
pub fn warp_sum(lanes: [f32; 32]) -> f32 {
    let mut v = lanes;
    for o in [16, 8, 4, 2, 1] {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = prev[l] + prev[l ^ o];
        }
    }
    v[0]
}

/// `warp_max` (exact in any order).
pub fn warp_max(lanes: [f32; 32]) -> f32 {
    lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `block_sum` for a block of `partials.len()` threads (a multiple of 32): each warp's
/// butterfly, then warp 0 butterflies the per-warp sums, missing warps as 0.
pub fn block_sum(partials: &[f32]) -> f32 {
    assert!(partials.len().is_multiple_of(32) && partials.len() <= 1024, "block of {} threads", partials.len());
    let mut per_warp = [0f32; 32];
    for (w, chunk) in partials.chunks(32).enumerate() {
        per_warp[w] = warp_sum(chunk.try_into().expect("32 lanes"));
    }
    warp_sum(per_warp)
}

/// The lane-strided partial sums of `threads` threads over `n` terms: thread t accumulates
/// term(i) for i = t, t + threads, ... with `fmaf` (what `acc = fmaf(a, b, acc)` loops do).
pub fn strided_fma_partials(threads: usize, n: usize, term: impl Fn(usize) -> (f32, f32)) -> Vec<f32> {
    (0..threads)
        .map(|t| {
            let mut acc = 0f32;
            let mut i = t;
            while i < n {
                let (a, b) = term(i);
                acc = a.mul_add(b, acc);
                i += threads;
            }
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(from_bf16(0xbf80), -1.0);
    }

    #[test]
    fn butterfly_sums_like_a_tree() {
        let lanes: [f32; 32] = std::array::from_fn(|i| i as f32);
        assert_eq!(warp_sum(lanes), 496.0);
        // Order matters for rounding: the butterfly pairs lane l with l ^ 16 first.
        let mut odd = [0f32; 32];
        odd[0] = 1e8;
        odd[16] = -1e8;
        odd[1] = 1.0;
        assert_eq!(warp_sum(odd), 1.0);
        let partials: Vec<f32> = (0..256).map(|i| i as f32).collect();
        assert_eq!(block_sum(&partials), 32640.0);
    }
}
