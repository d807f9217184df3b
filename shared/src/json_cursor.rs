//! A cursor over JSON bytes for the score request's scanner (`score_scan.rs`): the steps it
//! takes — whitespace, punctuation, `null`, and strings without escapes found 32 bytes a step —
//! each giving `None`/`false` where the bytes are not the plain case, so the caller can hand the
//! body to serde_json instead.

use wide::u8x32;

/// A position in `b`; the scanner adds its own steps in an `impl` block of its own.
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
/// `"`, `\\` or control character (below 0x20), or `b.len()`; and whether a byte past ASCII came
/// before it. The item texts of a request are most of its bytes, and this is the pass that finds
/// them: [`string_end_in`], compiled with AVX2 enabled where the CPU has it (checked at run
/// time), else for the target's baseline.
fn string_end(b: &[u8], from: usize) -> (usize, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // The standard library caches what it detects: after the first call the check is a load.
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { string_end_avx2(b, from) };
        }
    }
    string_end_in(b, from)
}

/// [`string_end_in`] compiled with AVX2 enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn string_end_avx2(b: &[u8], from: usize) -> (usize, bool) {
    string_end_in(b, from)
}

/// [`string_end`] 32 bytes a step: the step's stops and its bytes past ASCII as bit masks, so
/// the first stop is the lowest bit; the last, partial step a byte at a time.
#[inline(always)]
fn string_end_in(b: &[u8], from: usize) -> (usize, bool) {
    let mut high = 0u32;
    let mut i = from;
    for chunk in b[from..].as_chunks::<32>().0 {
        let x = u8x32::from(*chunk);
        let control = x.min(u8x32::splat(0x1f)).simd_eq(x);
        let stops = (x.simd_eq(u8x32::splat(b'"')) | x.simd_eq(u8x32::splat(b'\\')) | control).to_bitmask();
        // A lane's top bit: a byte past ASCII.
        let past_ascii = x.to_bitmask();
        if stops != 0 {
            let at = stops.trailing_zeros();
            return (i + at as usize, high | (past_ascii & ((1 << at) - 1)) != 0);
        }
        high |= past_ascii;
        i += 32;
    }
    string_end_bytewise(b, i, high != 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The stepped search (as dispatched, and for the baseline) against the bytewise reference:
    /// the stop and a byte past ASCII at every offset across several steps, and from offsets
    /// inside a step.
    #[test]
    fn string_ends_are_found_at_every_offset() {
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
                        assert_eq!(string_end(&b, from), want, "len {len}, stop {stop:?}, from {from}");
                        assert_eq!(string_end_in(&b, from), want, "baseline: len {len}, stop {stop:?}, from {from}");
                    }
                }
            }
        }
        assert_eq!(string_end(b"abc", 0), (3, false), "no end: the slice's length");
    }
}
