//! Arbitrary bytes through the protobuf decoding of every message quotad
//! receives or its client reads back.
//!
//! The server's codec (`quotad_proto::codec`) is prost's `Message::decode`
//! of the method's request type, with the error mapped to a status; this
//! target calls the same decode on the same generated types, then the
//! wire -> domain conversions of `quotad_proto::convert` on what decoded.
//! The server's own request conversion (`TryFrom` in `src/api/request.rs`)
//! is crate-private and is reached through the running server by
//! [`crate::server`].

use prost::Message;
use quotad_core::Decision;
use quotad_proto::convert;
use quotad_proto::envoy::service::ratelimit::v3 as rls;
use quotad_proto::v1 as pb;

/// Decodes `data` as each message type; checks what decodes.
pub fn run(data: &[u8]) {
    if let Some(request) = round_trip::<pb::CheckRequest>(data) {
        check_request(&request);
    }
    if let Some(batch) = round_trip::<pb::CheckBatchRequest>(data) {
        let _ = convert::batch_mode(batch.mode);
        batch.items.iter().for_each(check_request);
    }
    if let Some(reset) = round_trip::<pb::ResetRequest>(data)
        && let Some(pb::reset_request::Policy::InlinePolicy(policy)) = &reset.policy
    {
        let _ = convert::algorithm(policy.algorithm);
    }
    let _ = round_trip::<rls::RateLimitRequest>(data);
    // What the client decodes from the server.
    if let Some(response) = round_trip::<pb::CheckResponse>(data) {
        response.decision.iter().for_each(check_wire_decision);
    }
    if let Some(response) = round_trip::<pb::CheckBatchResponse>(data) {
        response.decisions.iter().for_each(check_wire_decision);
    }
    let _ = round_trip::<pb::ResetResponse>(data);
    let _ = round_trip::<rls::RateLimitResponse>(data);
}

/// Decodes `data` as `M`; when it decodes, the message must encode to
/// `encoded_len` bytes that decode to the same message.
pub fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) -> Option<M> {
    let message = M::decode(data).ok()?;
    let bytes = message.encode_to_vec();
    assert_eq!(bytes.len(), message.encoded_len(), "{message:?}");
    let again = M::decode(bytes.as_slice()).expect("a message prost encoded decodes");
    assert_eq!(again, message, "re-encoding changed the message");
    Some(message)
}

fn check_request(request: &pb::CheckRequest) {
    if let Some(pb::check_request::Policy::InlinePolicy(policy)) = &request.policy {
        let _ = convert::algorithm(policy.algorithm);
    }
}

/// A decision from the wire converts to the domain only with a known
/// reason, and back to the same wire decision but for the slot an acquire
/// item carries (`slot_id`, `slot_ttl_ms`), which the domain decision does
/// not: the service adds it from the slot it took.
fn check_wire_decision(wire: &pb::Decision) {
    match Decision::try_from(wire) {
        Ok(decision) => {
            let without_slot = pb::Decision {
                slot_id: String::new(),
                slot_ttl_ms: 0,
                ..wire.clone()
            };
            assert_eq!(pb::Decision::from(&decision), without_slot);
        }
        Err(_) => assert!(convert::reason(wire.reason).is_err()),
    }
}
