//! Every gRPC method quotad serves, declared once: the service it belongs
//! to, its name in the method path, the `[auth]` group whose allowlist
//! guards it and the `method` label of its metrics.
//!
//! The routes (one per [`Service`]), gRPC health (every [`Service`] by
//! name), authorization (`auth`: a path's [`AuthGroup`]) and the
//! per-method metrics (`metrics`: a series per [`Method`]) are all derived
//! from the table below, so adding a method is one row here plus its
//! handler; adding a service is a [`Service`] and how it is built
//! (`crate::services`); adding an `[auth]` group is an [`AuthGroup`] and its
//! setting in `config::settings`.
//!
//! This module is a leaf: `config`, `auth`, `grpc` and `metrics` import it,
//! and it imports none of them.

use quotad_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::SERVICE_NAME as RLQS_SERVICE;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME as RLS_SERVICE;
use quotad_proto::v1::concurrency_server::SERVICE_NAME as CONCURRENCY_SERVICE;
use quotad_proto::v1::explain_server::SERVICE_NAME as EXPLAIN_SERVICE;
use quotad_proto::v1::leases_server::SERVICE_NAME as LEASES_SERVICE;
use quotad_proto::v1::overrides_server::SERVICE_NAME as OVERRIDES_SERVICE;
use quotad_proto::v1::quota_server::SERVICE_NAME as QUOTA_SERVICE;

/// A gRPC service quotad serves on its gRPC port, and reports by name in
/// gRPC health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Service {
    /// `quotad.v1.Quota`: quotad's own API.
    Quota,
    /// `quotad.v1.Leases`: shares of a key's budget spent by the client.
    Leases,
    /// `quotad.v1.Concurrency`: slots of concurrency limits.
    Concurrency,
    /// `quotad.v1.Overrides`: runtime overrides of named policies.
    Overrides,
    /// `quotad.v1.Explain`: a key's state in words.
    Explain,
    /// `envoy.service.ratelimit.v3.RateLimitService`: Envoy's RLS.
    Rls,
    /// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`: Envoy's
    /// RLQS.
    Rlqs,
}

impl Service {
    /// Every service, in the order health reports them.
    pub(crate) const ALL: [Service; 7] = [
        Service::Quota,
        Service::Leases,
        Service::Concurrency,
        Service::Overrides,
        Service::Explain,
        Service::Rls,
        Service::Rlqs,
    ];

    /// Every service's [name](Service::name), in [`Service::ALL`]'s order:
    /// the services gRPC health reports.
    pub(crate) const NAMES: [&'static str; Service::ALL.len()] = {
        let mut names = [""; Service::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Service::ALL[i].name();
            i += 1;
        }
        names
    };

    /// Its full name: the first part of its methods' paths, and its name in
    /// gRPC health.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Service::Quota => QUOTA_SERVICE,
            Service::Leases => LEASES_SERVICE,
            Service::Concurrency => CONCURRENCY_SERVICE,
            Service::Overrides => OVERRIDES_SERVICE,
            Service::Explain => EXPLAIN_SERVICE,
            Service::Rls => RLS_SERVICE,
            Service::Rlqs => RLQS_SERVICE,
        }
    }

    /// Whether its proto is quotad's own, so that it may gain methods
    /// before they get a row in the table: such a method is closed once
    /// any allowlist is set, rather than open by omission. A vendored
    /// proto (Envoy's) is fixed.
    pub(crate) const fn grows_with_quotad(self) -> bool {
        match self {
            Service::Quota
            | Service::Leases
            | Service::Concurrency
            | Service::Overrides
            | Service::Explain => true,
            Service::Rls | Service::Rlqs => false,
        }
    }

    /// The service whose full name is `name`.
    fn named(name: &str) -> Option<Service> {
        Service::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// An `[auth]` group: the methods one allowlist covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthGroup {
    /// `auth.check`: `Check`, `CheckBatch`, `Lease` (a lease consumes
    /// budget as a check does), and `Acquire`, `Renew` and `Release` (a
    /// slot takes capacity as a check takes budget).
    Check,
    /// `auth.peek`: `Peek`.
    Peek,
    /// `auth.reset`: `Reset`, and `Explain` (gated like `Reset`).
    Reset,
    /// `auth.overrides`: `SetOverride`, `RemoveOverride`, `ListOverrides`.
    Overrides,
    /// `auth.should_rate_limit`: Envoy's `ShouldRateLimit`.
    ShouldRateLimit,
    /// `auth.rate_limit_quotas`: Envoy's `StreamRateLimitQuotas`.
    RateLimitQuotas,
}

impl AuthGroup {
    /// Every group, in the order their settings are validated (so the first
    /// error reported is the first group's).
    pub(crate) const ALL: [AuthGroup; 6] = [
        AuthGroup::Check,
        AuthGroup::Peek,
        AuthGroup::Reset,
        AuthGroup::Overrides,
        AuthGroup::ShouldRateLimit,
        AuthGroup::RateLimitQuotas,
    ];

    /// How many groups there are.
    pub(crate) const COUNT: usize = AuthGroup::ALL.len();

    /// Its setting under `[auth]`, which is also the `method` label of
    /// `quotad_auth_denied_total`.
    pub(crate) const fn setting(self) -> &'static str {
        match self {
            AuthGroup::Check => "check",
            AuthGroup::Peek => "peek",
            AuthGroup::Reset => "reset",
            AuthGroup::Overrides => "overrides",
            AuthGroup::ShouldRateLimit => "should_rate_limit",
            AuthGroup::RateLimitQuotas => "rate_limit_quotas",
        }
    }

    /// Its position in [`AuthGroup::ALL`], to index per-group values.
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// What the table says of one method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    service: Service,
    name: &'static str,
    group: AuthGroup,
    label: &'static str,
}

