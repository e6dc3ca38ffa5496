//! The listeners, and accepting connections within a cap: each port admits
//! at most `transport.max_connections` open connections, and closes any
//! connection past it at once (a client sees it closed rather than hanging
//! in the backlog, and can try another replica). The gRPC port listens on
//! TCP or on a unix socket ([`UnixSocket`]).

use std::future::Future as _;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::Stream;
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

/// The most connections the admin port holds open, whatever
/// `transport.max_connections` says: its clients are a few scrapers and
/// probes, and its sockets come out of the same open-files limit as the
/// gRPC port's.
pub const ADMIN_MAX_CONNECTIONS: usize = 1_024;

/// The cap on the open connections of one port, and how long a new one may
/// stay silent. Clones share the count.
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    permits: Arc<Semaphore>,
    /// The cap, to tell when every place is back.
    max: u32,
    /// Cancelled to end every connection still open (see
    /// [`ConnectionLimit::close_all`]).
    closing: CancellationToken,
    port: &'static str,
    rejected: Option<Counter>,
    silent_for: Option<Duration>,
    /// The bytes a new connection must send within `silent_for`.
    first_bytes: usize,
}

/// The length of the HTTP/2 client connection preface (RFC 9113, 3.4),
/// which a client sends before anything else; a TLS client hello is
/// longer.
pub const HTTP2_PREFACE_BYTES: usize = 24;

impl ConnectionLimit {
    /// At most `max` open connections on the port named `port` (for logs).
    pub fn new(max: usize, port: &'static str) -> Self {
        let max = max.min(Semaphore::MAX_PERMITS).min(u32::MAX as usize);
        ConnectionLimit {
            permits: Arc::new(Semaphore::new(max)),
            max: u32::try_from(max).expect("bounded to u32::MAX above"),
            closing: CancellationToken::new(),
            port,
            rejected: None,
            silent_for: None,
            first_bytes: 1,
        }
    }

    /// With [`ConnectionLimit::silent_for`]: the connection must send at
    /// least `bytes` in that time, not only its first byte. For the gRPC
    /// port, [`HTTP2_PREFACE_BYTES`]: a client that sends one byte of its
    /// preface and stalls holds no place past the timeout (HTTP/2 itself
    /// would wait for the rest until the connection's maximum age).
    #[must_use]
    pub fn until_bytes(mut self, bytes: usize) -> Self {
        self.first_bytes = bytes.max(1);
        self
    }

    /// Closes a connection that sends nothing within `timeout` of being
    /// accepted (a TLS hello or the HTTP/2 preface comes first), so sockets
    /// that never speak cannot hold the port's places.
    #[must_use]
    pub fn silent_for(mut self, timeout: Duration) -> Self {
        self.silent_for = Some(timeout);
        self
    }

    /// Ends every connection admitted by this limit that is still open:
    /// their next read or write that must wait (at once for an idle one)
    /// fails, which ends their HTTP handling. For
    /// a shutdown whose drain timed out: the server's own task is gone by
    /// then, but each connection runs in a task of its own.
    pub(crate) fn close_all(&self) {
        self.closing.cancel();
    }

    /// Whether every connection admitted by this limit has closed (its
    /// place is back) within `within`.
    pub(crate) async fn all_closed(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.permits.acquire_many(self.max))
            .await
            .is_ok_and(|permits| permits.is_ok())
    }

    /// Counts each refused connection in `rejected`.
    #[must_use]
    pub(crate) fn counting(mut self, rejected: Counter) -> Self {
        self.rejected = Some(rejected);
        self
    }

    /// A permit for one more connection, held as long as it is open; `None`
    /// (counted and logged) when the port is full.
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                if let Some(rejected) = &self.rejected {
                    rejected.increment(1);
                }
                tracing::debug!(
                    port = self.port,
                    "connection refused: transport.max_connections reached"
                );
                None
            }
        }
    }
}

/// Accepted connections, each admitted by a [`ConnectionLimit`]: a
/// connection past the cap is dropped (closed) as soon as it is accepted.
#[derive(Debug)]
pub struct Incoming<S> {
    inner: S,
    limit: ConnectionLimit,
}

