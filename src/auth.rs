//! Authorization per gRPC method by client identity, as a tower layer on
//! the gRPC port: it sees the method path of every call to every service
//! (quotad.v1 and Envoy's RLS alike) before any request byte is decoded,
//! so a denied call touches nothing.
//!
//! A client's identities are the URI and DNS names in its certificate's
//! subject alternative names, or, when it has neither, its subject common
//! names. A call is allowed when its method group has no allowlist
//! (`[auth]`), or when one of the identities matches one of the group's
//! patterns. Denied: PERMISSION_DENIED naming the method and the identity,
//! counted in `quotad_auth_denied_total{method}`. Each method's group is
//! its row of the method table (`crate::methods`); methods outside it
//! (health checking, reflection) are open to every client that passed
//! mTLS.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, Response};
use metrics::Counter;
use rustls_pki_types::CertificateDer;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tower_layer::Layer;
use tower_service::Service;
use x509_parser::extensions::GeneralName;

use crate::config::{AuthSettings, IdentityPattern};
use crate::log::Throttled;
use crate::methods::{AuthGroup, Method, Path};
use crate::metrics::Metrics;

/// A method group's rule: its allowlist, and the counter of its denials.
#[derive(Debug)]
struct Rule {
    group: AuthGroup,
    allowed: Vec<IdentityPattern>,
    denied: Counter,
}

/// The rules by method group ([`AuthGroup::index`]): `None` for a group
/// without an allowlist.
#[derive(Debug)]
struct Rules {
    groups: [Option<Rule>; AuthGroup::COUNT],
    /// Whether any group has an allowlist.
    any: bool,
    denials_log: Throttled,
}

/// The layer enforcing `[auth]`; without allowlists it lets every call
/// through.
pub(crate) fn layer(settings: &AuthSettings, metrics: &Metrics) -> AuthLayer {
    let groups = AuthGroup::ALL.map(|group| {
        settings.allowlist(group).map(|allowed| Rule {
            group,
            allowed: allowed.to_vec(),
            denied: metrics.auth_denied(group),
        })
    });
    AuthLayer {
        rules: Arc::new(Rules {
            any: groups.iter().any(Option::is_some),
            groups,
            denials_log: Throttled::default(),
        }),
    }
}

/// See [the module](self).
#[derive(Clone, Debug)]
pub(crate) struct AuthLayer {
    rules: Arc<Rules>,
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            rules: Arc::clone(&self.rules),
        }
    }
}

/// See [the module](self).
#[derive(Clone, Debug)]
pub(crate) struct Auth<S> {
    inner: S,
    rules: Arc<Rules>,
}

impl<S, B, RB> Service<Request<B>> for Auth<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<RB>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = request.uri().path();
        let rule = match Method::find(path) {
            Path::Method(method) => self.rules.groups[method.group().index()].as_ref(),
            // A method of quotad's own API that the table does not list (one
            // added later) is closed once any allowlist is set, rather than
            // open by omission.
            Path::Unlisted(service) if service.grows_with_quotad() && self.rules.any => {
                let status = Status::permission_denied(format!(
                    "{path}: no [auth] group covers this method"
                ));
                return Either::Left(ready(Ok(status.into_http())));
            }
            Path::Unlisted(_) | Path::Other => None,
        };
        let Some(rule) = rule else {
            return Either::Right(self.inner.call(request));
        };
        let identities = client_identities(&request);
        let allowed = identities
            .iter()
            .any(|id| rule.allowed.iter().any(|p| p.matches(id)));
        if allowed {
            return Either::Right(self.inner.call(request));
        }
        rule.denied.increment(1);
        let identity = if identities.is_empty() {
            "(no identity in the client certificate)".to_owned()
        } else {
            identities.join(", ")
        };
        if let Some(suppressed) = self.rules.denials_log.record() {
            tracing::warn!(
                method = path,
                %identity,
                group = rule.group.setting(),
                suppressed,
                "call denied by [auth]"
            );
        }
        let status = Status::permission_denied(format!(
            "{path}: not allowed for client {identity} (auth.{})",
            rule.group.setting()
        ));
        Either::Left(ready(Ok(status.into_http())))
    }
}

/// Where a call comes from, as `limits.allow_reset = "local"` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// This machine: a loopback address or the unix socket.
    Local,
    /// A client that presented a certificate the server verified (mTLS).
    Authenticated,
    /// Anyone else: plaintext or server-only TLS from another host.
    Remote(Option<std::net::SocketAddr>),
}

impl Origin {
    /// Where `request` comes from.
    pub(crate) fn of<T>(request: &tonic::Request<T>) -> Origin {
        let extensions = request.extensions();
        if extensions.get::<UdsConnectInfo>().is_some() {
            return Origin::Local;
        }
        let tls = extensions.get::<TlsConnectInfo<TcpConnectInfo>>();
        if tls
            .and_then(TlsConnectInfo::peer_certs)
            .is_some_and(|chain| !chain.is_empty())
        {
            return Origin::Authenticated;
        }
        let remote = tls
            .map(TlsConnectInfo::get_ref)
            .or_else(|| extensions.get::<TcpConnectInfo>())
            .and_then(TcpConnectInfo::remote_addr);
        match remote {
            Some(addr) if addr.ip().to_canonical().is_loopback() => Origin::Local,
            other => Origin::Remote(other),
        }
    }
}

