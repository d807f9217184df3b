//! Token counts estimated from text, per script, recalibrated online from what workers report.
//!
//! An item's own-segment token count is modelled as a linear function of character-class counts
//! of its text: a constant (the template text after the item), letters, digits, punctuation,
//! whitespace, words, non-ASCII letters, CJK characters and everything else (emoji, symbols).
//! The default weights are typical of BPE tokenizers on product text; every worker response
//! carries the true per-item counts (`usage.item_tokens`), and a forgetting least-squares fit
//! moves the weights to the deployed tokenizer within a few hundred items.

use sieve_shared::proxy_config::EstimatorConfig;

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
/// when a byte is not ASCII. This runs on every item of every request (the whole body's text),
/// so on x86-64 it is written with the vector instructions themselves ([`x86`]): 32 bytes a step
/// where the CPU has AVX2 (checked at run time), else 16 (SSE2, which every x86-64 CPU has).
/// Elsewhere the portable [`ascii_counts_in`] runs, 16 bytes a step as the compiler vectorises
/// it. All of them give the same counts (`every_width_counts_the_same` holds them equal).
/// Measured on product texts of 276 bytes on average (an AMD EPYC with AVX-512, the best of 40
/// interleaved rounds on the shared build machine): the portable code compiled for AVX2 32 bytes a
/// step ran 6.9 GB/s, the AVX2 intrinsics 8.1; 16 bytes a step 3.1 GB/s, the SSE2 intrinsics
/// 6.9 (the per-step work is a handful of instructions per class, every counter in a register).
/// The AVX2 path now loads its last partial step where it lies (overlapping the one before)
/// instead of copying it out zero-padded: 3.08-3.16 µs per 100 texts against 3.80-3.83 (9.7 GB/s;
/// an AVX-512BW version, 64-byte masked steps counted with `popcnt`, ran 7.9 and was not kept).
fn ascii_counts(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // The standard library caches what it detects: after the first call the check is a load.
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { x86::ascii_counts_avx2(bytes, counts) };
        }
        // SAFETY: every x86-64 CPU has SSE2 (the target's baseline).
        unsafe { x86::ascii_counts_sse2(bytes, counts) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ascii_counts_in::<16>(bytes, counts)
    }
}

/// The class totals of an all-ASCII text (letters, digits, graphic 0x21..=0x7e, whitespace,
/// word starts) added into `counts` as [`ascii_counts_in`] does.
fn add_totals(bytes: &[u8], totals: [u64; 5], counts: &mut [u32; FEATURES]) {
    let [letters, digits, graphic, space, words] = totals.map(|t| t as u32);
    counts[1] += letters;
    counts[2] += digits;
    counts[3] += graphic - letters - digits;
    counts[4] += space;
    counts[5] += words;
    counts[8] += bytes.len() as u32 - graphic - space;
}

/// The text's bytes as whole steps of `L` bytes, the last one zero-padded (a zero byte is in no
/// class and not alphanumeric, so padding counts nothing).
fn steps<const L: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; L]> + '_ {
    let (whole, rest) = bytes.as_chunks::<L>();
    let last = (!rest.is_empty()).then(|| {
        let mut c = [0u8; L];
        c[..rest.len()].copy_from_slice(rest);
        c
    });
    whole.iter().copied().chain(last)
}