impl<S> Incoming<S> {
    /// `inner`'s connections within `limit`.
    pub fn new(inner: S, limit: ConnectionLimit) -> Self {
        Incoming { inner, limit }
    }
}

impl<S, IO> Stream for Incoming<S>
where
    S: Stream<Item = io::Result<IO>> + Unpin,
{
    type Item = io::Result<Admitted<IO>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                Some(Ok(io)) => {
                    if let Some(permit) = self.limit.admit() {
                        let first_bytes_by = self.limit.silent_for.map(|timeout| FirstBytes {
                            by: Box::pin(tokio::time::sleep(timeout)),
                            left: self.limit.first_bytes,
                        });
                        // Its own token, cancelled with the limit's: a
                        // waiting read or write registers with it alone,
                        // not with one lock every connection shares.
                        let closing = self.limit.closing.child_token();
                        return Poll::Ready(Some(Ok(Admitted {
                            io,
                            _permit: permit,
                            first_bytes_by,
                            closed: Box::pin(closing.cancelled_owned()),
                        })));
                    }
                    // Dropping `io` closes it; go on accepting.
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            }
        }
    }
}

/// An admitted connection: the stream, and its place under the cap, given
/// back when it closes.
#[derive(Debug)]
pub struct Admitted<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
    /// Until its first bytes arrive: when the connection is given up.
    first_bytes_by: Option<FirstBytes>,
    /// Ready once its limit's [`ConnectionLimit::close_all`] has come; it
    /// wakes a read or write waiting on the stream when it does.
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// The error of a read or write after [`ConnectionLimit::close_all`].
fn closed_by_server() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed: calls still in flight after transport.drain_timeout",
    )
}

impl<IO> Admitted<IO> {
    /// Polls one read or write of the stream; one that must wait fails
    /// once the connection is to end ([`ConnectionLimit::close_all`]), and
    /// is woken when it does.
    ///
    /// Only a read or write that must wait looks at the token (whose check
    /// takes the connection's own lock): a connection's reads end waiting
    /// each time its socket is drained (and at least every 128 reads, by
    /// tokio's cooperative budget), so a busy one ends at the next of
    /// those, and the reads and writes that go through meanwhile take no
    /// lock.
    fn unless_closing<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(&mut IO, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let polled = op(&mut self.io, cx);
        if polled.is_pending() && self.closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(closed_by_server()));
        }
        polled
    }
}

/// The bytes a new connection has still to send, and by when.
#[derive(Debug)]
struct FirstBytes {
    by: Pin<Box<tokio::time::Sleep>>,
    left: usize,
}

impl<IO: Connected> Connected for Admitted<IO> {
    // The inner type, so that tonic's own extractors (peer certificates,
    // remote address) keep finding it.
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = self.unless_closing(cx, |io, cx| Pin::new(io).poll_read(cx, buf));
        if let Some(first) = &mut self.first_bytes_by {
            match &read {
                Poll::Ready(Ok(())) => {
                    first.left = first.left.saturating_sub(buf.filled().len() - before);
                    if first.left == 0 {
                        self.first_bytes_by = None;
                    }
                }
                Poll::Pending => {
                    if first.by.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no connection preface within transport.handshake_timeout",
                        )));
                    }
                }
                Poll::Ready(Err(_)) => {}
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.unless_closing(cx, |io, cx| Pin::new(io).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.unless_closing(cx, |io, cx| Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The gRPC port's listener: TCP, or a unix socket (for a sidecar, or
/// Envoy on the same host).
#[derive(Debug)]
pub enum GrpcListener {
    /// A bound TCP listener.
    Tcp(TcpListener),
    /// A bound unix socket.
    Unix(UnixSocket),
}

impl From<TcpListener> for GrpcListener {
    fn from(listener: TcpListener) -> Self {
        GrpcListener::Tcp(listener)
    }
}

impl From<UnixSocket> for GrpcListener {
    fn from(socket: UnixSocket) -> Self {
        GrpcListener::Unix(socket)
    }
}

impl GrpcListener {
    /// Where it listens, for logs.
    pub fn describe(&self) -> String {
        match self {
            GrpcListener::Tcp(listener) => listener
                .local_addr()
                .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string()),
            GrpcListener::Unix(socket) => format!("unix://{}", socket.path.display()),
        }
    }
}

/// The longest path a unix socket address may have (`sun_path` is 108
/// bytes on Linux, the last one a NUL).
pub(crate) const MAX_UNIX_PATH_BYTES: usize = 107;

/// The private folder a socket is bound in before it is moved into place:
/// `.q` and six random characters, in the socket's own folder.
const PRIVATE_FOLDER_PREFIX: &str = ".q";
const PRIVATE_FOLDER_RANDOM: usize = 6;
/// The socket's name inside that folder.
const PRIVATE_SOCKET_NAME: &str = "s";

/// A unix socket bound for the gRPC port, whose file is removed when the
/// server stops listening (when this, or the stream of its connections, is
/// dropped) unless another process has replaced it meanwhile.
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's device and inode, to recognise it at removal.
    file: (u64, u64),
    /// `<path>.lock`, locked while this socket serves: one quotad a path.
    _lock: std::fs::File,
}

