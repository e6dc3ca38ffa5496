//! The listeners, and accepting connections within a cap: each port admits
//! at most `transport.max_connections` open connections, and closes any
//! connection past it at once (a client sees it closed rather than hanging
//! in the backlog, and can try another replica). The gRPC port listens on
//! TCP or on a unix socket ([`UnixSocket`]).

use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::Stream;
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

/// The cap on the open connections of one port. Clones share the count.
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    permits: Arc<Semaphore>,
    port: &'static str,
    rejected: Option<Counter>,
}

impl ConnectionLimit {
    /// At most `max` open connections on the port named `port` (for logs).
    pub fn new(max: usize, port: &'static str) -> Self {
        ConnectionLimit {
            permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            port,
            rejected: None,
        }
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
                        return Poll::Ready(Some(Ok(Admitted {
                            io,
                            _permit: permit,
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
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
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
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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

/// A unix socket bound for the gRPC port, whose file is removed when the
/// server stops listening (when this, or the stream of its connections, is
/// dropped) unless another process has replaced it meanwhile.
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's device and inode, to recognise it at removal.
    file: (u64, u64),
}

impl UnixSocket {
    /// Binds a unix socket at `path` whose file has `mode` (e.g. `0o660`).
    ///
    /// A socket file already at `path` that no process listens on (left by
    /// a process that died) is replaced; the new socket is bound under a
    /// temporary name, given its mode and then renamed over it, so the path
    /// never holds a socket with other permissions.
    ///
    /// # Errors
    ///
    /// `AddrInUse` when a process listens at `path`; `AlreadyExists` when
    /// `path` is not a socket (it is left alone); any error binding,
    /// setting the mode or renaming, naming the path. Must be called within
    /// a tokio runtime.
    pub fn bind(path: &Path, mode: u32) -> io::Result<UnixSocket> {
        let named = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
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
        let file_name = path.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no file", path.display()),
            )
        })?;
        let temporary = path.with_file_name(format!(
            ".{}.{}.tmp",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        // Left by this same process id before, if at all.
        let _ = std::fs::remove_file(&temporary);
        let listener = UnixListener::bind(&temporary).map_err(|e| named(e, "cannot bind"))?;
        let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
            .and_then(|()| std::fs::rename(&temporary, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&temporary);
            return Err(named(e, "cannot place the socket at"));
        }
        let meta = std::fs::symlink_metadata(path).map_err(|e| named(e, "cannot inspect"))?;
        Ok(UnixSocket {
            listener,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
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
