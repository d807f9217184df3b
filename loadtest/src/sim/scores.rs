//! Deterministic scores: a hash of (instruction, query, item) mapped into (0, 1), so a pair's
//! score never depends on its batch, its shard or its worker, and merges can be checked.

pub fn score(instruction: Option<&str>, query: &str, item: &str) -> f32 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for part in [instruction.unwrap_or("").as_bytes(), query.as_bytes(), item.as_bytes()] {
        h = mix(h, part);
    }
    let bits = splitmix64(h) >> 40; // 24 bits: exactly representable in f32
    ((bits as f32) + 0.5) / (1u32 << 24) as f32
}

/// Folds a byte string into the hash eight bytes at a time, its length included (so the parts'
/// boundaries matter: ("ab", "c") and ("a", "bc") differ).
fn mix(mut h: u64, bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    (h ^ bytes.len() as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_stable_distinct_and_inside_the_unit_interval() {
        let a = score(None, "running shoes", "Trail runner, size 42");
        assert_eq!(a, score(None, "running shoes", "Trail runner, size 42"));
        assert_ne!(a, score(None, "running shoes", "Trail runner, size 43"));
        assert_ne!(a, score(Some("x"), "running shoes", "Trail runner, size 42"));
        assert_ne!(score(None, "ab", "c"), score(None, "a", "bc"));
        for i in 0..10_000 {
            let s = score(None, "q", &i.to_string());
            assert!(s > 0.0 && s < 1.0, "{s}");
        }
    }
}
