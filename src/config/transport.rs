//! `[transport]`, validated: the bounds of every connection on either port.

use std::time::Duration;

use quotad_core::MAX_EXACT;
use quotad_proto::MAX_BATCH_ITEMS;

use super::policies::Invalid;
use super::settings::TransportSection;
use crate::policy::MAX_POLICY_NAME_LEN;

/// `[transport]`: what one connection, one call and one message may cost
/// the server. [`Default`] is the declared defaults, with the message
/// bound for the default `store.max_key_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportSettings {
    /// `transport.max_concurrent_streams`: calls in progress at once on one
    /// gRPC connection, advertised in the HTTP/2 SETTINGS frame.
    pub max_concurrent_streams: u32,
    /// `transport.max_pending_reset_streams`: streams a client may open and
    /// reset before they are accepted, before the connection is closed.
    pub max_pending_reset_streams: usize,
    /// `transport.max_connections`: open connections on each port.
    pub max_connections: usize,
    /// `transport.request_timeout`: the longest a gRPC call may run.
    pub request_timeout: Duration,
    /// `transport.max_message_bytes`, or its computed default: the largest
    /// gRPC request message.
    pub max_message_bytes: usize,
    /// `transport.admin_header_timeout`: the longest an admin HTTP client
    /// may take to send a request's headers.
    pub admin_header_timeout: Duration,
    /// `transport.handshake_timeout`: the longest a new connection may stay
    /// silent before its first byte.
    pub handshake_timeout: Duration,
    /// `transport.max_connection_age`: when a gRPC connection is asked to
    /// go away; `None` never.
    pub max_connection_age: Option<Duration>,
    /// `transport.drain_timeout`: the longest a shutdown waits for calls
    /// in flight.
    pub drain_timeout: Duration,
    /// `transport.max_in_flight`: gRPC calls in progress at once on the
    /// server before new ones are shed; 0 for no bound.
    pub max_in_flight: usize,
}

