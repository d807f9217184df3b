//! `Score`'s request read in place, as the HTTP path parses its JSON: the message stays the
//! bytes it came in (tonic's decode buffer, uncopied) and the query and item texts are `&str`s
//! into it, where prost would allocate and copy a `String` per text. The rest of a call then
//! runs on [`ScoreRequestRef`], as `POST /v1/score` does.
//!
//! The reader follows protobuf's rules for `sieve.v1.ScoreRequest` (`proto/sieve.proto`): fields
//! in any order, the last value of a singular field wins, unknown fields skipped, a known field
//! with the wrong wire type refused; strings must be UTF-8. A message it cannot read is the
//! caller's error: INVALID_ARGUMENT naming what is wrong (not prost's INTERNAL).
//!
//! Safety for the proxy: texts read here are raw strings, not JSON. They are handed on with an
//! empty body (`api.rs`), so the proxy never takes one for a JSON literal of the body: it
//! encodes each one for its shards.

use std::borrow::Cow;

use bytes::{Buf as _, Bytes};
use sieve_shared::api::{ItemRef, OnOverload, ScoreRequestRef};
use sieve_shared::ApiError;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;

use super::pb;

/// A unary call's codec: the request as its raw bytes (read by its handler: `Score` in place,
/// `Rerank` decoded by `api.rs`, so that a malformed message is INVALID_ARGUMENT), the answer `T`
/// encoded by prost.
pub(super) struct RawCodec<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Default for RawCodec<T> {
    fn default() -> Self {
        RawCodec(std::marker::PhantomData)
    }
}

impl<T: prost::Message + Send + 'static> Codec for RawCodec<T> {
    type Encode = T;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

pub(super) type RawScoreCodec = RawCodec<pb::ScoreResponse>;
pub(super) type RawRerankCodec = RawCodec<pb::RerankResponse>;

/// The message's bytes, split off tonic's decode buffer (no copy).
#[derive(Debug, Clone, Copy)]
pub(super) struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = buf.remaining();
        Ok(Some(buf.copy_to_bytes(n)))
    }
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// A cursor over one message (or an embedded one).
struct Reader<'a> {
    buf: &'a [u8],
    /// Which message this is, for errors.
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> ApiError {
        ApiError::malformed(format!("the {} message is not valid protobuf: {msg}", self.what))
    }

    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some((&b, rest)) = self.buf.split_first() else {
                return Err(self.err("it ends inside a varint"));
            };
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("a varint is longer than 10 bytes"))
    }

    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, ApiError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let k = self.varint()?;
        let (field, wire) = (k >> 3, (k & 7) as u8);
        if field == 0 {
            return Err(self.err("field number 0"));
        }
        Ok(Some((field, wire)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ApiError> {
        if n > self.buf.len() {
            return Err(self.err(format!("a field of {n} bytes runs past the end")));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], ApiError> {
        let n = self.varint()?;
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn string(&mut self, name: &str) -> Result<&'a str, ApiError> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| self.err(format!("{name} is not UTF-8")))
    }

    /// Skips an unknown field's value.
    fn skip(&mut self, wire: u8) -> Result<(), ApiError> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            FIXED32 => self.take(4).map(drop),
            w => Err(self.err(format!("wire type {w} (groups are not used by this API)"))),
        }
    }

    /// Refuses a known field sent with another wire type than its own.
    fn want_wire(&self, name: &str, wire: u8, want: u8) -> Result<(), ApiError> {
        if wire == want {
            Ok(())
        } else {
            Err(self.err(format!("{name} has wire type {wire}, not {want}")))
        }
    }
}

/// `ScoreRequest` read from `msg` in place. `on_overload` is checked as the JSON's is (an
/// unknown value is INVALID_ARGUMENT naming the values).
pub(super) fn score_request(msg: &[u8]) -> Result<ScoreRequestRef<'_>, ApiError> {
    let mut r = Reader { buf: msg, what: "ScoreRequest" };
    let mut req = ScoreRequestRef {
        query: Cow::Borrowed(""),
        items: Vec::new(),
        instruction: None,
        deadline_ms: None,
        on_overload: None,
        cache: None,
        max_item_tokens: None,
        truncation_direction: None,
        model: None,
    };
    let mut on_overload = 0i32;
    let mut left = false;
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => {
                r.want_wire("query", wire, LEN)?;
                req.query = Cow::Borrowed(r.string("query")?);
            }
            2 => {
                r.want_wire("items", wire, LEN)?;
                let item = r.bytes()?;
                req.items.push(self::item(item)?);
            }
            3 => {
                r.want_wire("instruction", wire, LEN)?;
                req.instruction = Some(Cow::Borrowed(r.string("instruction")?));
            }
            4 => {
                r.want_wire("deadline_ms", wire, VARINT)?;
                req.deadline_ms = Some(r.varint()?);
            }
            5 => {
                r.want_wire("on_overload", wire, VARINT)?;
                // An enum is an int32 on the wire: its low 32 bits, as prost reads it.
                on_overload = r.varint()? as i32;
            }
            6 => {
                r.want_wire("cache", wire, VARINT)?;
                req.cache = Some(r.varint()? != 0);
            }
            7 => {
                r.want_wire("max_item_tokens", wire, VARINT)?;
                // A uint32 is its varint's low 32 bits, as prost reads it.
                req.max_item_tokens = Some(r.varint()? as u32);
            }
            8 => {
                r.want_wire("truncate_left", wire, VARINT)?;
                left = r.varint()? != 0;
            }
            _ => r.skip(wire)?,
        }
    }
    req.truncation_direction = super::convert::direction(req.max_item_tokens, left);
    req.on_overload = match pb::OnOverload::try_from(on_overload) {
        Ok(pb::OnOverload::Unspecified) => None,
        Ok(pb::OnOverload::Reject) => Some(OnOverload::Reject),
        Ok(pb::OnOverload::Partial) => Some(OnOverload::Partial),
        Err(_) => {
            return Err(ApiError::invalid(format!(
                "on_overload {on_overload} is not one of ON_OVERLOAD_UNSPECIFIED (0), ON_OVERLOAD_REJECT (1), ON_OVERLOAD_PARTIAL (2)"
            )))
        }
    };
    Ok(req)
}

