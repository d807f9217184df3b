//! A shard's request body, built by splicing. An item text that arrived as a JSON string with no
//! escapes is its own encoding, so its bytes are taken from the caller's body as they came; the
//! query, the instruction, texts that had escapes and item objects (text and id) are encoded
//! once per request, never once per shard. No item is parsed into an owned string and
//! serialised again on the way through. A shard whose items are one run of consecutive items
//! all spliced (the whole request; a fixed split's chunks) is not even copied: it goes out as
//! three chunks, the head, one slice of the caller's body (between two elements of a JSON array
//! there is only a comma and whitespace) and the tail. Encoded items are written one after the
//! other with a comma between them, so a run of consecutive encoded items (every shard of a
//! gRPC call, whose texts are all encoded) is one slice of the request's own bytes, uncopied too.

use std::borrow::Cow;
use std::io::Write as _;
use std::ops::Range;

use bytes::Bytes;
use sieve_shared::api::{Item, ScoreRequest};

/// Where an item's JSON lies.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Frag {
    /// In the caller's body: the string literal, quotes included.
    Body(Range<usize>),
    /// In the request's own encoded bytes.
    Own(Range<usize>),
}

/// Everything a shard body is made of, for one request.
#[derive(Debug)]
pub struct ShardWire {
    body: Bytes,
    /// `{"query":…,"instruction":…,"items":[` then the encoded items.
    own: Bytes,
    head: usize,
    items: Vec<Frag>,
}

impl ShardWire {
    /// The pieces of `req`, whose borrowed strings (if any) point into `body`.
    pub fn new(body: Bytes, req: &ScoreRequest<'_>) -> Self {
        // Sized for every item encoded here (none spliced): one allocation for a request of
        // owned strings (a gRPC call's), a little spare for one parsed in place.
        let texts: usize = req
            .items
            .iter()
            .map(|i| match i {
                Item::Text(Cow::Borrowed(_)) => 0,
                _ => i.text().len() + i.id().map_or(0, str::len) + 16,
            })
            .sum();
        let mut own = Vec::with_capacity(64 + req.query.len() + texts);
        own.extend_from_slice(b"{\"query\":");
        encode(&mut own, req.query.as_ref());
        if let Some(i) = &req.instruction {
            own.extend_from_slice(b",\"instruction\":");
            encode(&mut own, i.as_ref());
        }
        // Truncation goes to every shard: the workers apply it.
        if let Some(n) = req.max_item_tokens {
            let _ = write!(own, ",\"max_item_tokens\":{n}");
        }
        if req.truncation_direction == Some(sieve_shared::TruncationDirection::Left) {
            own.extend_from_slice(b",\"truncation_direction\":\"left\"");
        }
        own.extend_from_slice(b",\"items\":[");
        let head = own.len();
        let items = req
            .items
            .iter()
            .map(|item| match item {
                Item::Text(Cow::Borrowed(t)) => match literal_in(&body, t) {
                    Some(r) => Frag::Body(r),
                    None => own_item(&mut own, head, item),
                },
                _ => own_item(&mut own, head, item),
            })
            .collect();
        ShardWire { body, own: Bytes::from(own), head, items }
    }

    fn item(&self, i: usize) -> &[u8] {
        match &self.items[i] {
            Frag::Body(r) => &self.body[r.clone()],
            Frag::Own(r) => &self.own[r.clone()],
        }
    }

