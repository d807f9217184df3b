//! The call's gRPC deadline as its request deadline. A gRPC client sends what is left of its
//! deadline in `grpc-timeout` (at most 8 digits and a unit: H, M, S, m, u, n); past it the
//! client has given up, so the call's own `deadline_ms` must end a little earlier
//! (`[grpc] deadline_margin_ms`) for a partial answer to reach it.

use std::time::Duration;

use tonic::metadata::MetadataMap;

use sieve_shared::{ApiError, Limits};

const HEADER: &str = "grpc-timeout";

/// Parses a `grpc-timeout` value; `None` when it is not one.
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The deadline in ms the call's `grpc-timeout` gives (less the margin, at least 1 ms, at most
/// `max_deadline_ms`: a client's generous deadline is not an error); `None` without the header;
/// an error naming the header when it is not a valid timeout.
pub(super) fn from_metadata(meta: &MetadataMap, margin: Duration, limits: &Limits) -> Result<Option<u64>, ApiError> {
    let Some(v) = meta.get(HEADER) else { return Ok(None) };
    let t = v.to_str().ok().and_then(parse_grpc_timeout).ok_or_else(|| {
        ApiError::invalid(format!(
            "{HEADER} {:?} is not a gRPC timeout (digits and a unit)",
            String::from_utf8_lossy(v.as_bytes())
        ))
    })?;
    let ms = t.saturating_sub(margin).as_millis();
    Ok(Some(u64::try_from(ms).unwrap_or(u64::MAX).clamp(1, limits.max_deadline_ms.max(1))))
}

/// The deadline the call runs under: the message's, the gRPC one, or the earlier of the two.
pub(super) fn effective(message: Option<u64>, grpc: Option<u64>) -> Option<u64> {
    match (message, grpc) {
        (Some(m), Some(g)) => Some(m.min(g)),
        (m, g) => m.or(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(v: &'static str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(HEADER, v.parse().unwrap());
        m
    }

    #[test]
    fn every_unit_parses_and_junk_does_not() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1M"), Some(Duration::from_secs(60)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("1500u"), Some(Duration::from_micros(1500)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "10", "10x", "123456789m", "-1m", "1.5S", " 1m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_header_less_the_margin_within_the_limits() {
        let l = Limits { max_deadline_ms: 10_000, ..Limits::default() };
        let margin = Duration::from_millis(5);
        assert_eq!(from_metadata(&MetadataMap::new(), margin, &l), Ok(None));
        assert_eq!(from_metadata(&meta("300m"), margin, &l), Ok(Some(295)));
        assert_eq!(from_metadata(&meta("2u"), margin, &l), Ok(Some(1)), "never zero");
        assert_eq!(from_metadata(&meta("1H"), margin, &l), Ok(Some(10_000)), "clamped, not refused");
        let e = from_metadata(&meta("soon"), margin, &l).unwrap_err();
        assert_eq!(e.status(), 422);
        assert!(e.message.contains("grpc-timeout") && e.message.contains("soon"), "{}", e.message);
        assert_eq!(effective(Some(100), Some(50)), Some(50));
        assert_eq!(effective(Some(100), None), Some(100));
        assert_eq!(effective(None, Some(50)), Some(50));
        assert_eq!(effective(None, None), None);
    }
}
