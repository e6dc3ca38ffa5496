//! Generated gRPC code for quotad's public API, `quotad.v1`, and for
//! Envoy's rate limit service (RLS v3), which quotad also serves.
//!
//! tonic and prost generate the messages, the `Quota` client and the `Quota`
//! server trait from `proto/quotad/v1/quota.proto`, whose comments are the
//! API's documentation. The server and `quotad-client` share this crate and
//! convert to domain types at their own edges through [`convert`]; policy
//! rules are validated by quotad-core, not here.
//!
//! - [`v1`]: messages and enums, [`v1::quota_client::QuotaClient`] and
//!   [`v1::quota_server::Quota`] / [`v1::quota_server::QuotaServer`].
//! - [`envoy`]: Envoy's `envoy.service.ratelimit.v3` (`RateLimitService`,
//!   `ShouldRateLimit`) and the messages it uses, from the protos vendored
//!   under `proto/envoy/` with Envoy's package names and field numbers.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors of both APIs, for gRPC
//!   server reflection.
//! - [`codec`]: the codec of every generated client and server: a request
//!   that is not valid protobuf is INVALID_ARGUMENT, not INTERNAL.
//! - [`convert`]: the one mapping between wire and domain types
//!   (quotad-core's `Algorithm`, `Reason`, `Decision`, `Policy`,
//!   `BatchMode`).
//!
//! # Example
//!
//! ```
//! use prost::Message as _;
//! use quotad_proto::v1::{Algorithm, CheckRequest, Policy, check_request};
//!
//! let request = CheckRequest {
//!     key: "user:42".to_owned(),
//!     cost: None, // absent means one unit
//!     policy: Some(check_request::Policy::InlinePolicy(Policy {
//!         algorithm: Algorithm::TokenBucket.into(),
//!         limit: 100,
//!         window_ms: 60_000,
//!         burst: Some(20),
//!         ..Policy::default() // no calendar period
//!     })),
//! };
//!
//! let decoded = CheckRequest::decode(request.encode_to_vec().as_slice())?;
//! assert_eq!(decoded, request);
//! # Ok::<(), prost::DecodeError>(())
//! ```
//!
//! Asking a running server:
//!
//! ```no_run
//! # async fn ask() -> Result<(), Box<dyn std::error::Error>> {
//! use quotad_proto::v1::{CheckRequest, check_request, quota_client::QuotaClient};
//!
//! let mut client = QuotaClient::connect("http://127.0.0.1:50051").await?;
//! let request = CheckRequest {
//!     key: "user:42".to_owned(),
//!     cost: Some(5),
//!     policy: Some(check_request::Policy::PolicyName("api".to_owned())),
//! };
//! let decision = client.check(request).await?.into_inner().decision;
//! # let _ = decision;
//! # Ok(())
//! # }
//! ```

pub mod codec;
pub mod convert;

/// The most items a `CheckBatch` may carry (the API's documented bound).
pub const MAX_BATCH_ITEMS: usize = 1_000;

/// The `quotad.v1` package: messages, enums, client and server.
///
/// The generated code derives `Debug` everywhere and carries its own clippy
/// allows, so it passes the workspace lints without exceptions here.
pub mod v1 {
    tonic::include_proto!("quotad.v1");
}

/// Envoy's rate limit service, under Envoy's own package names.
///
/// The modules nest as the protobuf packages do, which is what the
/// generated cross-package paths expect:
/// [`envoy::service::ratelimit::v3`] holds the service
/// (`rate_limit_service_server::RateLimitService`, `RateLimitRequest`,
/// `RateLimitResponse`); the descriptor, header and unit messages it refers
/// to live in [`envoy::extensions::common::ratelimit::v3`],
/// [`envoy::config::core::v3`] and `envoy::r#type::v3`.
pub mod envoy {
    /// `envoy.config.*`
    pub mod config {
        /// `envoy.config.core`
        pub mod core {
            /// `envoy.config.core.v3`: `HeaderValue`.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }

    /// `envoy.extensions.*`
    pub mod extensions {
        /// `envoy.extensions.common`
        pub mod common {
            /// `envoy.extensions.common.ratelimit`
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`: `RateLimitDescriptor`.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }

    /// `envoy.service.*`
    pub mod service {
        /// `envoy.service.ratelimit`
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`: `RateLimitService`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }

        /// `envoy.service.rate_limit_quota`
        pub mod rate_limit_quota {
            /// `envoy.service.rate_limit_quota.v3`: `RateLimitQuotaService`
            /// (RLQS), `StreamRateLimitQuotas`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }

    /// `envoy.type.*`
    pub mod r#type {
        /// `envoy.type.v3`: `RateLimitUnit`, `RateLimitStrategy`,
        /// `TokenBucket`.
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

/// The encoded `FileDescriptorSet` of `quotad.v1` and of Envoy's
/// `envoy.service.ratelimit.v3` (with the files it imports), for
/// registering both APIs with `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("quotad_descriptor");
