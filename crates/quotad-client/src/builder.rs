//! [`ClientBuilder`]: the settings of a [`Client`], and how it connects.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Clock, MonotonicClock, Throttle};
use quotad_proto::v1::leases_client::LeasesClient;
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::Status;
use tonic::transport::Channel;

use crate::client::{Client, OUTAGE_LOG_INTERVAL};
use crate::deny_cache::{DEFAULT_DENY_CACHE_CAPACITY, DenyCache};
use crate::lease::{LeaseOptions, LeaseTable};
use crate::lessee::Lessee;
use crate::queue::{Coalescer, Coalescing};
use crate::request::{DEFAULT_DEADLINE, Error, FailurePolicy, deadline_exceeded, source_chain};
use crate::shared::Shared;
use crate::transport::{self, Keepalive, TlsConfig};

// The ways to make a client live here, beside the settings they take, so
// that the client's own module does not depend on its builder.
impl Client {
    /// Settings for a client of quotad at `address`: `http://host:port`,
    /// `https://host:port` (with [`ClientBuilder::tls`]) or
    /// `unix:///path/to.sock`.
    pub fn builder(address: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(address.into())
    }

    /// Connects with default settings and fails if quotad cannot be reached
    /// within the deadline.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAddress`] (an `https://` address needs
    /// [`ClientBuilder::tls`]), or [`Error::Unavailable`] when no connection
    /// could be made.
    pub async fn connect(address: impl Into<String>) -> Result<Self, Error> {
        Self::builder(address).connect().await
    }
}

/// Settings for a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    address: String,
    deadline: Duration,
    on_unavailable: FailurePolicy,
    tls: Option<TlsConfig>,
    keepalive: Keepalive,
    coalescing: Coalescing,
    deny_cache_capacity: usize,
    leases: Option<LeaseOptions>,
    clock: Option<Arc<dyn Clock>>,
}

impl ClientBuilder {
    /// The defaults, for quotad at `address`.
    pub(crate) fn new(address: String) -> Self {
        ClientBuilder {
            address,
            deadline: DEFAULT_DEADLINE,
            on_unavailable: FailurePolicy::default(),
            tls: None,
            keepalive: Keepalive::default(),
            coalescing: Coalescing::default(),
            deny_cache_capacity: DEFAULT_DENY_CACHE_CAPACITY,
            leases: None,
            clock: None,
        }
    }

    /// The longest one call may take, connecting and waiting in the
    /// coalescing queue included; past it the failure policy applies.
    /// Default [`DEFAULT_DEADLINE`].
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What to answer when quotad cannot be reached. Default
    /// [`FailurePolicy::Error`].
    #[must_use]
    pub fn on_unavailable(mut self, policy: FailurePolicy) -> Self {
        self.on_unavailable = policy;
        self
    }

    /// TLS for an `https://` address: the CA to trust, and optionally a
    /// client certificate (mTLS) and the server name to expect.
    #[must_use]
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How a connection that stopped answering is found and dropped, so the
    /// next call connects again. Default [`Keepalive::default`]: a ping
    /// after 10 s without a frame from quotad, dropped after 5 s more.
    #[must_use]
    pub fn keepalive(mut self, keepalive: Keepalive) -> Self {
        self.keepalive = keepalive;
        self
    }

    /// How concurrent checks are coalesced into batches ([`Coalescing::off`]
    /// to send each alone). On by default.
    #[must_use]
    pub fn coalescing(mut self, coalescing: Coalescing) -> Self {
        self.coalescing = coalescing;
        self
    }

