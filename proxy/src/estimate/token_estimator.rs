//! Token counts estimated from text, per script, recalibrated online from what workers report.
//!
//! An item's own-segment token count is modelled as a linear function of character-class counts
//! of its text: a constant (the template text after the item), letters, digits, punctuation,
//! whitespace, words, non-ASCII letters, CJK characters and everything else (emoji, symbols).
//! The default weights are typical of BPE tokenizers on product text; every worker response
//! carries the true per-item counts (`usage.item_tokens`), and a forgetting least-squares fit
//! moves the weights to the deployed tokenizer within a few hundred items.

use sieve_shared::proxy_config::EstimatorConfig;
use wide::u8x32;

use crate::estimate::online_fit::{dot, OnlineFit};

pub const FEATURES: usize = 9;
pub type Features = [f64; FEATURES];

/// Feature order: constant, ASCII letters, digits, ASCII punctuation, whitespace, words,
/// non-ASCII letters (Latin extended, Greek, Cyrillic, ...), CJK, other.
const DEFAULT_WEIGHTS: Features = [10.0, 0.12, 0.4, 0.8, 0.0, 0.75, 0.35, 0.9, 1.5];
/// Typical counts per item, for the prior's pull.
const SCALES: Features = [1.0, 100.0, 10.0, 10.0, 20.0, 20.0, 50.0, 50.0, 5.0];

/// Prefix tokens besides query and instruction (system line, labels), without and with an
/// explicit instruction (without one, the worker inserts its default instruction).
const DEFAULT_PREFIX_BIAS: [f64; 2] = [60.0, 45.0];
const PREFIX_BIAS_SMOOTHING: f64 = 0.1;

pub fn features(text: &str) -> Features {
    let mut counts = [0u32; FEATURES];
    counts[0] = 1;
    if !ascii_counts(text.as_bytes(), &mut counts) {
        let mut in_word = false;
        for c in text.chars() {
            let class = if c.is_ascii() {
                ascii_class(c as u8)
            } else if c.is_whitespace() {
                4
            } else if is_cjk(c) {
                7
            } else if c.is_alphanumeric() {
                6
            } else {
                8
            };
            let wordish = matches!(class, 1 | 2 | 6);
            counts[5] += u32::from(wordish && !in_word);
            in_word = wordish;
            counts[class] += 1;
        }
    }
    counts.map(f64::from)
}

/// Feature index of an ASCII byte: 1 letter, 2 digit, 3 punctuation, 4 whitespace, 8 other.
const fn ascii_class(c: u8) -> usize {
    if c.is_ascii_alphabetic() {
        1
    } else if c.is_ascii_digit() {
        2
    } else if c.is_ascii_punctuation() {
        3
    } else if c.is_ascii_whitespace() || c == 0x0b {
        4
    } else {
        8
    }
}

/// The class counts of an all-ASCII text, added to `counts`; `false` (and `counts` untouched)
/// when a byte is not ASCII. This runs on every item of every request (the whole body's text):
/// [`ascii_counts_in`], compiled with AVX2 and POPCNT enabled where the CPU has them (checked at
/// run time), else for the target's baseline.
fn ascii_counts(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // The standard library caches what it detects: after the first call the check is a load.
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU has AVX2 and POPCNT (checked just above).
            return unsafe { ascii_counts_avx2(bytes, counts) };
        }
    }
    ascii_counts_in(bytes, counts)
}

/// [`ascii_counts_in`] compiled with AVX2 and POPCNT enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
fn ascii_counts_avx2(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
    ascii_counts_in(bytes, counts)
}

/// The lanes of `x` in `lo..lo + n` (unsigned, `n` >= 1) as a bit mask.
#[inline(always)]
fn in_range(x: u8x32, lo: u8, n: u8) -> u32 {
    let t = x - u8x32::splat(lo);
    t.min(u8x32::splat(n - 1)).simd_eq(t).to_bitmask()
}

/// 32 bytes a step, each class a bit mask whose ones are counted; the last step zero-padded (a
/// zero byte is in no class and not alphanumeric, so padding counts nothing).
#[inline(always)]
fn ascii_counts_in(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
    let (whole, rest) = bytes.as_chunks::<32>();
    let mut last = [0u8; 32];
    last[..rest.len()].copy_from_slice(rest);
    // Letters, digits, graphic (0x21..=0x7e), whitespace, word starts.
    let mut totals = [0u32; 5];
    let (mut past_ascii, mut alnum_before) = (0u32, 0u32);
    for chunk in whole.iter().chain([&last]) {
        let x = u8x32::from(*chunk);
        let letter = in_range(x | u8x32::splat(0x20), b'a', 26);
        let digit = in_range(x, b'0', 10);
        let alnum = letter | digit;
        // \t \n \x0b \x0c \r and space.
        let blank = in_range(x, 0x09, 5) | x.simd_eq(u8x32::splat(b' ')).to_bitmask();
        totals[0] += letter.count_ones();
        totals[1] += digit.count_ones();
        totals[2] += in_range(x, 0x21, 0x5e).count_ones();
        totals[3] += blank.count_ones();
        totals[4] += (alnum & !((alnum << 1) | alnum_before)).count_ones();
        alnum_before = alnum >> 31;
        // A lane's top bit: a byte past ASCII.
        past_ascii |= x.to_bitmask();
    }
    if past_ascii != 0 {
        return false;
    }
    let [letters, digits, graphic, space, words] = totals;
    counts[1] += letters;
    counts[2] += digits;
    counts[3] += graphic - letters - digits;
    counts[4] += space;
    counts[5] += words;
    counts[8] += bytes.len() as u32 - graphic - space;
    true
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF)
}

