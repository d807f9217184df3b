//! A `POST /v1/score` body read by a scanner made for its shape, with serde_json behind it.
//!
//! Every score call is one JSON object: a query, a few hundred item strings, a few optional
//! fields. Through serde that is one UTF-8 check of the whole body, then for every string
//! serde's escape scan (eight bytes a step), a visitor call and a `Vec` grown by doubling. The
//! scanner reads the shape a client writes (the fields of [`ScoreRequest`], each at most
//! once; strings without escapes; items as strings or `{id, text}` objects) in one pass, finding
//! each string's end 32 bytes a step and checking UTF-8 only in the strings that have a byte
//! past ASCII. Anything else — an unknown or repeated field, an escape or control character in a
//! string, a number that is not a plain `u64`, a missing field, anything malformed, bytes after
//! the object — makes the scanner give up, and the body is parsed again by
//! [`ApiError::parse_json`], so what is accepted, what is refused and every message stay serde's
//! own. What the scanner accepts it reads exactly as serde does: the same strings (borrowed, as
//! serde borrows an escape-free string), the same `None`s for absent and `null` fields.

use std::borrow::Cow;

use crate::api::{Item, OnOverload, ScoreRequest, TruncationDirection};
use crate::json_cursor::JsonCursor as Scanner;
use crate::ApiError;

/// The bytes an item is guessed to take, for the first size of the item vector (product texts
/// run 100-300 bytes; a smaller item only means the vector grows as before).
const ITEM_BYTES_GUESS: usize = 256;
/// The largest first size: a body of many short items grows from here.
const MAX_ITEMS_GUESS: usize = 4096;

impl<'a> ScoreRequest<'a> {
    /// A `POST /v1/score` body parsed in place: the scanner's reading, or serde's where the
    /// scanner gives up. Exactly `ApiError::parse_json::<ScoreRequest>(body)`: the same
    /// request, or the same error and message. (Here rather than in `api.rs`, so that the wire
    /// types do not import their scanner.)
    pub fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        match scan(body) {
            Some(r) => Ok(r),
            None => ApiError::parse_json(body),
        }
    }
}

/// The scanner alone: `None` wherever it leaves the body to serde (benches and tests compare the
/// two).
pub fn scan(body: &[u8]) -> Option<ScoreRequest<'_>> {
    let mut s = Scanner::new(body);
    let r = s.request()?;
    s.ws();
    (s.at == body.len()).then_some(r)
}