impl Origin {
    /// Whether `access` lets a call from here through: `Err` says why not,
    /// naming `method` and `setting` (`limits.allow_reset`, ...).
    ///
    /// # Errors
    ///
    /// A sentence for PERMISSION_DENIED.
    pub(crate) fn admitted_by(
        self,
        access: crate::config::ResetAccess,
        method: &str,
        setting: &str,
    ) -> Result<(), String> {
        use crate::config::ResetAccess;
        match (access, self) {
            (ResetAccess::Nobody, _) => Err(format!(
                "{method} is disabled on this server ({setting} = \"nobody\")"
            )),
            (ResetAccess::Local, Origin::Remote(from)) => {
                let from = from.map_or_else(
                    || "an unknown address".to_owned(),
                    |a| std::net::SocketAddr::new(a.ip().to_canonical(), a.port()).to_string(),
                );
                Err(format!(
                    "{method} is allowed only to callers over loopback or the unix socket and to mTLS clients ({setting} = \"local\"); this call came from {from}: call over loopback, use mTLS, or set {setting} = \"anyone\""
                ))
            }
            (ResetAccess::Local, Origin::Local | Origin::Authenticated)
            | (ResetAccess::Anyone, _) => Ok(()),
        }
    }
}

/// Who made `request`, for audit logs: its client certificate's
/// identities, else its peer address (or the unix socket).
pub(crate) fn caller<T>(request: &tonic::Request<T>) -> String {
    let extensions = request.extensions();
    if extensions.get::<UdsConnectInfo>().is_some() {
        return "unix socket".to_owned();
    }
    let tls = extensions.get::<TlsConnectInfo<TcpConnectInfo>>();
    let ids = tls
        .and_then(TlsConnectInfo::peer_certs)
        .and_then(|chain| chain.first().map(identities))
        .unwrap_or_default();
    let addr = tls
        .map(TlsConnectInfo::get_ref)
        .or_else(|| extensions.get::<TcpConnectInfo>())
        .and_then(TcpConnectInfo::remote_addr)
        .map(|a| std::net::SocketAddr::new(a.ip().to_canonical(), a.port()).to_string());
    match (ids.is_empty(), addr) {
        (false, Some(addr)) => format!("{} ({addr})", ids.join(", ")),
        (false, None) => ids.join(", "),
        (true, Some(addr)) => addr,
        (true, None) => "unknown".to_owned(),
    }
}

/// The identities of the client certificate of `request`'s connection.
fn client_identities<B>(request: &Request<B>) -> Vec<String> {
    request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .and_then(|chain| chain.first().map(identities))
        .unwrap_or_default()
}

/// The URI and DNS subject alternative names of `cert` (DNS names in lower
/// case: they compare case-insensitively), or its common names when it has
/// no subject alternative name extension at all. A certificate whose
/// extension cannot be read has no identity: it is never taken for its
/// common name.
pub(crate) fn identities(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) => Some((*uri).to_owned()),
                GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        Ok(None) => cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    use super::*;

    fn certificate(common_name: &str, sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = sans;
        let key = KeyPair::generate().expect("a key");
        params.self_signed(&key).expect("signed").der().clone()
    }

    #[test]
    fn the_common_name_counts_only_without_subject_alternative_names() {
        let no_san = certificate("ops-tool", Vec::new());
        assert_eq!(identities(&no_san), ["ops-tool"]);
        // An IP-only SAN extension: the common name is not an identity, or
        // a certificate for an address could claim any name.
        let ip_only = certificate(
            "spiffe://example.org/ops/admin",
            vec![SanType::IpAddress("10.0.0.7".parse().expect("an address"))],
        );
        assert!(identities(&ip_only).is_empty());
        let dns = certificate(
            "ignored",
            vec![SanType::DnsName(
                "Client.Example.ORG".try_into().expect("a name"),
            )],
        );
        assert_eq!(
            identities(&dns),
            ["client.example.org"],
            "DNS names compare in lower case"
        );
    }
}

#[cfg(test)]
mod layer_tests {
    use std::convert::Infallible;

    use quotad_proto::v1::quota_server::SERVICE_NAME as QUOTA_SERVICE;

    use super::*;
    use crate::config::{Config, Files, FlagValues};

    #[tokio::test]
    async fn a_quotad_method_no_group_names_is_closed_once_any_allowlist_is_set() {
        let text = "[server.tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                    [auth]\nreset = [\"spiffe://example.org/ops/*\"]\n";
        let config = Config::parse(text, None, &FlagValues::default(), Files::Skip).expect("valid");
        let metrics = Metrics::new().expect("metrics");
        let inner =
            tower::service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
        let mut auth = layer(config.auth(), &metrics).layer(inner);
        let call = |path: &str| Request::builder().uri(path).body(()).expect("a request");
        let status = |response: Response<()>| {
            response
                .headers()
                .get("grpc-status")
                .map(|v| v.to_str().expect("text").to_owned())
        };
        let future = auth.call(call(&format!("/{QUOTA_SERVICE}/SomeLaterMethod")));
        let response = future.await.expect("infallible");
        assert_eq!(status(response).as_deref(), Some("7"), "PERMISSION_DENIED");
        // Check has no allowlist here: open to every client that passed mTLS.
        let response = auth.call(call(&format!("/{QUOTA_SERVICE}/Check"))).await;
        assert_eq!(
            status(response.expect("infallible")),
            None,
            "passed through"
        );
    }
}
