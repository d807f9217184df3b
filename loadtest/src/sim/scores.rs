//! Deterministic scores: a hash of (instruction, query, item) mapped into (0, 1), so a pair's
//! score never depends on its batch, its shard or its worker, and merges can be checked.

pub fn score(instruction: Option<&str>, query: &str, item: &str) -> f32 {
    let mut h = Fnv::new();
    h.write(instruction.unwrap_or("").as_bytes());
    h.write(&[0x1f]);
    h.write(query.as_bytes());
    h.write(&[0x1f]);
    h.write(item.as_bytes());
    let bits = splitmix64(h.0) >> 40; // 24 bits: exactly representable in f32
    ((bits as f32) + 0.5) / (1u32 << 24) as f32
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
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
        for i in 0..10_000 {
            let s = score(None, "q", &i.to_string());
            assert!(s > 0.0 && s < 1.0, "{s}");
        }
    }
}
