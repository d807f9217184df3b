//! A unary call's codec that hands the handler its request message as raw bytes: `api.rs`
//! decodes it with prost, so a message that is not valid protobuf is the caller's error
//! (INVALID_ARGUMENT naming what is wrong), where tonic's generated route answers INTERNAL
//! before the call is seen.

use bytes::{Buf as _, Bytes};
use sieve_shared::ApiError;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;

use super::pb;

/// The request as its raw bytes, the answer `T` encoded by prost.
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

/// `msg` decoded as the message `M` (named `what` in the error): a message that does not decode
/// is INVALID_ARGUMENT with prost's account of what is wrong (which field, and why).
pub(super) fn decode<M: prost::Message + Default>(msg: impl bytes::Buf, what: &str) -> Result<M, ApiError> {
    M::decode(msg).map_err(|e| ApiError::malformed(format!("the {what} message does not decode: {e}")))
}