/// [`ascii_counts`] in SSE2 and AVX2 instructions. Per step: each class a byte mask (0xff where
/// the byte is in it) by unsigned range compares, subtracted from a per-lane `u8` counter (adding
/// one), the counters summed (`sad`) into `u64` totals before they can overflow; a word start
/// is an alphanumeric byte whose previous byte (the previous step's last byte for the first) is
/// not; every byte ORed into one register whose top bits say whether any byte is past ASCII.
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[allow(clippy::wildcard_imports)]
    use std::arch::x86_64::*;

    use super::{add_totals, steps, FEATURES};

    /// 0xff in each lane of `x` in `lo..lo + n` (unsigned, `n` >= 1).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn in_range(x: __m128i, lo: u8, n: u8) -> __m128i {
        let t = _mm_sub_epi8(x, _mm_set1_epi8(lo as i8));
        _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8((n - 1) as i8)), t)
    }

    /// The two `u64` sums of `sad` against zero: the sum of the 16 `u8` lanes.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn sum_u8(acc: __m128i) -> u64 {
        let s = _mm_sad_epu8(acc, _mm_setzero_si128());
        (_mm_cvtsi128_si64(s) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s))) as u64
    }

    #[target_feature(enable = "sse2")]
    pub(super) fn ascii_counts_sse2(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
        let zero = _mm_setzero_si128();
        let (mut letters, mut digits, mut graphic, mut space, mut words) = (zero, zero, zero, zero, zero);
        let mut totals = [0u64; 5];
        let (mut high, mut prev_alnum) = (zero, zero);
        let mut n = 0u8;
        for c in steps::<16>(bytes) {
            // SAFETY: `c` is 16 bytes (an unaligned load).
            let x = unsafe { _mm_loadu_si128(c.as_ptr().cast()) };
            let letter = in_range(_mm_or_si128(x, _mm_set1_epi8(0x20)), b'a', 26);
            let digit = in_range(x, b'0', 10);
            let alnum = _mm_or_si128(letter, digit);
            // \t \n \x0b \x0c \r and space.
            let blank = _mm_or_si128(in_range(x, 0x09, 5), _mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8)));
            let before = _mm_or_si128(_mm_slli_si128::<1>(alnum), _mm_srli_si128::<15>(prev_alnum));
            letters = _mm_sub_epi8(letters, letter);
            digits = _mm_sub_epi8(digits, digit);
            graphic = _mm_sub_epi8(graphic, in_range(x, 0x21, 0x5e));
            space = _mm_sub_epi8(space, blank);
            words = _mm_sub_epi8(words, _mm_andnot_si128(before, alnum));
            high = _mm_or_si128(high, x);
            prev_alnum = alnum;
            n += 1;
            if n == u8::MAX {
                for (t, acc) in totals.iter_mut().zip([&mut letters, &mut digits, &mut graphic, &mut space, &mut words])
                {
                    *t += sum_u8(*acc);
                    *acc = zero;
                }
                n = 0;
            }
        }
        if _mm_movemask_epi8(high) != 0 {
            return false;
        }
        for (t, acc) in totals.iter_mut().zip([letters, digits, graphic, space, words]) {
            *t += sum_u8(acc);
        }
        add_totals(bytes, totals, counts);
        true
    }

    /// [`in_range`], 32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn in_range32(x: __m256i, lo: u8, n: u8) -> __m256i {
        let t = _mm256_sub_epi8(x, _mm256_set1_epi8(lo as i8));
        _mm256_cmpeq_epi8(_mm256_min_epu8(t, _mm256_set1_epi8((n - 1) as i8)), t)
    }

    /// The sum of the 32 `u8` lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum_u8_32(acc: __m256i) -> u64 {
        let s = _mm256_sad_epu8(acc, _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        (_mm_cvtsi128_si64(s) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s))) as u64
    }

    /// 0xff in the lanes at and past `32 - new` of 32 (the last `new` bytes), 0 before: a window
    /// of 32 into 32 zeros then 32 0xff.
    const NEW_LANES: [u8; 64] = {
        let mut m = [0u8; 64];
        let mut i = 32;
        while i < 64 {
            m[i] = 0xff;
            i += 1;
        }
        m
    };

    /// The AVX2 counters of [`ascii_counts_avx2`].
    struct Counters32 {
        acc: [__m256i; 5],
        totals: [u64; 5],
        high: __m256i,
        prev_alnum: __m256i,
        steps: u8,
    }

    impl Counters32 {
        /// Counts the lanes of `x` that are set in `new` (all of them but in the last, overlapping
        /// step); a lane's previous byte is the lane before it, or for the first lane the previous
        /// step's last.
        #[inline]
        #[target_feature(enable = "avx2")]
        fn step(&mut self, x: __m256i, new: __m256i) {
            let letter = in_range32(_mm256_or_si256(x, _mm256_set1_epi8(0x20)), b'a', 26);
            let digit = in_range32(x, b'0', 10);
            let alnum = _mm256_or_si256(letter, digit);
            let blank = _mm256_or_si256(in_range32(x, 0x09, 5), _mm256_cmpeq_epi8(x, _mm256_set1_epi8(b' ' as i8)));
            // Each byte's previous byte: `alnum` one byte up across the two 128-bit halves, the
            // previous step's last byte in the first lane.
            let carried = _mm256_permute2x128_si256::<0x21>(self.prev_alnum, alnum);
            let before = _mm256_alignr_epi8::<15>(alnum, carried);
            let classes = [letter, digit, in_range32(x, 0x21, 0x5e), blank, _mm256_andnot_si256(before, alnum)];
            for (acc, class) in self.acc.iter_mut().zip(classes) {
                *acc = _mm256_sub_epi8(*acc, _mm256_and_si256(class, new));
            }
            self.high = _mm256_or_si256(self.high, _mm256_and_si256(x, new));
            self.prev_alnum = alnum;
            self.steps += 1;
            if self.steps == u8::MAX {
                self.flush();
            }
        }

        #[inline]
        #[target_feature(enable = "avx2")]
        fn flush(&mut self) {
            for (t, acc) in self.totals.iter_mut().zip(self.acc.iter_mut()) {
                *t += sum_u8_32(*acc);
                *acc = _mm256_setzero_si256();
            }
            self.steps = 0;
        }
    }

    /// Whole 32-byte steps loaded from the text where they lie; the last partial step is the
    /// text's last 32 bytes (overlapping the step before) with only its new lanes counted, so
    /// no step is copied. A text shorter than 32 bytes is one zero-padded step (a zero byte is
    /// in no class).
    #[target_feature(enable = "avx2")]
    pub(super) fn ascii_counts_avx2(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
        let zero = _mm256_setzero_si256();
        let all = _mm256_set1_epi8(-1);
        let mut c = Counters32 { acc: [zero; 5], totals: [0; 5], high: zero, prev_alnum: zero, steps: 0 };
        if bytes.len() < 32 {
            let mut padded = [0u8; 32];
            padded[..bytes.len()].copy_from_slice(bytes);
            // SAFETY: `padded` is 32 bytes (an unaligned load).
            c.step(unsafe { _mm256_loadu_si256(padded.as_ptr().cast()) }, all);
        } else {
            let (whole, rest) = bytes.as_chunks::<32>();
            for chunk in whole {
                // SAFETY: `chunk` is 32 bytes (an unaligned load).
                c.step(unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) }, all);
            }
            if !rest.is_empty() {
                // SAFETY: `bytes.len() >= 32`: its last 32 bytes are inside it; `NEW_LANES` is
                // 64 bytes and `rest.len() < 32`, so the mask's 32 bytes are inside it.
                let (x, new) = unsafe {
                    (
                        _mm256_loadu_si256(bytes.as_ptr().add(bytes.len() - 32).cast()),
                        _mm256_loadu_si256(NEW_LANES.as_ptr().add(rest.len()).cast()),
                    )
                };
                c.step(x, new);
            }
        }
        if _mm256_movemask_epi8(c.high) != 0 {
            return false;
        }
        c.flush();
        add_totals(bytes, c.totals, counts);
        true
    }
}