/// The current weights, copied out for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenWeights {
    pub weights: Features,
    pub prefix_bias: [f64; 2],
}

impl TokenWeights {
    /// Own-segment tokens of an item (at least 1).
    pub fn item_tokens(&self, f: &Features) -> f64 {
        dot(&self.weights, f).max(1.0)
    }

    /// Tokens of the prefix a call's prompts share: template head, instruction and query.
    pub fn prefix_tokens(&self, query: &Features, instruction: Option<&Features>) -> f64 {
        let text = |f: &Features| dot(&self.weights, f) - self.weights[0] * f[0];
        let bias = self.prefix_bias[usize::from(instruction.is_some())];
        (bias + text(query) + instruction.map_or(0.0, text)).max(1.0)
    }
}

pub struct TokenEstimator {
    fit: OnlineFit<FEATURES>,
    current: TokenWeights,
    recalibrate: bool,
}

impl TokenEstimator {
    pub fn new(cfg: &EstimatorConfig) -> Self {
        TokenEstimator {
            fit: OnlineFit::new(DEFAULT_WEIGHTS, SCALES, cfg.prior_weight, cfg.token_decay),
            current: TokenWeights { weights: DEFAULT_WEIGHTS, prefix_bias: DEFAULT_PREFIX_BIAS },
            recalibrate: cfg.recalibrate,
        }
    }

    pub fn weights(&self) -> TokenWeights {
        self.current
    }

    /// Learns from one shard's reported counts: `items` pairs each item's features with the
    /// own-segment tokens the worker counted; `prefix` is the reported shared prefix.
    pub fn observe<'a>(
        &mut self,
        items: impl IntoIterator<Item = (&'a Features, u32)>,
        query: &Features,
        instruction: Option<&Features>,
        prefix_tokens: u32,
    ) {
        if !self.recalibrate {
            return;
        }
        self.fit.observe_many(items.into_iter().map(|(f, tokens)| (f, f64::from(tokens))));
        self.current.weights = self.fit.solve();
        // The prefix's text part uses the (new) text weights; its constant is tracked apart.
        let with_zero_bias = TokenWeights { prefix_bias: [0.0; 2], ..self.current };
        let text_part = with_zero_bias.prefix_tokens(query, instruction);
        let slot = usize::from(instruction.is_some());
        let observed_bias = f64::from(prefix_tokens) - text_part;
        let b = &mut self.current.prefix_bias[slot];
        *b = (*b + PREFIX_BIAS_SMOOTHING * (observed_bias - *b)).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EstimatorConfig {
        EstimatorConfig::default()
    }

    /// A tokenizer unlike the defaults: 1 token per 3 letters of each word, 2 per symbol,
    /// 20 tokens of template tail.
    fn odd_tokenizer(text: &str) -> u32 {
        let words: u32 = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| (w.chars().count() as u32).div_ceil(3))
            .sum();
        let symbols = text.chars().filter(|c| c.is_ascii_punctuation()).count() as u32;
        20 + words + 2 * symbols
    }

    fn catalogue(i: usize) -> String {
        let words = [
            "waterproof",
            "trail",
            "running",
            "shoe",
            "men's",
            "size",
            "lightweight",
            "cushioned",
            "grip",
            "mesh",
            "upper",
            "black/red",
        ];
        let n = 3 + (i * 7) % 40;
        (0..n).map(|k| words[(i + k * 5) % words.len()]).collect::<Vec<_>>().join(" ")
            + &format!(", model {}", 1000 + i)
    }

    #[test]
    fn ascii_fast_path_agrees_with_the_general_path() {
        let long = "Trail runner, size 42 (EU)\tblack/red ~\x01 ".repeat(400); // > 4,095 bytes
        for t in ["Trail runner, size 42 (EU)\tblack/red", "  a  b  ", "x1y2 z", "", long.as_str()] {
            let fast = features(t);
            // The same text with one non-ASCII character appended takes the general path.
            let mut slow = features(&format!("{t}é"));
            slow[6] -= 1.0;
            if !t.ends_with(|c: char| c.is_ascii_alphanumeric()) {
                slow[5] -= 1.0; // é starts a word unless it continues one
            }
            assert_eq!(fast, slow, "{t:?}");
        }
    }