impl Default for TransportSettings {
    fn default() -> Self {
        super::Config::default().transport().clone()
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Invalid {
    (
        vec!["transport".to_owned(), field.to_owned()],
        message.into(),
    )
}

impl TransportSettings {
    /// Validates `[transport]`; `needed_message_bytes` is the largest valid
    /// request (a full batch at `store.max_key_bytes`).
    pub(super) fn validate(
        section: TransportSection,
        needed_message_bytes: usize,
    ) -> Result<Self, Invalid> {
        if section.max_concurrent_streams == 0 {
            return Err(invalid(
                "max_concurrent_streams",
                "max_concurrent_streams must be at least 1",
            ));
        }
        if section.max_pending_reset_streams == 0 {
            return Err(invalid(
                "max_pending_reset_streams",
                "max_pending_reset_streams must be at least 1",
            ));
        }
        if section.max_connections == 0 {
            return Err(invalid(
                "max_connections",
                "max_connections must be at least 1",
            ));
        }
        for (field, value) in [
            ("request_timeout", section.request_timeout),
            ("admin_header_timeout", section.admin_header_timeout),
            ("handshake_timeout", section.handshake_timeout),
            ("drain_timeout", section.drain_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(field, format!("{field} must be longer than zero")));
            }
        }
        let max_message_bytes = match section.max_message_bytes {
            None => needed_message_bytes,
            Some(bytes) if bytes < needed_message_bytes => {
                return Err(invalid(
                    "max_message_bytes",
                    format!(
                        "must be at least {needed_message_bytes} bytes, the largest valid request (a CheckBatch of {MAX_BATCH_ITEMS} items at store.max_key_bytes); got {bytes}"
                    ),
                ));
            }
            Some(bytes) => bytes,
        };
        Ok(TransportSettings {
            max_concurrent_streams: section.max_concurrent_streams,
            max_pending_reset_streams: section.max_pending_reset_streams,
            max_connections: section.max_connections,
            request_timeout: section.request_timeout,
            max_message_bytes,
            admin_header_timeout: section.admin_header_timeout,
            handshake_timeout: section.handshake_timeout,
            max_connection_age: (!section.max_connection_age.is_zero())
                .then_some(section.max_connection_age),
            drain_timeout: section.drain_timeout,
            max_in_flight: section.max_in_flight,
        })
    }
}

/// The encoded size of the largest valid request: a `CheckBatch` of
/// [`MAX_BATCH_ITEMS`] items, each with a key of `max_key_bytes`, a cost of
/// 2^53 and a policy name of [`MAX_POLICY_NAME_LEN`] characters (longer
/// than any inline policy), in batch mode `ALL_OR_NOTHING`.
///
/// The default of `transport.max_message_bytes`, so that a server never
/// refuses a request it would have served.
pub fn largest_request_bytes(max_key_bytes: usize) -> usize {
    // A length-delimited field: tag, length, bytes. Every field number is
    // below 16, so each tag is one byte.
    let delimited = |len: usize| 1 + varint_len(len as u64) + len;
    let number = |value: u64| 1 + varint_len(value);
    let name = delimited(MAX_POLICY_NAME_LEN);
    // algorithm (an enum below 128), limit, window_ms and burst (each at most
    // 2^53).
    let inline = delimited(number(5) + 3 * number(MAX_EXACT));
    let item = delimited(max_key_bytes) + number(MAX_EXACT) + name.max(inline);
    MAX_BATCH_ITEMS * delimited(item) + number(1)
}

/// The bytes of `value` as a protobuf varint.
fn varint_len(value: u64) -> usize {
    let bits = 64 - value.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use quotad_proto::v1 as pb;

    use super::*;
    use crate::Config;

    fn error(text: &str) -> String {
        Config::from_toml(text).expect_err(text).to_string()
    }

    #[test]
    fn the_message_bound_follows_the_longest_key_unless_set() {
        let config = Config::default();
        assert_eq!(
            config.transport().max_message_bytes,
            largest_request_bytes(256)
        );
        let longer = Config::from_toml("[store]\nmax_key_bytes = 1024\n").expect("valid");
        assert_eq!(
            longer.transport().max_message_bytes,
            largest_request_bytes(1024)
        );
        let set = Config::from_toml("[transport]\nmax_message_bytes = 4_000_000\n").expect("valid");
        assert_eq!(set.transport().max_message_bytes, 4_000_000);
        assert_eq!(
            error("[transport]\nmax_message_bytes = 1000\n"),
            "transport.max_message_bytes: must be at least 337002 bytes, the largest valid request (a CheckBatch of 1000 items at store.max_key_bytes); got 1000 (line 2)"
        );
    }

    #[test]
    fn zero_bounds_are_refused_naming_the_field() {
        for (text, field) in [
            (
                "max_concurrent_streams = 0",
                "transport.max_concurrent_streams",
            ),
            (
                "max_pending_reset_streams = 0",
                "transport.max_pending_reset_streams",
            ),
            ("max_connections = 0", "transport.max_connections"),
            ("request_timeout = \"0s\"", "transport.request_timeout"),
            (
                "admin_header_timeout = \"0s\"",
                "transport.admin_header_timeout",
            ),
        ] {
            let message = error(&format!("[transport]\n{text}\n"));
            assert!(message.starts_with(field), "{message}");
        }
    }

    fn largest_batch(key_bytes: usize, policy: pb::check_request::Policy) -> pb::CheckBatchRequest {
        let item = pb::CheckRequest {
            key: "k".repeat(key_bytes),
            cost: Some(MAX_EXACT),
            policy: Some(policy),
        };
        pb::CheckBatchRequest {
            items: vec![item; MAX_BATCH_ITEMS],
            mode: pb::BatchMode::AllOrNothing.into(),
        }
    }

    #[test]
    fn the_largest_request_is_a_full_batch_of_the_longest_keys_and_names() {
        for key_bytes in [1, 127, 128, 256, 16_383, 16_384, 100_000] {
            let named = largest_batch(
                key_bytes,
                pb::check_request::Policy::PolicyName("p".repeat(MAX_POLICY_NAME_LEN)),
            );
            assert_eq!(
                named.encoded_len(),
                largest_request_bytes(key_bytes),
                "{key_bytes}-byte keys"
            );
            let inline = largest_batch(
                key_bytes,
                pb::check_request::Policy::InlinePolicy(pb::Policy {
                    algorithm: pb::Algorithm::SlidingLog.into(),
                    limit: MAX_EXACT,
                    window_ms: MAX_EXACT,
                    burst: Some(MAX_EXACT),
                    ..Default::default()
                }),
            );
            assert!(inline.encoded_len() <= largest_request_bytes(key_bytes));
        }
        // The default store.max_key_bytes.
        assert_eq!(largest_request_bytes(256), 337_002);
    }

    #[test]
    fn varints_take_seven_bits_a_byte() {
        for (value, len) in [(0, 1), (127, 1), (128, 2), (MAX_EXACT, 8), (u64::MAX, 10)] {
            assert_eq!(varint_len(value), len, "{value}");
        }
    }
}