/// [`ascii_counts`] `L` bytes a step, written for the compiler to vectorise (one register of
/// `L` bytes): fixed-size arrays, no scalar remainder loop (the last bytes are a zero-padded
/// step, and a zero byte is in no class), per-lane `u8` counters flushed before they can
/// overflow, the ASCII check folded in. A word starts where an alphanumeric byte follows a
/// non-alphanumeric one (or starts the text). Inlined into each caller, so each is compiled
/// with its caller's target features. The path of CPUs other than x86-64, and the oracle the
/// x86 paths are tested against.
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline(always)]
fn ascii_counts_in<const L: usize>(bytes: &[u8], counts: &mut [u32; FEATURES]) -> bool {
    // Letters, digits, graphic (0x21..=0x7e), whitespace, word starts. One loop body (no
    // closure or helper per step), so the counters stay in registers.
    let mut lanes = [[0u8; L]; 5];
    let mut totals = [0u64; 5];
    let mut high = [0u8; L];
    let mut prev_alnum = 0u8;
    let mut n = 0u8;
    for c in steps::<L>(bytes) {
        let mut alnum = [0u8; L];
        for i in 0..L {
            let b = c[i];
            let letter = u8::from((b | 0x20).wrapping_sub(b'a') < 26);
            let digit = u8::from(b.wrapping_sub(b'0') < 10);
            lanes[0][i] += letter;
            lanes[1][i] += digit;
            lanes[2][i] += u8::from(b.wrapping_sub(0x21) < 0x5e);
            // \t \n \x0b \x0c \r and space.
            lanes[3][i] += u8::from((b.wrapping_sub(0x09) < 5) | (b == b' '));
            alnum[i] = letter | digit;
            high[i] |= b;
        }
        for i in 0..L {
            let before = if i == 0 { prev_alnum } else { alnum[i - 1] };
            lanes[4][i] += alnum[i] & (before ^ 1);
        }
        prev_alnum = alnum[L - 1];
        n += 1;
        if n == u8::MAX {
            flush(&mut lanes, &mut totals);
            n = 0;
        }
    }
    flush(&mut lanes, &mut totals);
    if high.iter().fold(0, |a, &h| a | h) >= 0x80 {
        return false;
    }
    add_totals(bytes, totals, counts);
    true
}