/// Declares [`Method`] and its rows from one line per method:
/// `Variant: Service "Name", auth Group, label "label";`.
macro_rules! methods {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident: $service:ident $name:literal, auth $group:ident, label $label:literal;
    )*) => {
        /// A gRPC method quotad serves (see [the module](self)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Method {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Method {
            /// Every method, in the table's order.
            pub(crate) const ALL: [Method; [$(stringify!($variant)),*].len()] =
                [$(Method::$variant),*];

            /// Its row of the table.
            const fn row(self) -> Row {
                match self {
                    $(Method::$variant => Row {
                        service: Service::$service,
                        name: $name,
                        group: AuthGroup::$group,
                        label: $label,
                    },)*
                }
            }
        }
    };
}

methods! {
    /// `quotad.v1.Quota/Check`.
    Check: Quota "Check", auth Check, label "check";
    /// `quotad.v1.Quota/CheckBatch`.
    CheckBatch: Quota "CheckBatch", auth Check, label "check_batch";
    /// `quotad.v1.Quota/Peek`.
    Peek: Quota "Peek", auth Peek, label "peek";
    /// `quotad.v1.Quota/Reset`.
    Reset: Quota "Reset", auth Reset, label "reset";
    /// `quotad.v1.Leases/Lease`.
    Lease: Leases "Lease", auth Check, label "lease";
    /// `quotad.v1.Concurrency/Acquire`.
    Acquire: Concurrency "Acquire", auth Check, label "acquire";
    /// `quotad.v1.Concurrency/Renew`.
    Renew: Concurrency "Renew", auth Check, label "renew";
    /// `quotad.v1.Concurrency/Release`.
    Release: Concurrency "Release", auth Check, label "release";
    /// `quotad.v1.Overrides/SetOverride`.
    SetOverride: Overrides "SetOverride", auth Overrides, label "set_override";
    /// `quotad.v1.Overrides/RemoveOverride`.
    RemoveOverride: Overrides "RemoveOverride", auth Overrides, label "remove_override";
    /// `quotad.v1.Overrides/ListOverrides`.
    ListOverrides: Overrides "ListOverrides", auth Overrides, label "list_overrides";
    /// `quotad.v1.Explain/Explain`.
    Explain: Explain "Explain", auth Reset, label "explain";
    /// Envoy's `RateLimitService/ShouldRateLimit`.
    ShouldRateLimit: Rls "ShouldRateLimit", auth ShouldRateLimit, label "should_rate_limit";
    /// Envoy's `RateLimitQuotaService/StreamRateLimitQuotas`.
    StreamRateLimitQuotas: Rlqs "StreamRateLimitQuotas", auth RateLimitQuotas, label "stream_rate_limit_quotas";
}

impl Method {
    /// How many methods there are.
    pub(crate) const COUNT: usize = Method::ALL.len();

    /// The service it belongs to.
    pub(crate) const fn service(self) -> Service {
        self.row().service
    }

    /// The `[auth]` group whose allowlist guards it.
    pub(crate) const fn group(self) -> AuthGroup {
        self.row().group
    }

    /// Its `method` label in metrics.
    pub(crate) const fn as_str(self) -> &'static str {
        self.row().label
    }

    /// Its position in [`Method::ALL`], to index per-method values.
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// What a request path names: one of the table's methods, another
    /// method of one of the table's services, or anything else.
    pub(crate) fn find(path: &str) -> Path {
        let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
            return Path::Other;
        };
        let Some(service) = Service::named(service) else {
            return Path::Other;
        };
        Method::ALL
            .into_iter()
            .find(|m| m.service() == service && m.row().name == method)
            .map_or(Path::Unlisted(service), Path::Method)
    }
}

/// What a request path names ([`Method::find`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// A method of the table.
    Method(Method),
    /// A method of this service that the table does not list.
    Unlisted(Service),
    /// Not a method of any of the table's services (health, reflection).
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gRPC path of `method`, `/<service>/<method>`.
    fn path(method: Method) -> String {
        format!("/{}/{}", method.service().name(), method.row().name)
    }

    #[test]
    fn every_path_finds_its_own_method_and_no_other() {
        for method in Method::ALL {
            assert_eq!(Method::find(&path(method)), Path::Method(method));
        }
        assert_eq!(Method::ALL.len(), Method::COUNT);
        assert_eq!(
            Method::find("/quotad.v1.Quota/Check"),
            Path::Method(Method::Check)
        );
        assert_eq!(
            Method::find("/quotad.v1.Quota/SomeLaterMethod"),
            Path::Unlisted(Service::Quota)
        );
        assert_eq!(
            Method::find("/quotad.v1.Leases/Lease"),
            Path::Method(Method::Lease)
        );
        assert_eq!(Method::Lease.group(), AuthGroup::Check);
        assert_eq!(
            Method::find("/quotad.v1.Quota/Check/more"),
            Path::Unlisted(Service::Quota)
        );
        for other in [
            "/grpc.health.v1.Health/Check",
            "/quotad.v1.Quotas/Check",
            "quotad.v1.Quota/Check",
            "/",
            "",
        ] {
            assert_eq!(Method::find(other), Path::Other, "{other:?}");
        }
    }

    #[test]
    fn indices_follow_the_tables_order() {
        for (i, method) in Method::ALL.into_iter().enumerate() {
            assert_eq!(method.index(), i);
        }
        for (i, group) in AuthGroup::ALL.into_iter().enumerate() {
            assert_eq!(group.index(), i);
        }
    }
}
