//! Accepting connections within a cap: each port admits at most
//! `transport.max_connections` open connections, and closes any connection
//! past it at once (a client sees it closed rather than hanging in the
//! backlog, and can try another replica).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::Stream;
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
