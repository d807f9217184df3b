//! A worker's score answer read by a scanner made for its shape, with serde_json behind it.
//!
//! Every shard's answer is one `ScoreResponse`: a hundred-odd numbers (`scores`,
//! `usage.item_tokens`) and a few fields. Through serde each number is a visitor call and each
//! array a `SeqAccess` loop; in the proxy's profile that was 4.5% of its samples. The scanner
//! reads the shape a worker writes (the fields of `ScoreResponse`, each once, strings without
//! escapes) in one pass and turns each number into the value serde_json would: the same grammar
//! and the same arithmetic as its default (not `float_roundtrip`) number parser, so every score
//! is bit-identical. Anything else — an unknown or repeated field, an escape, a number the
//! scanner does not do exactly as serde does (an overflowing significand, an exponent past
//! 10^22), an error — is read again by serde_json, so what is accepted, what is refused and every
//! message stay serde's own.

use std::ops::{Deref, DerefMut};

use sieve_shared::json_cursor::JsonCursor;
use sieve_shared::{ScoreResponse, Timing, Usage};

/// The answer in `body`, as `serde_json::from_slice::<ScoreResponse>` reads it.
pub fn parse(body: &[u8]) -> Result<ScoreResponse, serde_json::Error> {
    parse_for(body, 0)
}

/// [`parse`] for a call of `items` items: its per-item arrays are allocated at that length once,
/// instead of growing from empty by doubling (eight allocations and copies each for 100 items).
/// The answer read is the same whatever `items` is; a longer array still grows.
pub fn parse_for(body: &[u8], items: usize) -> Result<ScoreResponse, serde_json::Error> {
    // Never more than the body could hold (a number takes at least two bytes with its comma),
    // so a wrong hint cannot make a small answer allocate much.
    let expect = items.min(body.len() / 2);
    match (Scanner { cursor: JsonCursor::new(body), expect }).response() {
        Some(r) => Ok(r),
        None => serde_json::from_slice(body),
    }
}

/// A JSON number as serde_json's parser classifies it before a visitor sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Num {
    /// serde's `f32` visitor: every kind cast with `as` (a float's sign kept).
    fn f32(self) -> f32 {
        match self {
            Num::U64(v) => v as f32,
            Num::I64(v) => v as f32,
            Num::F64(v) => v as f32,
        }
    }

    fn f64(self) -> f64 {
        match self {
            Num::U64(v) => v as f64,
            Num::I64(v) => v as f64,
            Num::F64(v) => v,
        }
    }

    /// serde's unsigned visitors take only an integer in range.
    fn uint<T: TryFrom<u64>>(self) -> Option<T> {
        match self {
            Num::U64(v) => T::try_from(v).ok(),
            Num::I64(v) => u64::try_from(v).ok().and_then(|v| T::try_from(v).ok()),
            Num::F64(_) => None,
        }
    }
}

/// serde_json's table, as far as the scanner uses it: powers of ten exact in an `f64`, so one
/// multiplication or division rounds once, as serde's does.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// The shared JSON cursor, with this scanner's own steps (numbers, arrays, the answer's fields).
struct Scanner<'a> {
    cursor: JsonCursor<'a>,
    /// How many entries the per-item arrays (`scores`, `usage.item_tokens`) are expected to have.
    expect: usize,
}

impl<'a> Deref for Scanner<'a> {
    type Target = JsonCursor<'a>;
    fn deref(&self) -> &JsonCursor<'a> {
        &self.cursor
    }
}

impl DerefMut for Scanner<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cursor
    }
}

impl<'a> Scanner<'a> {
    #[cfg(test)]
    fn new(b: &'a [u8]) -> Self {
        Scanner { cursor: JsonCursor::new(b), expect: 0 }
    }

    fn digit(&self) -> Option<u64> {
        match self.peek() {
            Some(c @ b'0'..=b'9') => Some(u64::from(c - b'0')),
            _ => None,
        }
    }

