//! Envoy's RLS v3 messages keep Envoy's wire format: the bytes below are
//! written out by hand from the field numbers and wire types of Envoy's
//! protos, so a renumbered or retyped field fails here.

use prost::Message as _;
use quotad_proto::envoy::config::core::v3::HeaderValue;
use quotad_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use quotad_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use quotad_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use quotad_proto::envoy::r#type::v3::RateLimitUnit;

/// A length-delimited field (wire type 2) with a one-byte tag and length.
fn delimited(tag: u8, body: &[u8]) -> Vec<u8> {
    let len = u8::try_from(body.len()).expect("test bodies are short");
    [&[tag, len][..], body].concat()
}

#[test]
fn a_request_encodes_to_envoys_bytes_and_back() {
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".to_owned(),
                value: "10.0.0.1".to_owned(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 10,
                unit: RateLimitUnit::Minute.into(),
            }),
            // A wrapper set to zero is present: an empty message on the wire.
            hits_addend: Some(0),
        }],
        hits_addend: 3,
    };

    // Entry { key = 1, value = 2 }
    let entry = [
        delimited(0x0a, b"remote_address"),
        delimited(0x12, b"10.0.0.1"),
    ]
    .concat();
    // RateLimitOverride { requests_per_unit = 1 (varint), unit = 2 (varint) }
    let limit = [0x08, 10, 0x10, 2];
    // RateLimitDescriptor { entries = 1, limit = 2, hits_addend = 3 (UInt64Value) }
    let descriptor = [
        delimited(0x0a, &entry),
        delimited(0x12, &limit),
        delimited(0x1a, &[]),
    ]
    .concat();
    // RateLimitRequest { domain = 1, descriptors = 2, hits_addend = 3 (varint) }
    let expected = [
        delimited(0x0a, b"edge"),
        delimited(0x12, &descriptor),
        vec![0x18, 3],
    ]
    .concat();

    assert_eq!(request.encode_to_vec(), expected);
    let decoded = RateLimitRequest::decode(expected.as_slice()).expect("valid bytes");
    assert_eq!(decoded, request);
}

#[test]
fn a_descriptor_hits_addend_distinguishes_absent_zero_and_a_value() {
    let decode = |bytes: &[u8]| {
        RateLimitDescriptor::decode(bytes)
            .expect("valid bytes")
            .hits_addend
    };
    assert_eq!(decode(&[]), None);
    assert_eq!(decode(&[0x1a, 0x00]), Some(0));
    assert_eq!(decode(&[0x1a, 0x02, 0x08, 5]), Some(5));
}

#[test]
fn a_response_encodes_to_envoys_bytes_and_back() {
    let response = RateLimitResponse {
        overall_code: Code::OverLimit.into(),
        statuses: vec![DescriptorStatus {
            code: Code::OverLimit.into(),
            current_limit: Some(RateLimit {
                name: "per_ip".to_owned(),
                requests_per_unit: 10,
                unit: Unit::Week.into(),
            }),
            limit_remaining: 0,
            duration_until_reset: Some(prost_types::Duration {
                seconds: 42,
                nanos: 0,
            }),
            quota: None,
        }],
        response_headers_to_add: vec![HeaderValue {
            key: "RateLimit-Limit".to_owned(),
            value: "10".to_owned(),
            raw_value: Vec::new(),
        }],
        ..RateLimitResponse::default()
    };

    // RateLimit { requests_per_unit = 1, unit = 2 (WEEK is 7), name = 3 }
    let current_limit = [vec![0x08, 10, 0x10, 7], delimited(0x1a, b"per_ip")].concat();
    // DescriptorStatus { code = 1, current_limit = 2, limit_remaining = 3
    // (zero, so absent), duration_until_reset = 4 (Duration { seconds = 1 }) }
    let status = [
        vec![0x08, 2],
        delimited(0x12, &current_limit),
        delimited(0x22, &[0x08, 42]),
    ]
    .concat();
    // HeaderValue { key = 1, value = 2 }
    let header = [delimited(0x0a, b"RateLimit-Limit"), delimited(0x12, b"10")].concat();
    // RateLimitResponse { overall_code = 1, statuses = 2, response_headers_to_add = 3 }
    let expected = [
        vec![0x08, 2],
        delimited(0x12, &status),
        delimited(0x1a, &header),
    ]
    .concat();

    assert_eq!(response.encode_to_vec(), expected);
    let decoded = RateLimitResponse::decode(expected.as_slice()).expect("valid bytes");
    assert_eq!(decoded, response);
}