/// Adds the per-lane counters into the totals and clears them.
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline(always)]
fn flush<const L: usize>(lanes: &mut [[u8; L]; 5], totals: &mut [u64; 5]) {
    for (t, l) in totals.iter_mut().zip(lanes.iter_mut()) {
        *t += l.iter().map(|&x| u64::from(x)).sum::<u64>();
        *l = [0; L];
    }
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

    /// Every vector width the CPU can run, on the same bytes.
    fn every_width(bytes: &[u8]) -> Vec<(&'static str, bool, [u32; FEATURES])> {
        let run = |f: &dyn Fn(&mut [u32; FEATURES]) -> bool| {
            let mut c = [0u32; FEATURES];
            let ascii = f(&mut c);
            (ascii, c)
        };
        let mut out = Vec::new();
        let (a, c) = run(&|c| ascii_counts_in::<16>(bytes, c));
        out.push(("16", a, c));
        let (a, c) = run(&|c| ascii_counts_in::<32>(bytes, c));
        out.push(("32", a, c));
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: every x86-64 CPU has SSE2.
            let (a, c) = run(&|c| unsafe { x86::ascii_counts_sse2(bytes, c) });
            out.push(("sse2", a, c));
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                let (a, c) = run(&|c| unsafe { x86::ascii_counts_avx2(bytes, c) });
                out.push(("avx2", a, c));
            }
        }
        let (a, c) = run(&|c| ascii_counts(bytes, c));
        out.push(("dispatched", a, c));
        out
    }

    proptest::proptest! {
        /// The wide paths give exactly the portable path's counts (and the same ASCII verdict),
        /// for any bytes and any length (lengths around every step size and the flush included).
        #[test]
        fn every_width_counts_the_same(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                8 => 0x20u8..0x7f,
                2 => 0u8..0x20,
                1 => proptest::num::u8::ANY,
            ], 0..20_000),
        ) {
            let all = every_width(&bytes);
            let (_, a0, c0) = all[0];
            for (name, a, c) in &all[1..] {
                proptest::prop_assert_eq!((*a, *c), (a0, c0), "{} against 16 bytes a step", name);
            }
        }
    }

    #[test]
    fn every_width_counts_long_ascii_texts_the_same() {
        // Past 255 steps of each path (the per-lane counters' flush), ASCII only.
        let text = "Trail runner, size 42 (EU)\tblack/red ~\x01 ".repeat(1000);
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 4_080, 4_081, 8_160, 8_161, text.len()] {
            let all = every_width(&text.as_bytes()[..len]);
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
