//! A cursor over JSON bytes for the scanners made for one shape each (`score_scan.rs` for score
//! requests, the proxy's reader of worker answers): the steps every such scanner takes —
//! whitespace, punctuation, `null`, and strings without escapes found sixteen bytes a step —
//! each giving `None`/`false` where the bytes are not the plain case, so the caller can hand the
//! body to serde_json instead.

/// A position in `b`; the scanners add their own steps in `impl` blocks of their own (in this
/// crate) or wrap it (elsewhere).
pub struct JsonCursor<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> JsonCursor<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        JsonCursor { b, at: 0 }
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// JSON's whitespace: space, tab, line feed, carriage return.
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.at += 1;
        }
    }

    /// The next non-blank byte is `c`: eaten.
    pub fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.at += 1)
    }

    /// After a value in an array or object: `true` at a comma (eaten), `false` at `close`
    /// (eaten).
    pub fn more(&mut self, close: u8) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(true)
            }
            c if c == close => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// `null`, if that is what comes next (eaten).
    pub fn null(&mut self) -> bool {
        self.ws();
        let is = self.b[self.at..].starts_with(b"null");
        if is {
            self.at += 4;
        }
        is
    }

    /// A string with no escapes and no control characters, valid UTF-8: borrowed from the body.
    pub fn str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let (end, high) = string_end(self.b, start);
        if self.b.get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        let raw = &self.b[start..end];
        if high {
            std::str::from_utf8(raw).ok()
        } else {
            // SAFETY: every byte of `raw` is ASCII (`string_end` saw no byte past 0x7f).
            Some(unsafe { std::str::from_utf8_unchecked(raw) })
        }
    }
}

/// The length of `b`'s plain prefix: the index of its first `"`, `\\` or control character (the
/// bytes JSON escapes in a string), or `b.len()` when it has none. The proxy's shard encoder uses
/// it to tell a text whose JSON literal is its own bytes between quotes.
pub fn plain_prefix_len(b: &[u8]) -> usize {
    string_end(b, 0).0
}

/// Where the string whose contents start at `b[from]` stops being plain: the index of its first
/// `"`, `\` or control character (below 0x20), or `b.len()`; and whether a byte past ASCII came
/// before it. On x86-64, 32 bytes a step where the CPU has AVX2, else 16 (SSE2, which every
/// x86-64 CPU has): the item texts of a request are most of its bytes, and this is the pass
/// that finds them. Measured on 100 product texts (30 KB; AMD EPYC with AVX-512, best of 40
/// interleaved rounds): SSE2 1.93 µs, AVX2 1.21; an AVX-512BW version (64-byte masked steps)
/// 1.33, so it was not kept.
fn string_end(b: &[u8], from: usize) -> (usize, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // The standard library caches what it detects: after the first call the check is a load.
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { x86::string_end_avx2(b, from) };
        }
        // SAFETY: every x86-64 CPU has SSE2 (the target's baseline).
        unsafe { x86::string_end_sse2(b, from) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        string_end_bytewise(b, from, false)
    }
}

/// A [`string_end`] implementation (the tests run each the CPU has).
#[cfg(test)]
type StringEnd = fn(&[u8], usize) -> (usize, bool);

/// [`string_end`] a byte at a time (`high`: a byte past ASCII was seen before `from`).
fn string_end_bytewise(b: &[u8], from: usize, mut high: bool) -> (usize, bool) {
    for (i, &c) in b.iter().enumerate().skip(from) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return (i, high);
        }
        high |= c >= 0x80;
    }
    (b.len(), high)
}