    /// The body of a shard of `items` (the caller's indices) with `deadline_ms` left, in the
    /// `ScoreRequest` shape, as the chunks to send: `[head, items, tail]` when the items are one
    /// run of consecutive spliced items (no copy), else one buffer.
    pub fn shard(&self, items: &[usize], deadline_ms: u64) -> Vec<Bytes> {
        // Written on the stack (`],"deadline_ms":` and at most 20 digits), then copied once into
        // a buffer of its exact length: a `Vec` with spare room would cost a second allocation
        // when it becomes `Bytes`.
        let mut buf = [0u8; 48];
        let mut w = std::io::Cursor::new(&mut buf[..]);
        // 17 + 20 + 1 bytes at most: it fits.
        let _ = write!(w, "],\"deadline_ms\":{deadline_ms}}}");
        let len = w.position() as usize;
        let tail = &buf[..len];
        if let Some(run) = self.run(items) {
            return vec![self.own.slice(..self.head), run, Bytes::copy_from_slice(tail)];
        }
        let len = self.head + items.iter().map(|&i| self.item(i).len() + 1).sum::<usize>() + tail.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&self.own[..self.head]);
        for (k, &i) in items.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(self.item(i));
        }
        out.extend_from_slice(tail);
        vec![Bytes::from(out)]
    }

    /// The slice from the first item's JSON to the last one's, when `items` are consecutive and
    /// all in the body, or all encoded one after the other (each one comma after the last).
    fn run(&self, items: &[usize]) -> Option<Bytes> {
        let (&first, &last) = (items.first()?, items.last()?);
        if !items.windows(2).all(|w| w[1] == w[0] + 1) {
            return None;
        }
        let frags = &self.items[first..=last];
        match (&frags[0], &frags[frags.len() - 1]) {
            (Frag::Body(a), Frag::Body(b)) if frags.iter().all(|f| matches!(f, Frag::Body(_))) => {
                Some(self.body.slice(a.start..b.end))
            }
            (Frag::Own(a), Frag::Own(b))
                if frags.windows(2).all(|w| matches!(w, [Frag::Own(x), Frag::Own(y)] if y.start == x.end + 1)) =>
            {
                Some(self.own.slice(a.start..b.end))
            }
            _ => None,
        }
    }
}

/// The range of `text`'s JSON string literal in `body`, when `text` is a slice of `body` between
/// two quotes: serde_json borrows a string only when it had no escapes, so those bytes are
/// exactly its encoding. `None` for anything else (then it is encoded).
fn literal_in(body: &[u8], text: &str) -> Option<Range<usize>> {
    let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(text.len())?;
    (start >= 1 && end < body.len() && body[start - 1] == b'"' && body[end] == b'"').then(|| start - 1..end + 1)
}

