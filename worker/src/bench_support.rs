//! What the benches and examples share: deterministic product-like item texts and the search
//! instruction they score under, so every figure is measured on the same kind of input.

/// The instruction the benches' calls carry.
pub const INSTRUCTION: &str =
    "Given an e-commerce search query, judge whether the product listing is relevant to what the shopper wants";

pub const WORDS: &[&str] = &[
    "waterproof",
    "leather",
    "running",
    "shoes",
    "men's",
    "women's",
    "lightweight",
    "breathable",
    "mesh",
    "trail",
    "cushioned",
    "sole",
    "size",
    "black",
    "white",
    "red",
    "navy",
    "classic",
    "sneaker",
    "outdoor",
    "hiking",
    "boot",
    "ankle",
    "support",
    "rubber",
    "grip",
    "durable",
    "stitching",
    "comfort",
    "insole",
    "memory",
    "foam",
    "wide",
    "fit",
    "casual",
    "sport",
    "training",
    "gym",
    "road",
    "marathon",
    "vegan",
    "suede",
    "canvas",
    "slip-on",
    "lace-up",
    "reflective",
    "details",
    "free",
    "returns",
    "best",
    "seller",
    "new",
    "arrival",
    "2024",
    "edition",
    "brand",
];

/// Deterministic product-like text of `n_words` words (the same text for the same arguments
/// on every machine).
pub fn item_text(seed: u64, n_words: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let words: Vec<&str> = (0..n_words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % WORDS.len() as u64) as usize]
        })
        .collect();
    format!("Title: {}. Attributes: {}", words[..4.min(n_words)].join(" "), words.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_text_is_deterministic_and_has_the_asked_word_count() {
        assert_eq!(item_text(7, 12), item_text(7, 12));
        assert_ne!(item_text(7, 12), item_text(8, 12));
        let t = item_text(3, 6);
        let attrs = t.split_once("Attributes: ").unwrap().1;
        assert_eq!(attrs.split(", ").count(), 6);
    }
}