/// [`string_end`] in SSE2 and AVX2: per step, a mask of the bytes that stop a plain
/// string (quote, backslash, or a control byte: its own unsigned minimum with 0x1f) and a mask of
/// the bytes past ASCII (their top bits).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[allow(clippy::wildcard_imports)]
    use std::arch::x86_64::*;

    use super::string_end_bytewise;

    /// The end found in a step at `i` whose stop bits are `stops` (non-zero) and top bits
    /// `highs`, with `high` the top bits seen before the step.
    #[inline]
    fn stop_at(i: usize, stops: u64, highs: u64, high: u64) -> (usize, bool) {
        let k = stops.trailing_zeros();
        let before = highs & ((1u64 << k) - 1);
        (i + k as usize, (high | before) != 0)
    }

    /// SSE2 is part of x86-64 itself: the attribute only lets the intrinsics be called safely.
    #[target_feature(enable = "sse2")]
    pub(super) fn string_end_sse2(b: &[u8], from: usize) -> (usize, bool) {
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let below_space = _mm_set1_epi8(0x1f);
        let mut high = 0u64;
        let mut i = from;
        while i + 16 <= b.len() {
            // SAFETY: `i + 16 <= b.len()`: the 16 bytes read are inside `b` (an unaligned load).
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(i).cast::<__m128i>()) };
            let stop = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                _mm_cmpeq_epi8(_mm_min_epu8(x, below_space), x),
            );
            let stops = _mm_movemask_epi8(stop) as u32 as u64;
            let highs = _mm_movemask_epi8(x) as u32 as u64;
            if stops != 0 {
                return stop_at(i, stops, highs, high);
            }
            high |= highs;
            i += 16;
        }
        string_end_bytewise(b, i, high != 0)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn string_end_avx2(b: &[u8], from: usize) -> (usize, bool) {
        let quote = _mm256_set1_epi8(b'"' as i8);
        let backslash = _mm256_set1_epi8(b'\\' as i8);
        let below_space = _mm256_set1_epi8(0x1f);
        let mut high = 0u64;
        let mut i = from;
        while i + 32 <= b.len() {
            // SAFETY: `i + 32 <= b.len()`: the 32 bytes read are inside `b` (an unaligned load).
            let x = unsafe { _mm256_loadu_si256(b.as_ptr().add(i).cast::<__m256i>()) };
            let stop = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi8(x, quote), _mm256_cmpeq_epi8(x, backslash)),
                _mm256_cmpeq_epi8(_mm256_min_epu8(x, below_space), x),
            );
            let stops = _mm256_movemask_epi8(stop) as u32 as u64;
            let highs = _mm256_movemask_epi8(x) as u32 as u64;
            if stops != 0 {
                return stop_at(i, stops, highs, high);
            }
            high |= highs;
            i += 32;
        }
        let (end, tail_high) = string_end_sse2(b, i);
        (end, tail_high || high != 0)
    }

    /// Each variant this CPU can run, with its name (for the tests).
    #[cfg(test)]
    pub(super) fn variants() -> Vec<(&'static str, super::StringEnd)> {
        // SAFETY: SSE2 is the target's baseline.
        let mut v: Vec<(&'static str, super::StringEnd)> = vec![("sse2", |b, f| unsafe { string_end_sse2(b, f) })];
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            v.push(("avx2", |b, f| unsafe { string_end_avx2(b, f) }));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant this CPU runs (SSE2 always; AVX2 where it has it: the test prints which
    /// ran) against the bytewise reference, the stop and a byte past ASCII at
    /// every offset across several steps of each width, and from offsets inside a step.
    #[test]
    fn string_ends_are_found_at_every_offset() {
        let mut variants: Vec<(&str, StringEnd)> = vec![("dispatch", string_end)];
        #[cfg(target_arch = "x86_64")]
        variants.extend(x86::variants());
        println!("string_end variants run on this CPU: {:?}", variants.iter().map(|v| v.0).collect::<Vec<_>>());
        for len in 0usize..200 {
            for stop in [Some(b'"'), Some(b'\\'), Some(0x00), Some(0x1f), None] {
                for high_at in [None, Some(0), Some(len / 2), Some(len.saturating_sub(1))] {
                    let mut b: Vec<u8> = (0..len)
                        .map(|i| b' ' + (i % 90) as u8)
                        .map(|c| if c == b'"' || c == b'\\' { b'x' } else { c })
                        .collect();
                    if let Some(h) = high_at.filter(|&h| h < len) {
                        b[h] = 0xc3;
                    }
                    if let Some(stop) = stop {
                        b.push(stop);
                        b.extend_from_slice(b"\x80zz\"");
                    }
                    for from in [0, 1, 17, 33, 65].into_iter().filter(|&f| f <= len) {
                        let want = string_end_bytewise(&b, from, false);
                        assert_eq!(want.0, len);
                        for (name, f) in &variants {
                            assert_eq!(f(&b, from), want, "{name}: len {len}, stop {stop:?}, from {from}");
                        }
                    }
                }
            }
        }
        assert_eq!(string_end(b"abc", 0), (3, false), "no end: the slice's length");
    }
}