    #[test]
    fn vectorised_ascii_counts_match_a_byte_by_byte_count() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in (0..300).chain([4079, 4080, 4081, 4096, 9000]) {
            let text: String = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly printable, some control characters and whitespace.
                    (if x.is_multiple_of(7) { (x >> 8) % 32 } else { 32 + (x >> 8) % 95 }) as u8 as char
                })
                .collect();
            let mut fast = [0u32; FEATURES];
            assert!(ascii_counts(text.as_bytes(), &mut fast));
            let mut slow = [0u32; FEATURES];
            let mut in_word = false;
            for b in text.bytes() {
                let class = ascii_class(b);
                let wordish = class == 1 || class == 2;
                slow[5] += u32::from(wordish && !in_word);
                in_word = wordish;
                slow[class] += 1;
            }
            assert_eq!(fast, slow, "{text:?}");
        }
        // A byte past ASCII, anywhere (the padded last step included): no counts at all.
        for text in ["abc\u{e9}", &format!("{}\u{e9}x", "a".repeat(40)), "\u{7f}\u{80}"] {
            let mut counts = [0u32; FEATURES];
            assert!(!ascii_counts(text.as_bytes(), &mut counts), "{text:?}");
            assert_eq!(counts, [0; FEATURES]);
        }
    }

    /// Every build of the count the CPU can run, on the same bytes: the baseline first.
    fn every_build(bytes: &[u8]) -> Vec<(&'static str, bool, [u32; FEATURES])> {
        let run = |f: &dyn Fn(&mut [u32; FEATURES]) -> bool| {
            let mut c = [0u32; FEATURES];
            let ascii = f(&mut c);
            (ascii, c)
        };
        let mut out = Vec::new();
        let (a, c) = run(&|c| ascii_counts_in(bytes, c));
        out.push(("baseline", a, c));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU has AVX2 and POPCNT.
            let (a, c) = run(&|c| unsafe { ascii_counts_avx2(bytes, c) });
            out.push(("avx2", a, c));
        }
        let (a, c) = run(&|c| ascii_counts(bytes, c));
        out.push(("dispatched", a, c));
        out
    }

    proptest::proptest! {
        /// The AVX2 build gives exactly the baseline's counts (and the same ASCII verdict), for
        /// any bytes and any length.
        #[test]
        fn every_build_counts_the_same(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                8 => 0x20u8..0x7f,
                2 => 0u8..0x20,
                1 => proptest::num::u8::ANY,
            ], 0..20_000),
        ) {
            let all = every_build(&bytes);
            let (_, a0, c0) = all[0];
            for (name, a, c) in &all[1..] {
                proptest::prop_assert_eq!((*a, *c), (a0, c0), "{} against the baseline", name);
            }
        }
    }

    #[test]
    fn every_build_counts_long_ascii_texts_the_same() {
        // Around every step boundary, and past any small counter's range, ASCII only.
        let text = "Trail runner, size 42 (EU)\tblack/red ~\x01 ".repeat(1000);
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 4_080, 4_081, 8_160, 8_161, text.len()] {
            let all = every_build(&text.as_bytes()[..len]);
            assert!(all[0].1, "ASCII");
            for (name, a, c) in &all[1..] {
                assert_eq!((*a, *c), (all[0].1, all[0].2), "{name}, {len} bytes");
            }
        }
    }

    #[test]
    fn features_count_scripts() {
        let f = features("Größe 42, 跑步 shoes!");
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1], 3.0 + 5.0); // G r e + s h o e s (ö and ß are non-ASCII letters)
        assert_eq!(f[6], 2.0);
        assert_eq!(f[2], 2.0);
        assert_eq!(f[3], 2.0); // , !
        assert_eq!(f[7], 2.0);
        assert_eq!(f[5], 3.0); // Größe, 42, shoes
    }

    #[test]
    fn recalibration_converges_to_the_workers_counts() {
        let mut est = TokenEstimator::new(&cfg());
        let query = features("waterproof trail running shoes");
        let err = |est: &TokenEstimator| {
            let w = est.weights();
            let (mut abs, mut total) = (0.0, 0.0);
            for i in 1000..1200 {
                let t = catalogue(i);
                abs += (w.item_tokens(&features(&t)) - f64::from(odd_tokenizer(&t))).abs();
                total += f64::from(odd_tokenizer(&t));
            }
            abs / total
        };
        let before = err(&est);
        for batch in 0..10 {
            let texts: Vec<String> = (batch * 50..batch * 50 + 50).map(catalogue).collect();
            let feats: Vec<Features> = texts.iter().map(|t| features(t)).collect();
            let counts: Vec<u32> = texts.iter().map(|t| odd_tokenizer(t)).collect();
            est.observe(feats.iter().zip(counts.iter().copied()), &query, None, 70);
        }
        let after = err(&est);
        assert!(after < 0.05, "relative error after recalibration {after:.3} (before {before:.3})");
        assert!(after < before / 3.0, "before {before:.3}, after {after:.3}");
        let p = est.weights().prefix_tokens(&query, None);
        assert!((p - 70.0).abs() < 3.0, "prefix estimate {p}");
    }

    #[test]
    fn no_recalibration_when_disabled() {
        let mut est = TokenEstimator::new(&EstimatorConfig { recalibrate: false, ..cfg() });
        let before = est.weights();
        let f = features("abc");
        est.observe([(&f, 500)], &f, None, 500);
        assert_eq!(est.weights(), before);
    }
}