    /// A number by serde_json's grammar and arithmetic, or `None` where serde would take its
    /// long paths (a significand past `u64`, an exponent beyond its exact powers) or fail.
    fn num(&mut self) -> Option<Num> {
        self.ws();
        let positive = if self.peek()? == b'-' {
            self.at += 1;
            false
        } else {
            true
        };
        let mut sig: u64 = match self.digit()? {
            0 => {
                self.at += 1;
                // One leading zero only.
                if self.digit().is_some() {
                    return None;
                }
                0
            }
            d => {
                self.at += 1;
                let mut s = d;
                while let Some(d) = self.digit() {
                    s = s.checked_mul(10)?.checked_add(d)?;
                    self.at += 1;
                }
                s
            }
        };
        let mut exp: i32 = 0;
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            float = true;
            let before = self.at;
            while let Some(d) = self.digit() {
                sig = sig.checked_mul(10)?.checked_add(d)?;
                exp -= 1;
                self.at += 1;
            }
            if self.at == before {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            float = true;
            let exp_positive = match self.peek()? {
                b'+' => {
                    self.at += 1;
                    true
                }
                b'-' => {
                    self.at += 1;
                    false
                }
                _ => true,
            };
            let mut e: i32 = i32::try_from(self.digit()?).ok()?;
            self.at += 1;
            while let Some(d) = self.digit() {
                // serde saturates far beyond any exponent the scanner does itself.
                e = e.checked_mul(10)?.checked_add(d as i32)?;
                self.at += 1;
            }
            exp = if exp_positive { exp.checked_add(e)? } else { exp.checked_sub(e)? };
        }
        if !float {
            return Some(if positive {
                Num::U64(sig)
            } else {
                let neg = (sig as i64).wrapping_neg();
                // serde: a float on underflow or `-0`.
                if neg >= 0 {
                    Num::F64(-(sig as f64))
                } else {
                    Num::I64(neg)
                }
            });
        }
        // serde_json's `f64_from_parts` where its power of ten is exact.
        let pow = *POW10.get(exp.unsigned_abs() as usize)?;
        let mut f = sig as f64;
        if exp >= 0 {
            f *= pow;
            if f.is_infinite() {
                return None;
            }
        } else {
            f /= pow;
        }
        Some(Num::F64(if positive { f } else { -f }))
    }

