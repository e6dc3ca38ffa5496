//! The codec of every generated client and server in this crate: prost's
//! encoding, with the status a message that cannot be decoded deserves.
//!
//! tonic's own prost codec answers INTERNAL for any decode failure, as if
//! the server were broken. A request that is not valid protobuf, or whose
//! string field is not UTF-8, is the caller's error: this codec answers
//! INVALID_ARGUMENT naming what was wrong (prost names the message and the
//! field: `CheckRequest.key: invalid string value: data is not UTF-8
//! encoded`). A response that cannot be decoded stays INTERNAL for the
//! client that received it. Which side a message travels on is told by
//! [`Decoded`], implemented for each message of each RPC.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::ProstEncoder;

/// A message an RPC receives: the status its receiver answers when its
/// bytes cannot be decoded.
pub trait Decoded: prost::Message + Default + Send + 'static {
    /// INVALID_ARGUMENT for a request (the caller sent it), INTERNAL for a
    /// response (the server sent it).
    const UNDECODABLE: Code;
}

macro_rules! decoded {
    ($code:ident: $($message:path),+ $(,)?) => {
        $(impl Decoded for $message {
            const UNDECODABLE: Code = Code::$code;
        })+
    };
}

decoded!(InvalidArgument:
    crate::v1::CheckRequest,
    crate::v1::CheckBatchRequest,
    crate::v1::ResetRequest,
    crate::v1::LeaseRequest,
    crate::v1::AcquireRequest,
    crate::v1::SlotRequest,
    crate::v1::SetOverrideRequest,
    crate::v1::RemoveOverrideRequest,
    crate::v1::ListOverridesRequest,
    crate::v1::ExplainRequest,
    crate::envoy::service::ratelimit::v3::RateLimitRequest,
    crate::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
);
decoded!(Internal:
    crate::v1::CheckResponse,
    crate::v1::CheckBatchResponse,
    crate::v1::ResetResponse,
    crate::v1::LeaseResponse,
    crate::v1::AcquireResponse,
    crate::v1::RenewResponse,
    crate::v1::ReleaseResponse,
    crate::v1::SetOverrideResponse,
    crate::v1::RemoveOverrideResponse,
    crate::v1::ListOverridesResponse,
    crate::v1::ExplainResponse,
    crate::envoy::service::ratelimit::v3::RateLimitResponse,
    crate::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse,
);

/// prost encoding and decoding of `T` and `U`, with a decode failure
/// answered by `U`'s [`Decoded::UNDECODABLE`] status.
#[derive(Debug)]
pub struct QuotadCodec<T, U> {
    _messages: PhantomData<fn(T) -> U>,
}

impl<T, U> Default for QuotadCodec<T, U> {
    fn default() -> Self {
        QuotadCodec {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for QuotadCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: Decoded,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = QuotadDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        QuotadDecoder {
            _message: PhantomData,
        }
    }
}

/// Decodes `U` with prost; see [`QuotadCodec`].
#[derive(Debug)]
pub struct QuotadDecoder<U> {
    _message: PhantomData<fn() -> U>,
}

impl<U: Decoded> Decoder for QuotadDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode(buf).map(Some)
    }
}

/// Decodes one `U` from `buf`, or the status for bytes that are not one.
fn decode<U: Decoded>(buf: impl prost::bytes::Buf) -> Result<U, Status> {
    U::decode(buf).map_err(|error| Status::new(U::UNDECODABLE, error.to_string()))
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::v1;

    #[test]
    fn a_request_that_is_not_protobuf_is_the_callers_error() {
        let status = decode::<v1::CheckRequest>(&[0xff_u8, 0xff, 0xff][..]).expect_err("garbage");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("failed to decode Protobuf message"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_key_that_is_not_utf8_is_named() {
        // Field 1 (key), length 2, bytes that are not UTF-8.
        let status =
            decode::<v1::CheckRequest>(&[0x0a_u8, 0x02, 0xc3, 0x28][..]).expect_err("not UTF-8");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("CheckRequest.key") && status.message().contains("UTF-8"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_response_that_cannot_be_decoded_stays_internal() {
        let status = decode::<v1::CheckResponse>(&[0xff_u8, 0xff][..]).expect_err("garbage");
        assert_eq!(status.code(), Code::Internal);
    }

    #[test]
    fn valid_messages_decode_as_prost_does() {
        let request = v1::CheckRequest {
            key: "alice".to_owned(),
            cost: Some(3),
            policy: Some(v1::check_request::Policy::PolicyName("api".to_owned())),
        };
        let decoded =
            decode::<v1::CheckRequest>(request.encode_to_vec().as_slice()).expect("valid");
        assert_eq!(decoded, request);
    }
}