#[test]
fn unit_enums_keep_envoys_numbers() {
    let units = [
        (Unit::Unknown, 0),
        (Unit::Second, 1),
        (Unit::Minute, 2),
        (Unit::Hour, 3),
        (Unit::Day, 4),
        (Unit::Month, 5),
        (Unit::Year, 6),
        (Unit::Week, 7),
    ];
    for (unit, number) in units {
        assert_eq!(unit as i32, number, "{unit:?}");
    }
    let override_units = [
        (RateLimitUnit::Unknown, 0),
        (RateLimitUnit::Second, 1),
        (RateLimitUnit::Minute, 2),
        (RateLimitUnit::Hour, 3),
        (RateLimitUnit::Day, 4),
        (RateLimitUnit::Month, 5),
        (RateLimitUnit::Year, 6),
    ];
    for (unit, number) in override_units {
        assert_eq!(unit as i32, number, "{unit:?}");
    }
}

#[test]
fn the_descriptor_set_lists_the_rate_limit_service_beside_quotad_v1() {
    let set = prost_types::FileDescriptorSet::decode(quotad_proto::FILE_DESCRIPTOR_SET)
        .expect("the build writes a valid descriptor set");
    let service = |package: &str, name: &str| {
        set.file
            .iter()
            .filter(|f| f.package() == package)
            .flat_map(|f| f.service.iter())
            .find(|s| s.name() == name)
            .cloned()
    };

    let rls = service("envoy.service.ratelimit.v3", "RateLimitService")
        .expect("envoy.service.ratelimit.v3.RateLimitService is described");
    let method = rls
        .method
        .iter()
        .find(|m| m.name() == "ShouldRateLimit")
        .expect("ShouldRateLimit is described");
    assert_eq!(
        method.input_type(),
        ".envoy.service.ratelimit.v3.RateLimitRequest"
    );
    assert_eq!(
        method.output_type(),
        ".envoy.service.ratelimit.v3.RateLimitResponse"
    );
    assert!(service("quotad.v1", "Quota").is_some());

    // Every imported file is in the set, so reflection clients can resolve
    // the request and response types.
    for file in [
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "envoy/config/core/v3/base.proto",
        "envoy/type/v3/ratelimit_unit.proto",
        "google/protobuf/wrappers.proto",
    ] {
        assert!(set.file.iter().any(|f| f.name() == file), "{file} missing");
    }
}

/// Envoy's RLQS usage reports as its filter writes them
/// (`report.add_bucket_quota_usages()`): `bucket_quota_usages` is a
/// repeated message, field 2, each a `BucketQuotaUsage` of a `BucketId`
/// (field 1, a map of string to string), `time_elapsed` (2),
/// `num_requests_allowed` (3) and `num_requests_denied` (4).
#[test]
fn an_rlqs_usage_report_decodes_from_envoys_bytes() {
    use quotad_proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
    let usage = |value: &[u8], seconds: u8, allowed: u8, denied: u8| {
        let entry = [delimited(0x0a, b"name"), delimited(0x12, value)].concat();
        let bucket_id = delimited(0x0a, &entry);
        let body = [
            delimited(0x0a, &bucket_id),
            delimited(0x12, &[0x08, seconds]),
            vec![0x18, allowed, 0x20, denied],
        ]
        .concat();
        delimited(0x12, &body)
    };
    let bytes = [
        delimited(0x0a, b"edge"),
        usage(b"api", 5, 7, 2),
        usage(b"web", 1, 1, 3),
    ]
    .concat();
    let reports = RateLimitQuotaUsageReports::decode(bytes.as_slice()).expect("Envoy's bytes");
    assert_eq!(reports.domain, "edge");
    let got: Vec<(String, i64, u64, u64)> = reports
        .bucket_quota_usages
        .iter()
        .map(|u| {
            let id = u.bucket_id.as_ref().expect("bucket_id");
            (
                id.bucket["name"].clone(),
                u.time_elapsed.expect("time_elapsed").seconds,
                u.num_requests_allowed,
                u.num_requests_denied,
            )
        })
        .collect();
    assert_eq!(
        got,
        [("api".to_owned(), 5, 7, 2), ("web".to_owned(), 1, 1, 3)],
        "in the order Envoy sent them"
    );
    assert_eq!(reports.encode_to_vec(), bytes, "and back to the same bytes");
}