    /// The most keys the local deny cache holds; 0 turns it off. Default
    /// [`DEFAULT_DENY_CACHE_CAPACITY`].
    ///
    /// While a `LIMIT_EXCEEDED` denial of cost `c` holds (its retry time,
    /// timed from when the request was sent), checks of the same key and
    /// policy for a cost of `c` or more are denied locally, without a call.
    /// Room can come early in two ways: a `Reset` (one made through this
    /// client drops the entry; one made elsewhere is not seen) and a policy
    /// reload that raises the limit (seen when quotad next answers for the
    /// key). Either way the entry lasts at most the retry time quotad gave.
    /// The wait a local denial reports counts from when quotad's answer
    /// arrived (plus a clock margin), so it is never shorter than quotad's.
    #[must_use]
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache_capacity = capacity;
        self
    }

    /// Turns leases on: the client holds shares of a key's budget that
    /// quotad charged when it granted them, and admits with them locally,
    /// without a call. Off by default. Named policies need `lease` settings
    /// on the server; inline ones need [`Check::lease_terms`](crate::Check::lease_terms).
    ///
    /// A check that finds no lease is sent to quotad as usual (never
    /// delayed) while a lease is acquired in the background; a lease is
    /// renewed at half spent or half its TTL, reporting what was spent. It
    /// is spent until its send time + `ttl_ms` x (1 - 1/1000) less
    /// [`LeaseOptions::margin`] on the client's monotonic clock, never
    /// later, whatever the network's delay; while quotad is unreachable the
    /// client spends what it holds until then, and the failure policy
    /// applies after. When quotad answers `direct` (near the end of the
    /// budget), the key is checked call by call for
    /// [`LeaseOptions::direct_backoff`]; a policy quotad will not lease is
    /// not asked again for [`NOT_LEASABLE_RECHECK`](crate::NOT_LEASABLE_RECHECK).
    /// [`Client::shutdown`] returns what is unspent.
    #[must_use]
    pub fn leases(mut self, options: LeaseOptions) -> Self {
        self.leases = Some(options);
        self
    }

    /// The clock the deny cache, the leases and the outage log read. Default: a
    /// monotonic clock, so a wall-clock step never stretches a cached
    /// denial. For tests and simulations.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    fn client(self, channel: Channel) -> Client {
        let coalescer = self
            .coalescing
            .is_enabled()
            .then(|| Coalescer::new(self.coalescing));
        let cache =
            (self.deny_cache_capacity > 0).then(|| DenyCache::new(self.deny_cache_capacity));
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let shared = Arc::new(Shared {
            rpc: QuotaClient::new(channel.clone()),
            slots: quotad_proto::v1::concurrency_client::ConcurrencyClient::new(channel.clone()),
            coalescer,
            cache,
            clock,
            outage_log: Throttle::new(OUTAGE_LOG_INTERVAL),
            runtime: tokio::runtime::Handle::try_current().ok(),
        });
        let leases = self.leases.map(|options| {
            Arc::new(Lessee::new(
                LeaseTable::new(options),
                LeasesClient::new(channel),
                Arc::clone(&shared),
                self.deadline,
            ))
        });
        Client {
            shared,
            deadline: self.deadline,
            on_unavailable: self.on_unavailable,
            leases,
        }
    }

    fn endpoint(&self) -> Result<tonic::transport::Endpoint, Error> {
        transport::endpoint(
            &self.address,
            self.tls.as_ref(),
            self.deadline,
            self.keepalive,
        )
    }

    /// A channel to quotad with these connection settings (address, TLS,
    /// keepalive, connect timeout), connecting on first use: for the
    /// `quotad.v1` services this client does not wrap (`Overrides`,
    /// `Explain`), through their generated clients in `quotad-proto`.
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`].
    pub fn channel(&self) -> Result<tonic::transport::Channel, Error> {
        Ok(self.endpoint()?.connect_lazy())
    }

    /// A client that connects on first use and reconnects by itself, so it
    /// can be made before quotad is up and outlives quotad restarts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAddress`] when the address is not a quotad address, or
    /// its TLS settings do not fit it or cannot be used.
    pub fn build(self) -> Result<Client, Error> {
        let channel = self.endpoint()?.connect_lazy();
        Ok(self.client(channel))
    }

    /// A client connected now: fails if quotad cannot be reached within the
    /// deadline.
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`], and [`Error::Unavailable`] when no
    /// connection could be made.
    pub async fn connect(self) -> Result<Client, Error> {
        let endpoint = self.endpoint()?;
        let channel = tokio::time::timeout(self.deadline, endpoint.connect())
            .await
            .map_err(|_| Error::Unavailable(deadline_exceeded()))?
            .map_err(|e| Error::Unavailable(Status::unavailable(source_chain(&e))))?;
        Ok(self.client(channel))
    }
}