    /// `[a, b, ...]`, each element read by `each`.
    fn array(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            each(self)?;
            if !self.more(b']')? {
                return Some(());
            }
        }
    }

    /// `{"k": v, ...}`, each member read by `each` (given its key).
    fn object(&mut self, mut each: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.str()?;
            self.eat(b':')?;
            each(self, key)?;
            if !self.more(b'}')? {
                return Some(());
            }
        }
    }

    fn response(mut self) -> Option<ScoreResponse> {
        let mut scores = None;
        let mut ids = None;
        let mut missing = None;
        let mut usage = None;
        let mut timing = None;
        let mut model = None;
        let mut template = None;
        self.object(|s, key| match key {
            "scores" if scores.is_none() => {
                let mut v = Vec::with_capacity(s.expect);
                s.array(|s| {
                    s.ws();
                    v.push(if s.peek()? == b'n' { s.null().then_some(None)? } else { Some(s.num()?.f32()) });
                    Some(())
                })?;
                scores = Some(v);
                Some(())
            }
            "ids" if ids.is_none() => {
                s.ws();
                ids = Some(if s.peek()? == b'n' {
                    s.null().then_some(())?;
                    None
                } else {
                    let mut v = Vec::new();
                    s.array(|s| {
                        s.ws();
                        v.push(if s.peek()? == b'n' { s.null().then_some(None)? } else { Some(s.str()?.to_owned()) });
                        Some(())
                    })?;
                    Some(v)
                });
                Some(())
            }
            "missing" if missing.is_none() => {
                let mut v = Vec::new();
                s.array(|s| {
                    v.push(s.num()?.uint()?);
                    Some(())
                })?;
                missing = Some(v);
                Some(())
            }
            "usage" if usage.is_none() => {
                usage = Some(s.usage()?);
                Some(())
            }
            "timing" if timing.is_none() => {
                timing = Some(s.timing()?);
                Some(())
            }
            "model" if model.is_none() => {
                model = Some(s.str()?.to_owned());
                Some(())
            }
            "template" if template.is_none() => {
                template = Some(s.str()?.to_owned());
                Some(())
            }
            _ => None,
        })?;
        self.ws();
        if self.at != self.b.len() {
            return None;
        }
        Some(ScoreResponse {
            scores: scores?,
            ids: ids.flatten(),
            missing: missing.unwrap_or_default(),
            usage: usage?,
            timing: timing.unwrap_or_default(),
            model: model.unwrap_or_default(),
            template: template.unwrap_or_default(),
        })
    }

    fn usage(&mut self) -> Option<Usage> {
        let mut f: [Option<u64>; 8] = [None; 8];
        let mut item_tokens = None;
        self.object(|s, key| {
            let k = match key {
                "pairs" => 0,
                "prompt_tokens" => 1,
                "computed_tokens" => 2,
                "prefix_tokens" => 3,
                "cached_prefix_tokens" => 4,
                "cached_items" => 5,
                "item_shared_tokens" => 6,
                "truncated_items" => 7,
                "item_tokens" if item_tokens.is_none() => {
                    let mut v = Vec::with_capacity(s.expect);
                    s.array(|s| {
                        v.push(s.num()?.uint()?);
                        Some(())
                    })?;
                    item_tokens = Some(v);
                    return Some(());
                }
                _ => return None,
            };
            if f[k].is_some() {
                return None;
            }
            // u32 fields refuse what does not fit, as serde does.
            let n = s.num()?;
            f[k] = Some(if matches!(k, 1 | 2 | 6 | 7) { n.uint::<u64>()? } else { u64::from(n.uint::<u32>()?) });
            Some(())
        })?;
        let u32_of = |v: Option<u64>| v.map(|v| v as u32);
        Some(Usage {
            pairs: u32_of(f[0])?,
            prompt_tokens: f[1]?,
            computed_tokens: f[2]?,
            prefix_tokens: u32_of(f[3])?,
            cached_prefix_tokens: u32_of(f[4]).unwrap_or_default(),
            cached_items: u32_of(f[5]).unwrap_or_default(),
            item_tokens: item_tokens.unwrap_or_default(),
            item_shared_tokens: f[6].unwrap_or_default(),
            truncated_items: f[7].unwrap_or_default(),
        })
    }

    fn timing(&mut self) -> Option<Timing> {
        let mut f: [Option<f64>; 3] = [None; 3];
        self.object(|s, key| {
            let k = match key {
                "queue_ms" => 0,
                "compute_ms" => 1,
                "total_ms" => 2,
                _ => return None,
            };
            if f[k].is_some() {
                return None;
            }
            f[k] = Some(s.num()?.f64());
            Some(())
        })?;
        Some(Timing { queue_ms: f[0]?, compute_ms: f[1]?, total_ms: f[2]? })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde_json makes of `body`, and what the scanner makes of it (`None`: it handed
    /// the body to serde).
    fn both(body: &str) -> (Result<ScoreResponse, String>, Option<ScoreResponse>) {
        let serde = serde_json::from_str::<ScoreResponse>(body).map_err(|e| e.to_string());
        (serde, Scanner::new(body.as_bytes()).response())
    }

    /// Field by field, floats by their bits (a NaN-free `==` would hide a sign or a rounding).
    fn same(a: &ScoreResponse, b: &ScoreResponse) -> bool {
        let bits = |s: &[Option<f32>]| s.iter().map(|v| v.map(f32::to_bits)).collect::<Vec<_>>();
        let tbits = |t: &Timing| [t.queue_ms.to_bits(), t.compute_ms.to_bits(), t.total_ms.to_bits()];
        bits(&a.scores) == bits(&b.scores)
            && tbits(&a.timing) == tbits(&b.timing)
            && a.ids == b.ids
            && a.missing == b.missing
            && a.usage == b.usage
            && a.model == b.model
            && a.template == b.template
    }

    #[test]
    fn a_worker_answer_is_read_by_the_scanner_as_serde_reads_it() {
        let body = r#"{"scores":[0.8125,-1.5e-3,null,3,0.1],"missing":[2],
            "usage":{"pairs":5,"prompt_tokens":100,"computed_tokens":60,"prefix_tokens":12,
                     "cached_prefix_tokens":0,"cached_items":0,"item_tokens":[4,5,6,7,8]},
            "timing":{"queue_ms":0.25,"compute_ms":1.0,"total_ms":1.5},"model":"sim","template":"abc"}"#;
        let (serde, scanned) = both(body);
        let scanned = scanned.expect("the scanner reads a worker's shape");
        assert!(same(&serde.unwrap(), &scanned));
        assert_eq!(scanned.scores[1], Some(-1.5e-3));
        assert_eq!(parse(body.as_bytes()).unwrap().usage.item_tokens, vec![4, 5, 6, 7, 8]);
        // The expected length only sizes the arrays: right, short, long or absurd, the same
        // answer; when right, one allocation of exactly that length.
        for items in [0, 3, 5, 8, usize::MAX] {
            let r = parse_for(body.as_bytes(), items).unwrap();
            assert!(same(&scanned, &r), "{items}");
            assert!(r.scores.capacity() <= body.len() / 2 + 5, "{items}: {}", r.scores.capacity());
        }
        let exact = parse_for(body.as_bytes(), 5).unwrap();
        assert_eq!((exact.scores.capacity(), exact.usage.item_tokens.capacity()), (5, 5));
    }

    #[test]
    fn what_the_scanner_does_not_do_exactly_goes_to_serde() {
        for body in [
            // An unknown field (serde ignores it), a repeated one (serde refuses it).
            r#"{"scores":[1.5],"usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1},"extra":1}"#,
            r#"{"scores":[1.5],"scores":[1.5],"usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}}"#,
            // An escape, a significand past u64, an exponent past 1e22, a u32 out of range.
            r#"{"scores":[1.5],"model":"a\"b","usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}}"#,
            r#"{"scores":[123456789012345678901234.5],"usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}}"#,
            r#"{"scores":[1e-30],"usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}}"#,
            r#"{"scores":[1.5],"usage":{"pairs":4294967296,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}}"#,
            // Not JSON, or the wrong shape: serde's errors.
            r#"{"scores":[01],"usage":{}}"#,
            r#"{"scores":[1.],"usage":{}}"#,
            r#"{"scores":[1.5]}"#,
            r#"{"scores":[1.5],"usage":{"pairs":1,"prompt_tokens":1,"computed_tokens":1,"prefix_tokens":1}} x"#,
            "",
        ] {
            let (serde, scanned) = both(body);
            assert!(scanned.is_none(), "scanner took {body}");
            // `parse` answers as serde does, errors included.
            assert_eq!(parse(body.as_bytes()).map_err(|e| e.to_string()), serde, "{body}");
        }
    }

    /// A number as JSON may write it: sign, integer part, fraction, exponent of any case/sign.
    fn number() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            prop_oneof![Just("0".to_string()), "[1-9][0-9]{0,20}"],
            prop::option::of("[0-9]{1,20}"),
            prop::option::of(("[eE]", prop_oneof![Just(""), Just("+"), Just("-")], "[0-9]{1,3}")),
        )
            .prop_map(|(neg, int, frac, exp)| {
                let mut s = if neg { "-".to_string() } else { String::new() };
                s.push_str(&int);
                if let Some(f) = frac {
                    s.push('.');
                    s.push_str(&f);
                }
                if let Some((e, sign, d)) = exp {
                    s.push_str(&e);
                    s.push_str(sign);
                    s.push_str(&d);
                }
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every number the scanner reads itself is serde's value to the bit, as a score
        /// (`f32`) and as a time (`f64`).
        #[test]
        fn numbers_are_serdes_to_the_bit(n in number()) {
            let mut s = Scanner::new(n.as_bytes());
            if let Some(v) = s.num() {
                prop_assert_eq!(s.at, n.len());
                let f32_serde = serde_json::from_str::<f32>(&n).map(f32::to_bits).ok();
                prop_assert_eq!(Some(v.f32().to_bits()), f32_serde, "{}", n);
                let f64_serde = serde_json::from_str::<f64>(&n).map(f64::to_bits).ok();
                prop_assert_eq!(Some(v.f64().to_bits()), f64_serde, "{}", n);
            }
        }

        /// Whole answers as a worker writes them (serde_json's serialiser): the scanner reads
        /// every one, and reads it as serde does.
        #[test]
        fn worker_answers_are_serdes(
            scores in prop::collection::vec(prop::option::of(prop_oneof![
                -50f32..50f32,
                any::<f32>().prop_filter("finite", |v| v.is_finite()),
            ]), 0..40),
            items in prop::collection::vec(0u32..5000, 0..40),
            ids in prop::option::of(prop::collection::vec(prop::option::of("[a-z0-9 é]{0,8}"), 0..5)),
            times in (0.0f64..1e6, 0.0f64..1e6, 0.0f64..1e6),
            model in "[a-z0-9-]{0,12}",
        ) {
            let missing = scores.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(k, _)| k).collect();
            let r = ScoreResponse {
                scores,
                ids,
                missing,
                usage: Usage {
                    pairs: items.len() as u32,
                    prompt_tokens: u64::from(items.iter().sum::<u32>()) + 40,
                    computed_tokens: u64::from(items.iter().sum::<u32>()),
                    prefix_tokens: 40,
                    cached_prefix_tokens: 3,
                    cached_items: 0,
                    item_tokens: items,
                    item_shared_tokens: 0,
                    truncated_items: 0,
                },
                timing: Timing { queue_ms: times.0, compute_ms: times.1, total_ms: times.2 },
                model,
                template: "0123456789abcdef".into(),
            };
            for body in [serde_json::to_string(&r).unwrap(), serde_json::to_string_pretty(&r).unwrap()] {
                let (serde, scanned) = both(&body);
                let serde = serde.unwrap();
                // Scores a model gives (|s| in 1e-6..50, or 0: at most 9 significant digits
                // and an exponent within 1e22) are always the scanner's; a tiny or huge f32 may
                // go to serde.
                let typical = r.scores.iter().flatten().all(|s| *s == 0.0 || (1e-6..50.0).contains(&s.abs()));
                match scanned {
                    Some(scanned) => prop_assert!(same(&serde, &scanned), "{}", body),
                    None => prop_assert!(!typical, "the scanner gave up on {}", body),
                }
                prop_assert!(same(&serde, &parse(body.as_bytes()).unwrap()));
            }
        }
    }
}
