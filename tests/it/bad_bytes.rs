//! Bytes that are not a valid request, sent raw on a gRPC channel: the
//! caller's error (INVALID_ARGUMENT naming what was wrong), or, past the
//! size bound, RESOURCE_EXHAUSTED. Nothing reaches the store either way.

use crate::common::{TestServer, named, peek};
use prost::Message as _;
use prost::bytes::{Buf as _, BufMut as _};
use quotad::Config;
use quotad_core::MAX_EXACT;
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::v1 as pb;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A codec that sends the bytes it is given as the message, and returns
/// the response's bytes undecoded.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Sends `bytes` as the request of `method` (`Check`, `CheckBatch`, ...).
async fn send(channel: &Channel, method: &'static str, bytes: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("the channel is ready");
    let path =
        http::uri::PathAndQuery::try_from(format!("/quotad.v1.Quota/{method}")).expect("a path");
    grpc.unary(tonic::Request::new(bytes), path, Raw)
        .await
        .map(tonic::Response::into_inner)
}

/// A policy whose name has the longest length allowed, so that the largest
/// valid batch can be sent.
fn long_name() -> String {
    "p".repeat(quotad::policy::MAX_POLICY_NAME_LEN)
}

async fn start() -> TestServer {
    let toml = format!(
        "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n\n\
         [policies.{}]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n",
        long_name()
    );
    TestServer::start(Config::from_toml(&toml).expect("valid config")).await
}

#[tokio::test]
async fn bytes_that_are_not_protobuf_are_invalid_argument() {
    let server = start().await;
    let channel = server.channel().await;
    for method in ["Check", "CheckBatch", "Peek", "Reset"] {
        let status = send(&channel, method, vec![0xff, 0xff, 0xff])
            .await
            .expect_err("garbage is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        assert!(
            status
                .message()
                .contains("failed to decode Protobuf message"),
            "{method}: {}",
            status.message()
        );
    }
}

#[tokio::test]
async fn a_key_that_is_not_utf8_is_invalid_argument_naming_the_field() {
    let server = start().await;
    let channel = server.channel().await;
    let mut check = named("k", "api", None).encode_to_vec();
    // The key is the first field: tag, length 1, then the key's byte.
    assert_eq!(&check[..3], &[0x0a, 0x01, b'k']);
    check[2] = 0xff;
    let status = send(&channel, "Check", check.clone())
        .await
        .expect_err("not UTF-8");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("CheckRequest.key") && status.message().contains("UTF-8"),
        "{}",
        status.message()
    );

    // Inside a batch, the path names the items field too.
    let mut batch = vec![0x0a, u8::try_from(check.len()).expect("short")];
    batch.extend_from_slice(&check);
    let status = send(&channel, "CheckBatch", batch)
        .await
        .expect_err("not UTF-8");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("CheckBatchRequest.items")
            && status.message().contains("CheckRequest.key"),
        "{}",
        status.message()
    );

    // Nothing was counted.
    let mut client = server.client().await;
    assert_eq!(
        peek(&mut client, named("k", "api", None)).await.remaining,
        10
    );
}

#[tokio::test]
async fn the_largest_valid_batch_is_served_and_one_byte_more_is_resource_exhausted() {
    let server = start().await;
    let channel = server.channel().await;
    let item = pb::CheckRequest {
        key: "k".repeat(256),
        cost: Some(MAX_EXACT),
        policy: Some(pb::check_request::Policy::PolicyName(long_name())),
    };
    let largest = pb::CheckBatchRequest {
        items: vec![item; MAX_BATCH_ITEMS],
        mode: pb::BatchMode::AllOrNothing.into(),
    }
    .encode_to_vec();
    assert_eq!(largest.len(), quotad::config::largest_request_bytes(256));
    let answer = send(&channel, "CheckBatch", largest.clone())
        .await
        .expect("the largest valid request is served");
    let decisions = pb::CheckBatchResponse::decode(answer.as_slice()).expect("a response");
    assert_eq!(decisions.decisions.len(), MAX_BATCH_ITEMS);
    assert!(
        decisions
            .decisions
            .iter()
            .all(|d| d.reason == pb::Reason::CostExceedsCapacity as i32)
    );

    let mut larger = largest;
    larger.push(0);
    let status = send(&channel, "CheckBatch", larger)
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}