impl<'a> Scanner<'a> {
    /// A `u64` written as serde reads one into a `u64` field: digits, no leading zero, no
    /// fraction or exponent, in range (anything else is serde's to read or refuse).
    fn u64(&mut self) -> Option<u64> {
        self.ws();
        let start = self.at;
        let mut v: u64 = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        // "0" alone, or digits not starting with 0; then no fraction or exponent.
        let plain = digits == 1 || (digits > 1 && self.b[start] != b'0');
        (plain && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))).then_some(v)
    }

    fn bool(&mut self) -> Option<bool> {
        self.ws();
        let rest = &self.b[self.at..];
        if rest.starts_with(b"true") {
            self.at += 4;
            Some(true)
        } else if rest.starts_with(b"false") {
            self.at += 5;
            Some(false)
        } else {
            None
        }
    }

    /// `Option<T>`'s reading: `null` is `None`, else the value.
    fn opt<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.null() {
            Some(None)
        } else {
            value(self).map(Some)
        }
    }

    /// The field name, then the colon.
    fn key(&mut self) -> Option<&'a str> {
        let k = self.str()?;
        self.eat(b':')?;
        Some(k)
    }

    fn request(&mut self) -> Option<ScoreRequest<'a>> {
        self.eat(b'{')?;
        let mut query = None;
        let mut items = None;
        let (mut instruction, mut deadline_ms, mut on_overload, mut cache) = (None, None, None, None);
        let (mut max_item_tokens, mut truncation_direction, mut model) = (None, None, None);
        // serde refuses an empty object by its missing fields: that is its message to give.
        self.ws();
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            match self.key()? {
                "query" if query.is_none() => query = Some(self.str()?),
                "items" if items.is_none() => items = Some(self.items()?),
                "instruction" if instruction.is_none() => instruction = Some(self.opt(Self::str)?),
                "deadline_ms" if deadline_ms.is_none() => deadline_ms = Some(self.opt(Self::u64)?),
                "on_overload" if on_overload.is_none() => on_overload = Some(self.opt(Self::on_overload)?),
                "cache" if cache.is_none() => cache = Some(self.opt(Self::bool)?),
                "max_item_tokens" if max_item_tokens.is_none() => {
                    max_item_tokens = Some(self.opt(|c| c.u64().and_then(|n| u32::try_from(n).ok()))?)
                }
                "truncation_direction" if truncation_direction.is_none() => {
                    truncation_direction = Some(self.opt(Self::direction)?)
                }
                "model" if model.is_none() => model = Some(self.opt(Self::str)?),
                // Unknown or repeated: serde's error.
                _ => return None,
            }
            if !self.more(b'}')? {
                break;
            }
        }
        Some(ScoreRequest {
            query: Cow::Borrowed(query?),
            items: items?,
            instruction: instruction.flatten().map(Cow::Borrowed),
            deadline_ms: deadline_ms.flatten(),
            on_overload: on_overload.flatten(),
            cache: cache.flatten(),
            max_item_tokens: max_item_tokens.flatten(),
            truncation_direction: truncation_direction.flatten(),
            model: model.flatten().map(Cow::Borrowed),
        })
    }

    fn direction(&mut self) -> Option<TruncationDirection> {
        match self.str()? {
            "right" | "Right" => Some(TruncationDirection::Right),
            "left" | "Left" => Some(TruncationDirection::Left),
            _ => None,
        }
    }

    fn on_overload(&mut self) -> Option<OnOverload> {
        match self.str()? {
            "reject" => Some(OnOverload::Reject),
            "partial" => Some(OnOverload::Partial),
            _ => None,
        }
    }

    fn items(&mut self) -> Option<Vec<Item<'a>>> {
        self.eat(b'[')?;
        // Sized from the bytes left at a guess of 256 bytes an item (capped), so a usual request
        // takes one or two allocations instead of doubling its way up from four.
        let guess = ((self.b.len() - self.at) / ITEM_BYTES_GUESS).clamp(4, MAX_ITEMS_GUESS);
        let mut items = Vec::with_capacity(guess);
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(items);
        }
        loop {
            self.ws();
            let item = match self.peek()? {
                b'"' => Item::Text(Cow::Borrowed(self.str()?)),
                b'{' => self.item_object()?,
                _ => return None,
            };
            items.push(item);
            if !self.more(b']')? {
                return Some(items);
            }
        }
    }

    /// `{"text": ..., "id": ...}`, `id` optional (or `null`), each once.
    fn item_object(&mut self) -> Option<Item<'a>> {
        self.eat(b'{')?;
        let (mut id, mut text) = (None, None);
        self.ws();
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            match self.key()? {
                "text" if text.is_none() => text = Some(self.str()?),
                "id" if id.is_none() => id = Some(self.opt(Self::str)?),
                _ => return None,
            }
            if !self.more(b'}')? {
                break;
            }
        }
        Some(Item::Object { id: id.flatten().map(Cow::Borrowed), text: Cow::Borrowed(text?) })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The scanner's reading is serde's, or the scanner gives up; `parse` is `parse_json`
    /// either way (the same request, or the same error: kind and message).
    fn same_as_serde(body: &[u8]) -> Option<bool> {
        let serde: Result<ScoreRequest, ApiError> = ApiError::parse_json(body);
        let scanned = scan(body);
        if let Some(s) = &scanned {
            assert_eq!(Some(s), serde.as_ref().ok(), "{:?}", String::from_utf8_lossy(body));
            // Borrowed, as serde borrows: strings point into the body.
            let inside = |t: &str| body.as_ptr_range().contains(&t.as_ptr()) || t.is_empty();
            assert!(inside(&s.query) && s.items.iter().all(|i| inside(i.text())));
        }
        match (ScoreRequest::parse(body), serde) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!((a.kind, a.message), (b.kind, b.message)),
            (a, b) => panic!("{:?}: parse {a:?}, serde {b:?}", String::from_utf8_lossy(body)),
        }
        Some(scanned.is_some())
    }

    #[test]
    fn the_plain_shapes_are_scanned_and_read_as_serde_reads_them() {
        let scanned = [
            r#"{"query":"q","items":["a","b c"]}"#,
            r#" { "items" : [ "a" , { "id" : "x" , "text" : "b" } , {"text":"c"}, {"text":"d","id":null} ] ,
                "query" : "q", "instruction": "i", "deadline_ms": 250, "on_overload": "partial",
                "cache": false } "#,
            r#"{"query":"q","items":["a"],"instruction":null,"deadline_ms":null,"on_overload":null,"cache":null}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":0,"on_overload":"reject","cache":true}"#,
            r#"{"query":"q","items":["a"],"max_item_tokens":64,"truncation_direction":"left"}"#,
            r#"{"query":"q","items":["a"],"max_item_tokens":null,"truncation_direction":"Right"}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":18446744073709551615}"#,
            r#"{"query":"","items":[]}"#,
            "{\"query\":\"caf\u{e9} \u{8dd1}\u{6b65}\",\"items\":[\"\u{1f600} emoji\",\"Gr\u{f6}\u{df}e 42\"]}",
        ];
        for body in scanned {
            assert_eq!(same_as_serde(body.as_bytes()), Some(true), "{body}");
        }
    }

    #[test]
    fn anything_else_is_serdes_to_accept_or_refuse() {
        let given_up = [
            // Accepted by serde, not by the scanner: escapes, odd numbers.
            r#"{"query":"q \"x\"","items":["a"]}"#,
            r#"{"query":"q","items":["t\u00e9"]}"#,
            r#"{"qu\u0065ry":"q","items":["a"]}"#,
            // Refused: every message is serde's.
            r#"{"query":"q","items":["a"],"deadline_ms":5.0}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":1e3}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":05}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":-1}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":18446744073709551616}"#,
            r#"{"query":"q","items":["a"],"deadline_ms":"5"}"#,
            r#"{"query":"q","items":["a"],"cache":"no"}"#,
            r#"{"query":"q","items":["a"],"on_overload":"drop"}"#,
            r#"{"query":"q","items":["a"],"itmes":[]}"#,
            r#"{"query":"q","query":"r","items":["a"]}"#,
            r#"{"query":"q","items":["a",{"text":"b","idd":"1"}]}"#,
            r#"{"query":"q","items":[{"id":"x"}]}"#,
            r#"{"query":"q","items":[{"text":"a","text":"b"}]}"#,
            r#"{"query":"q","items":[{}]}"#,
            r#"{"query":"q","items":[3]}"#,
            r#"{"query":"q","items":[null]}"#,
            r#"{"query":3,"items":[]}"#,
            r#"{"query":null,"items":[]}"#,
            r#"{"items":["a"]}"#,
            r#"{"query":"q"}"#,
            r#"{}"#,
            r#"["q"]"#,
            r#"{"query":"q","items":["a",]}"#,
            r#"{"query":"q","items":["a"],}"#,
            r#"{"query":"q","items":["a"]} x"#,
            r#"{"query":"q","items":["a"]}{}"#,
            r#"{"query":"q","items":["a"#,
            r#"{"query":"q","items":["a"]"#,
            "{\"query\":\"tab\there\",\"items\":[\"a\"]}",
            "",
            "nul",
        ];
        for body in given_up {
            assert_eq!(same_as_serde(body.as_bytes()), Some(false), "{body}");
        }
        // Not UTF-8, in a string and outside one: serde's message and position.
        for body in [&b"{\"query\":\"q\xff\",\"items\":[\"a\"]}"[..], b"{\"query\":\"q\",\"items\":[\"a\"]}\xc3"] {
            assert_eq!(same_as_serde(body), Some(false));
        }
    }

    /// A JSON string literal of `t`, escape-free when it can be (the scanner's case), else
    /// serde's encoding.
    fn lit(t: &str, raw: bool) -> String {
        if raw {
            format!("\"{t}\"")
        } else {
            serde_json::to_string(t).unwrap()
        }
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => "[ -~]{0,40}",
            2 => "[a-z ]{0,8}[\u{e9}\u{df}\u{8dd1}\u{1f600}][a-z ]{0,8}",
            1 => any::<String>(),
        ]
    }

    proptest! {
        /// Random requests, written in every way a client might (spacing, field order, optional
        /// fields present, null or absent, items as strings or objects, strings raw where JSON
        /// allows): the scanner reads each as serde does or leaves it to serde, and `parse`
        /// always equals `parse_json`. The same bodies cut short or with one byte changed are
        /// as serde reads them too.
        #[test]
        fn requests_read_as_serde_reads_them(
            query in text(),
            items in proptest::collection::vec((text(), proptest::option::of(text()), 0u8..4), 0..12),
            instruction in proptest::option::of(proptest::option::of(text())),
            deadline in proptest::option::of(prop_oneof![Just("null".to_string()), any::<u64>().prop_map(|d| d.to_string()), Just("1.5".to_string())]),
            on_overload in proptest::option::of(prop_oneof![Just("\"reject\""), Just("\"partial\""), Just("null"), Just("\"x\"")]),
            cache in proptest::option::of(prop_oneof![Just("true"), Just("false"), Just("null")]),
            spacing in prop_oneof![Just(""), Just(" "), Just("\n\t ")],
            raw in any::<bool>(),
            order in any::<u64>(),
            cut in any::<proptest::sample::Index>(),
            flip in any::<(proptest::sample::Index, u8)>(),
        ) {
            let s = spacing;
            let values_plain = deadline.as_deref() != Some("1.5") && on_overload != Some("\"x\"");
            let l = |t: &str| lit(t, raw && !t.contains(|c: char| c == '"' || c == '\\' || c < ' '));
            let item = |(t, id, form): &(String, Option<String>, u8)| match form {
                0 | 1 => l(t),
                2 => format!("{{{s}\"text\"{s}:{s}{}{s}}}", l(t)),
                _ => format!("{{\"id\":{s}{},{s}\"text\":{}}}", id.as_deref().map_or("null".into(), l), l(t)),
            };
            let mut fields = vec![
                format!("\"query\"{s}:{s}{}", l(&query)),
                format!("\"items\":{s}[{s}{}{s}]", items.iter().map(item).collect::<Vec<_>>().join(&format!("{s},{s}"))),
            ];
            if let Some(i) = &instruction {
                fields.push(format!("\"instruction\":{}", i.as_deref().map_or("null".into(), l)));
            }
            if let Some(d) = deadline {
                fields.push(format!("\"deadline_ms\":{s}{d}"));
            }
            if let Some(o) = on_overload {
                fields.push(format!("\"on_overload\":{o}"));
            }
            if let Some(c) = cache {
                fields.push(format!("\"cache\":{c}"));
            }
            // A field order from `order`'s bits.
            let n = fields.len();
            for i in (1..n).rev() {
                fields.swap(i, (order >> (i * 3)) as usize % (i + 1));
            }
            let body = format!("{s}{{{s}{}{s}}}{s}", fields.join(&format!("{s},{s}")));
            let plain = |t: &str| !t.contains(|c: char| c == '"' || c == '\\' || c < ' ');
            let texts_plain = plain(&query)
                && items.iter().all(|(t, id, form)| plain(t) && (*form < 3 || id.as_deref().is_none_or(plain)))
                && instruction.as_ref().is_none_or(|i| i.as_deref().is_none_or(plain));
            let scanned = same_as_serde(body.as_bytes());
            // What a client writes plainly, the scanner reads itself.
            if raw && texts_plain && values_plain {
                prop_assert_eq!(scanned, Some(true), "{}", body);
            }
            let b = body.as_bytes();
            same_as_serde(&b[..cut.index(b.len() + 1)]);
            let mut changed = b.to_vec();
            if !changed.is_empty() {
                let at = flip.0.index(changed.len());
                changed[at] = flip.1;
                same_as_serde(&changed);
            }
        }
    }
}