/// One `Item`: a bare text without an id, the object form with one (as `convert::item`).
fn item(msg: &[u8]) -> Result<ItemRef<'_>, ApiError> {
    let mut r = Reader { buf: msg, what: "Item" };
    let (mut text, mut id) = ("", None);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => {
                r.want_wire("text", wire, LEN)?;
                text = r.string("text")?;
            }
            2 => {
                r.want_wire("id", wire, LEN)?;
                id = Some(r.string("id")?);
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(match id {
        Some(id) => ItemRef::Object { id: Some(Cow::Borrowed(id)), text: Cow::Borrowed(text) },
        None => ItemRef::Text(Cow::Borrowed(text)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn encode(m: &pb::ScoreRequest) -> Vec<u8> {
        m.encode_to_vec()
    }

    /// Whatever prost encodes, read in place, is what the owned conversion gives.
    #[test]
    fn reads_what_prost_writes_as_the_owned_conversion_does() {
        let m = pb::ScoreRequest {
            query: "trail shoes \"waterproof\"".into(),
            items: vec![
                pb::Item { text: "a shoe".into(), id: None },
                pb::Item { text: "é\n\u{1F600}".into(), id: Some("sku-1".into()) },
                pb::Item { text: String::new(), id: Some(String::new()) },
            ],
            instruction: Some("rank".into()),
            deadline_ms: Some(250),
            on_overload: pb::OnOverload::Partial as i32,
            cache: Some(false),
            max_item_tokens: Some(12),
            truncate_left: true,
        };
        let bytes = encode(&m);
        let got = score_request(&bytes).unwrap();
        let want = super::super::convert::score_request(m).unwrap();
        assert_eq!(got.clone().into_owned(), want);
        assert!(matches!(got.query, Cow::Borrowed(_)), "borrowed, not copied");
        // Defaults: an empty message is an empty query and no items, every option absent.
        let empty = score_request(&[]).unwrap();
        assert_eq!(empty.into_owned(), super::super::convert::score_request(Default::default()).unwrap());
    }

    #[test]
    fn unknown_fields_are_skipped_and_the_last_value_wins() {
        let mut bytes = encode(&pb::ScoreRequest { query: "first".into(), ..Default::default() });
        // Field 9 as a varint, a fixed64, a length-delimited and a fixed32 value.
        bytes.extend_from_slice(&[9 << 3, 0x96, 0x01, (9 << 3) | 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[(9 << 3) | 2, 2, b'x', b'y', (9 << 3) | 5, 1, 2, 3, 4]);
        bytes.extend(encode(&pb::ScoreRequest { query: "second".into(), ..Default::default() }));
        assert_eq!(score_request(&bytes).unwrap().query, "second");
    }

    #[test]
    fn a_bad_message_is_invalid_argument_saying_what_is_wrong() {
        let good = encode(&pb::ScoreRequest {
            query: "q".into(),
            items: vec![pb::Item { text: "t".into(), id: None }],
            ..Default::default()
        });
        for (bytes, says) in [
            (good[..good.len() - 1].to_vec(), "runs past the end"),
            (vec![0x0a, 0x80], "ends inside a varint"),
            (vec![0x0a, 2, 0xff, 0xfe], "query is not UTF-8"),
            (vec![0x12, 3, 0x0a, 1, 0xff], "text is not UTF-8"),
            (vec![0x08, 1], "query has wire type 0, not 2"),
            (vec![0x22, 0], "deadline_ms has wire type 2, not 0"),
            (vec![0x00], "field number 0"),
            (vec![(9 << 3) | 3], "wire type 3"),
            ([0x20].into_iter().chain([0xff; 11]).collect(), "longer than 10 bytes"),
        ] {
            let e = score_request(&bytes).unwrap_err();
            assert_eq!(e.status(), 400, "{says}: {e}");
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
        let e = score_request(&[0x28, 7]).unwrap_err();
        assert!(e.message.contains("on_overload 7"), "{}", e.message);
    }
}