/// Writes `s` as a JSON string literal, exactly as serde_json writes it.
fn encode(out: &mut Vec<u8>, s: &str) {
    // Most texts (those of a gRPC call, which come with no JSON of their own) need no escape:
    // their literal is their bytes between quotes, known after one branch-free pass, where
    // serde_json's writer looks every byte up and branches (measured: about 25 us of proxy CPU
    // for a 100-item gRPC call, against a few us this way).
    if !needs_escape(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // A str always encodes: serde_json fails only on writer errors and non-string map keys.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Whether JSON escapes any byte of `b`: serde_json escapes control characters, `"` and `\\`,
/// nothing else (non-ASCII text is written as its UTF-8). The JSON scanners' own search,
/// sixteen bytes a step (`json_cursor`, SSE2 on x86-64): 2.1 µs for a 100-item call's 30 KB of
/// text where the word-at-a-time (SWAR) test it replaces took 2.4 µs (best of 40 runs of both
/// on the 2-core machine). A gRPC call's shard bodies cost 4.6 µs in all (`cargo bench -p
/// sieve-proxy --bench request_read`), an HTTP call's spliced ones 0.7 µs.
fn needs_escape(b: &[u8]) -> bool {
    sieve_shared::json_cursor::plain_prefix_len(b) < b.len()
}

/// An item's JSON (`Item`'s serde form: a string, or `{"id":…,"text":…}` without an absent
/// id) into the request's own bytes, after a comma unless it is the first thing past `head`.
fn own_item(own: &mut Vec<u8>, head: usize, item: &Item<'_>) -> Frag {
    if own.len() > head {
        own.push(b',');
    }
    let start = own.len();
    match item {
        Item::Text(t) => encode(own, t),
        Item::Object { id, text } => {
            own.push(b'{');
            if let Some(id) = id {
                own.extend_from_slice(b"\"id\":");
                encode(own, id);
                own.push(b',');
            }
            own.extend_from_slice(b"\"text\":");
            encode(own, text);
            own.push(b'}');
        }
    }
    Frag::Own(start..own.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sieve_shared::{ApiError, Item, ScoreRequest};

    /// The `ScoreRequest` a worker reads from the shard of `items`.
    fn shard_request(wire: &ShardWire, items: &[usize]) -> ScoreRequest<'static> {
        let body = wire.shard(items, 77).concat();
        serde_json::from_slice::<ScoreRequest>(&body).expect("a shard body is a ScoreRequest").into_owned()
    }

    fn check(wire: &ShardWire, whole: &ScoreRequest, items: &[usize]) {
        let shard = shard_request(wire, items);
        assert_eq!(shard.query, whole.query);
        assert_eq!(shard.instruction, whole.instruction);
        assert_eq!(shard.deadline_ms, Some(77));
        assert_eq!(shard.on_overload, None);
        assert_eq!(shard.items, items.iter().map(|&i| whole.items[i].clone()).collect::<Vec<Item>>());
    }

    #[test]
    fn every_deadline_fits_the_tail() {
        let body = Bytes::from_static(br#"{"query":"q","items":["a","b"]}"#);
        let req = ScoreRequest::parse(&body).unwrap();
        let wire = ShardWire::new(body.clone(), &req);
        for ms in [0, 1, 77, u64::MAX] {
            for items in [&[0, 1][..], &[1, 0][..]] {
                let shard = wire.shard(items, ms).concat();
                let r: ScoreRequest = serde_json::from_slice(&shard).unwrap();
                assert_eq!(r.deadline_ms, Some(ms));
            }
        }
    }

    #[test]
    fn plain_texts_are_spliced_and_the_rest_encoded_once() {
        let json = r#"{"items": ["plain", "esc\"aped \u00e9", {"id": "x", "text": "obj"}, {"text":"t\nn"}, "ünï"],
                       "query": "q \"1\"", "instruction": "be brief", "deadline_ms": 500, "on_overload": "partial"}"#;
        let body = Bytes::from(json);
        let req: ScoreRequest<'_> = ApiError::parse_json(&body).unwrap();
        let wire = ShardWire::new(body.clone(), &req);
        let whole = req.into_owned();
        for items in [vec![0, 1, 2, 3, 4], vec![4, 0], vec![2], vec![3, 1]] {
            check(&wire, &whole, &items);
        }
        // Escape-free strings (ASCII or not) are the body's bytes; escaped ones and objects are
        // encoded into the request's own bytes.
        let in_body: Vec<bool> = wire.items.iter().map(|f| matches!(f, Frag::Body(_))).collect();
        assert_eq!(in_body, [true, false, false, false, true]);
        assert_eq!(wire.item(0), br#""plain""#);
        // A run of consecutive spliced items is one slice of the body, uncopied.
        let body_json = r#"{"query": "q", "items": [ "a" ,"b",
            "c", "d\u00e9", "e"], "deadline_ms": 5}"#;
        let body = Bytes::from(body_json);
        let req: ScoreRequest<'_> = ApiError::parse_json(&body).unwrap();
        let wire = ShardWire::new(body.clone(), &req);
        let whole = req.into_owned();
        let chunks = wire.shard(&[0, 1, 2], 9);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[1].as_ptr(), body[body_json.find("\"a\"").unwrap()..].as_ptr());
        assert_eq!(&chunks[1][..], &b"\"a\" ,\"b\",\n            \"c\""[..]);
        // Not consecutive, or through an escaped item: copied into one buffer.
        for items in [vec![0, 2], vec![2, 3, 4], vec![1, 0]] {
            assert_eq!(wire.shard(&items, 9).len(), 1, "{items:?}");
            check(&wire, &whole, &items);
        }
        check(&wire, &whole, &[0, 1, 2]);
    }

    #[test]
    fn an_escape_is_found_at_any_position_and_nothing_else_is() {
        for len in 1..20 {
            for pos in 0..len {
                for bad in [0x00, 0x1f, b'"', b'\\'] {
                    let mut b = vec![b'a'; len];
                    b[pos] = bad;
                    assert!(needs_escape(&b), "{bad:#x} at {pos} of {len}");
                }
                for fine in [0x20, 0x7f, 0x80, 0xff, b'!', b'#', b'[', b']'] {
                    let mut b = vec![b'a'; len];
                    b[pos] = fine;
                    assert!(!needs_escape(&b), "{fine:#x} at {pos} of {len}");
                }
            }
        }
        assert!(!needs_escape("ünï 中文 ~".as_bytes()) && !needs_escape(b""));
    }

    /// Where item `i`'s encoding starts, past the head.
    fn own_start(wire: &ShardWire, i: usize) -> usize {
        match &wire.items[i] {
            Frag::Own(r) => r.start - wire.head,
            Frag::Body(_) => panic!("item {i} is in the body"),
        }
    }

    #[test]
    fn a_request_of_owned_strings_is_encoded() {
        let whole = ScoreRequest::new(
            "q",
            vec!["a\u{1}b".into(), Item::Object { id: Some("7".into()), text: "c".into() }, "d".into()],
        );
        let wire = ShardWire::new(Bytes::new(), &whole.clone());
        assert!(wire.items.iter().all(|f| matches!(f, Frag::Own(_))));
        check(&wire, &whole, &[2, 0, 1]);
        // Consecutive encoded items are one slice of the request's own bytes, uncopied.
        for items in [vec![0, 1, 2], vec![1, 2], vec![2]] {
            let chunks = wire.shard(&items, 9);
            assert_eq!(chunks.len(), 3, "{items:?}");
            assert_eq!(chunks[1].as_ptr(), wire.own[wire.head..].as_ptr().wrapping_add(own_start(&wire, items[0])));
            check(&wire, &whole, &items);
        }
        assert_eq!(wire.shard(&[0, 2], 9).len(), 1, "not consecutive: copied");
        check(&wire, &whole, &[0, 2]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any texts (quotes, backslashes, control characters, any script), sent in any JSON a
        /// client may write: every shard carries exactly its items.
        #[test]
        fn any_shard_carries_exactly_its_items(
            texts in prop::collection::vec(any::<String>(), 1..12),
            query in any::<String>(),
            pretty in any::<bool>(),
            pick in prop::collection::vec(any::<prop::sample::Index>(), 1..12),
        ) {
            let whole = ScoreRequest {
                instruction: Some("i".into()),
                ..ScoreRequest::new(query, texts.into_iter().map(Item::from).collect())
            };
            let json = if pretty { serde_json::to_vec_pretty(&whole) } else { serde_json::to_vec(&whole) };
            let body = Bytes::from(json.unwrap());
            let req: ScoreRequest<'_> = ApiError::parse_json(&body).unwrap();
            let wire = ShardWire::new(body.clone(), &req);
            let items: Vec<usize> = pick.iter().map(|p| p.index(whole.items.len())).collect();
            let shard = shard_request(&wire, &items);
            prop_assert_eq!(&shard.query, &whole.query);
            prop_assert_eq!(shard.items, items.iter().map(|&i| whole.items[i].clone()).collect::<Vec<Item>>());
        }

        /// The fast encoding of an item is byte for byte serde_json's, for any text and id
        /// (escape-free, or with quotes, backslashes, control characters, any script).
        #[test]
        fn an_encoded_item_is_serde_json_s_encoding(
            text in any::<String>(),
            plain in "[ -!#-\\[\\]-~é中]{0,40}",
            id in prop::option::of(any::<String>()),
        ) {
            for t in [text, plain] {
                let items = [Item::Text(Cow::Owned(t.clone())), Item::Object {
                    id: id.clone().map(Cow::Owned),
                    text: Cow::Owned(t),
                }];
                for item in items {
                    let mut own = b"xy".to_vec();
                    let Frag::Own(r) = own_item(&mut own, 2, &item) else { unreachable!("encoded") };
                    let serde = serde_json::to_vec(&item).unwrap();
                    prop_assert_eq!(&own[r], serde.as_slice());
                }
            }
        }
    }
}