impl UnixSocket {
    /// The longest path binding at `path` uses: the path itself, or the
    /// temporary one in a private folder beside it.
    pub(crate) fn longest_path_bytes(path: &Path) -> usize {
        let folder = path.parent().map_or(0, |p| p.as_os_str().len().max(1));
        let temporary = folder
            + 1
            + PRIVATE_FOLDER_PREFIX.len()
            + PRIVATE_FOLDER_RANDOM
            + 1
            + PRIVATE_SOCKET_NAME.len();
        path.as_os_str().len().max(temporary)
    }

    /// Binds a unix socket at `path` whose file has `mode` (e.g. `0o660`).
    ///
    /// One quotad serves a path at a time: `<path>.lock` (left in place) is
    /// locked for as long as the socket serves. A socket file already at
    /// `path` that no process listens on (left by a process that died) is
    /// replaced. The new socket is bound in a private folder (mode 0700)
    /// beside `path`, given its mode there, and renamed into place: nobody
    /// else can reach it, or swap it for a link, before it has its mode.
    ///
    /// # Errors
    ///
    /// `AddrInUse` when a process serves at `path`; `AlreadyExists` when
    /// `path` is not a socket (it is left alone); any error locking,
    /// binding, setting the mode or renaming, naming the path. Must be
    /// called within a tokio runtime.
    pub fn bind(path: &Path, mode: u32) -> io::Result<UnixSocket> {
        let named = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| named(e, "cannot open the lock file of"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another quotad serves on {}", path.display()),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(named(e, "cannot lock")),
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("a process already serves on {}", path.display()),
                        ));
                    }
                    // Nobody listens: a stale socket file, replaced below.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(named(e, "cannot tell whether a process serves on")),
                }
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; not replacing it",
                        path.display()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(named(e, "cannot inspect")),
        }
        let folder = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let private = tempfile::Builder::new()
            .prefix(PRIVATE_FOLDER_PREFIX)
            .rand_bytes(PRIVATE_FOLDER_RANDOM)
            .tempdir_in(folder)
            .map_err(|e| named(e, "cannot make a private folder beside"))?;
        let temporary = private.path().join(PRIVATE_SOCKET_NAME);
        let listener = UnixListener::bind(&temporary).map_err(|e| named(e, "cannot bind"))?;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| named(e, "cannot place the socket at"))?;
        let meta = std::fs::symlink_metadata(path).map_err(|e| named(e, "cannot inspect"))?;
        Ok(UnixSocket {
            listener,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
            _lock: lock,
        })
    }

    /// The socket file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.file);
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the gRPC socket file");
        }
    }
}

/// The connections accepted on a [`UnixSocket`].
#[derive(Debug)]
pub struct UnixIncoming(UnixSocket);

impl UnixIncoming {
    /// The connections of `socket`.
    pub fn new(socket: UnixSocket) -> Self {
        UnixIncoming(socket)
    }
}

impl Stream for UnixIncoming {
    type Item = io::Result<UnixStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0
            .listener
            .poll_accept(cx)
            .map(|accepted| Some(accepted.map(|(stream, _)| stream)))
    }
}
