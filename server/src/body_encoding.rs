//! Compressed request bodies: `Content-Encoding: gzip` or `zstd` is decoded after the body is
//! read (its compressed bytes bounded by `max_body_bytes` as any body), with the same limit on
//! the DECODED bytes: decoding stops at `max_body_bytes` and answers 413, so a small body that
//! decodes to gigabytes (a zip bomb) costs at most the limit. The decoded bytes count against
//! the process's byte budget as they are produced (503 past it, as for any body). Another
//! encoding is 415, naming the ones served.

use std::io::Read;

use bytes::Bytes;
use hyper::header::{HeaderMap, CONTENT_ENCODING};
use sieve_shared::{ApiError, ErrorKind};

use crate::http::Reservation;

/// A body encoding the API decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    Zstd,
}

/// The request's `Content-Encoding`: `None` for none or `identity`; 415 for any other than gzip
/// and zstd (or for several stacked).
pub fn of(headers: &HeaderMap) -> Result<Option<Encoding>, ApiError> {
    let Some(v) = headers.get(CONTENT_ENCODING) else { return Ok(None) };
    let text = String::from_utf8_lossy(v.as_bytes()).trim().to_ascii_lowercase();
    match text.as_str() {
        "" | "identity" => Ok(None),
        "gzip" | "x-gzip" => Ok(Some(Encoding::Gzip)),
        "zstd" => Ok(Some(Encoding::Zstd)),
        other => Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            format!("Content-Encoding {other:?} is not supported: send the body uncompressed, gzip or zstd"),
        )),
    }
}

/// How much is decoded at a time (and so the most the budget is asked for past the bytes held).
const CHUNK: usize = 64 << 10;

/// `raw` decoded: at most `max` bytes (413 past it), each growth of the buffer counted in
/// `held` first (503 when the budget cannot cover it), 400 when `raw` is not valid `encoding`.
pub fn decode(encoding: Encoding, raw: &[u8], max: usize, held: &mut Reservation) -> Result<Bytes, ApiError> {
    let name = match encoding {
        Encoding::Gzip => "gzip",
        Encoding::Zstd => "zstd",
    };
    let bad = |e: std::io::Error| ApiError::malformed(format!("the request body is not valid {name}: {e}"));
    let mut reader: Box<dyn Read + '_> = match encoding {
        // Several gzip members one after the other are one body (RFC 1952).
        Encoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
        Encoding::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(raw).map_err(bad)?),
    };
    let mut out: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK.min(max.saturating_add(1)).max(1)];
    loop {
        let n = reader.read(&mut chunk).map_err(bad)?;
        if n == 0 {
            return Ok(Bytes::from(out));
        }
        if out.len() + n > max {
            return Err(ApiError::too_large(format!(
                "request body decodes ({name}) to more than max_body_bytes {max}: send fewer or shorter items"
            )));
        }
        out.reserve(n);
        // The compressed bytes are still held: both count until the answer.
        let total = raw.len() + out.capacity();
        if !held.grow_to(total) {
            return Err(held.budget().refusal(ErrorKind::NotReady, total.saturating_sub(held.bytes()), total));
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use hyper::header::HeaderValue;

    use super::*;
    use crate::http::ByteBudget;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn headers(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_ENCODING, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn gzip_and_zstd_are_read_other_encodings_are_415() {
        assert_eq!(of(&HeaderMap::new()).unwrap(), None);
        assert_eq!(of(&headers("identity")).unwrap(), None);
        assert_eq!(of(&headers("GZIP")).unwrap(), Some(Encoding::Gzip));
        assert_eq!(of(&headers("zstd")).unwrap(), Some(Encoding::Zstd));
        for other in ["br", "deflate", "gzip, zstd"] {
            let e = of(&headers(other)).unwrap_err();
            assert_eq!(e.status(), 415, "{other}");
            assert!(e.message.contains("gzip or zstd"), "{}", e.message);
        }
    }

    #[test]
    fn a_body_decodes_to_its_bytes_in_either_encoding() {
        let body = br#"{"query":"q","items":["a","b"]}"#.repeat(100);
        let budget = ByteBudget::new(1 << 20);
        let mut held = budget.reservation();
        assert_eq!(decode(Encoding::Gzip, &gzip(&body), 1 << 20, &mut held).unwrap(), Bytes::from(body.clone()));
        let z = zstd::encode_all(&body[..], 3).unwrap();
        assert_eq!(decode(Encoding::Zstd, &z, 1 << 20, &mut held).unwrap(), Bytes::from(body));
        assert!(held.bytes() > 0, "the decoded bytes are counted");
        let e = decode(Encoding::Gzip, b"not gzip", 1 << 20, &mut budget.reservation()).unwrap_err();
        assert_eq!(e.status(), 400, "{}", e.message);
        assert!(e.message.contains("not valid gzip"), "{}", e.message);
    }

    #[test]
    fn a_zip_bomb_is_413_at_the_limit_not_its_size() {
        // 64 MiB of zeros: ~64 KiB compressed.
        let bomb = gzip(&vec![0u8; 64 << 20]);
        assert!(bomb.len() < 1 << 20);
        let budget = ByteBudget::new(64 << 20);
        let mut held = budget.reservation();
        let e = decode(Encoding::Gzip, &bomb, 1 << 20, &mut held).unwrap_err();
        assert_eq!(e.status(), 413, "{}", e.message);
        assert!(e.message.contains("max_body_bytes 1048576"), "{}", e.message);
        assert!(held.bytes() <= bomb.len() + (2 << 20), "held {} bytes", held.bytes());
        // A budget too small for the decoded body: 503, as for any body.
        let small = ByteBudget::new(100 << 10);
        let e = decode(Encoding::Gzip, &gzip(&vec![b'x'; 1 << 20]), 4 << 20, &mut small.reservation()).unwrap_err();
        assert_eq!(e.status(), 503, "{}", e.message);
    }
}
