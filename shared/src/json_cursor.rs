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
/// bytes JSON escapes in a string), or `b.len()` when it has none. Sixteen bytes a step, as the
/// scanners' strings are found; the proxy's shard encoder uses it to tell a text whose JSON
/// literal is its own bytes between quotes.
pub fn plain_prefix_len(b: &[u8]) -> usize {
    string_end(b, 0).0
}

/// Where the string whose contents start at `b[from]` stops being plain: the index of its first
/// `"`, `\` or control character (below 0x20), or `b.len()`; and whether a byte past ASCII came
/// before it. Sixteen bytes a step on x86-64 (SSE2, which every x86-64 CPU has).
fn string_end(b: &[u8], from: usize) -> (usize, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: every x86-64 CPU has SSE2 (the target's baseline).
        unsafe { sse2::string_end(b, from) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        string_end_bytewise(b, from, false)
    }
}

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

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };

    use super::string_end_bytewise;

    /// SSE2 is part of x86-64 itself: the attribute only lets the intrinsics be called safely.
    #[target_feature(enable = "sse2")]
    pub(super) fn string_end(b: &[u8], from: usize) -> (usize, bool) {
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let below_space = _mm_set1_epi8(0x1f);
        let mut high = 0i32;
        let mut i = from;
        while i + 16 <= b.len() {
            // SAFETY: `i + 16 <= b.len()`: the 16 bytes read are inside `b` (an unaligned load).
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(i).cast::<__m128i>()) };
            // A control byte is its own minimum with 0x1f (an unsigned compare).
            let stop = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                _mm_cmpeq_epi8(_mm_min_epu8(x, below_space), x),
            );
            let stops = _mm_movemask_epi8(stop);
            // Each byte's top bit: a byte past ASCII.
            let highs = _mm_movemask_epi8(x);
            if stops != 0 {
                let k = stops.trailing_zeros();
                high |= highs & ((1 << k) - 1);
                return (i + k as usize, high != 0);
            }
            high |= highs;
            i += 16;
        }
        string_end_bytewise(b, i, high != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_ends_are_found_at_every_offset() {
        for len in 0..70 {
            for stop in [b'"', b'\\', 0x00, 0x1f] {
                for high_at in [None, Some(0), Some(len / 2)] {
                    let mut b: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                    if let Some(h) = high_at.filter(|&h| h < len) {
                        b[h] = 0xc3;
                    }
                    b.push(stop);
                    b.extend_from_slice(b"\x80zz\"");
                    for from in [0, 1.min(len)] {
                        let want = string_end_bytewise(&b, from, false);
                        assert_eq!(string_end(&b, from), want, "len {len}, stop {stop:#x}, from {from}");
                        assert_eq!(want.0, len);
                    }
                }
            }
        }
        assert_eq!(string_end(b"abc", 0), (3, false), "no end: the slice's length");
    }
}
