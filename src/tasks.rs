//! What runs beside the servers: background tasks stopped together, and a
//! server task that can be asked to drain.

use std::future::Future;
use std::time::Duration;

use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// Background tasks (sweep, reload, metrics upkeep), stopped together
/// after the servers.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Tasks {
    /// Spawns `task`, handing it the token that will stop it.
    pub(crate) fn spawn<F, Fut>(&mut self, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task(self.stop.clone()));
    }

    /// Stops every task and waits for them.
    pub(crate) async fn stop(mut self) {
        self.stop.cancel();
        while let Some(result) = self.tasks.join_next().await {
            if let Err(error) = result {
                tracing::error!(%error, "background task failed");
            }
        }
    }
}

/// A server running on its own task until it fails (with an `E`) or is
/// asked to stop.
#[derive(Debug)]
pub(crate) struct ServerTask<E> {
    stop: CancellationToken,
    handle: JoinHandle<Result<(), E>>,
    /// Set once the task has ended, so it is never awaited twice.
    finished: Option<Result<(), ServerFailed<E>>>,
}

/// Why a [`ServerTask`] ended other than by being asked to stop.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerFailed<E> {
    /// The server returned its error.
    #[error(transparent)]
    Serve(E),
    /// The server's task panicked or was cancelled.
    #[error("server task")]
    Task(#[source] JoinError),
}

impl<E: Send + 'static> ServerTask<E> {
    /// Spawns the server `serve` makes from the token that stops it
    /// gracefully.
    pub(crate) fn spawn<F, Fut>(serve: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(serve(stop.clone()));
        ServerTask {
            stop,
            handle,
            finished: None,
        }
    }

    /// Resolves when the server stops by itself (a failure, which
    /// [`ServerTask::stop`] then returns); at once if it has already.
    pub(crate) async fn stopped(&mut self) {
        if self.finished.is_none() {
            self.finished = Some(flatten((&mut self.handle).await));
        }
    }

    /// Asks the server to stop accepting and to finish what is in flight,
    /// for at most `drain`; past it, the server and its connections are
    /// dropped (streams such as gRPC health's Watch never end by
    /// themselves). Resolves once it has stopped.
    pub(crate) async fn stop(
        mut self,
        drain: Duration,
        what: &'static str,
    ) -> Result<(), ServerFailed<E>> {
        if let Some(finished) = self.finished.take() {
            return finished;
        }
        self.stop.cancel();
        match tokio::time::timeout(drain, &mut self.handle).await {
            Ok(result) => flatten(result),
            Err(_) => {
                tracing::warn!(
                    server = what,
                    ?drain,
                    "calls still in flight after transport.drain_timeout: closing their connections"
                );
                self.handle.abort();
                Ok(())
            }
        }
    }
}

fn flatten<E>(result: Result<Result<(), E>, JoinError>) -> Result<(), ServerFailed<E>> {
    match result {
        Ok(served) => served.map_err(ServerFailed::Serve),
        Err(error) => Err(ServerFailed::Task(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_that_stopped_by_itself_is_stopped_without_being_awaited_twice() {
        let mut failed = ServerTask::spawn(|_stop| async { Err("the server failed") });
        failed.stopped().await;
        let result = failed.stop(Duration::from_secs(1), "test").await;
        assert!(
            matches!(result, Err(ServerFailed::Serve("the server failed"))),
            "{result:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_will_not_drain_is_dropped_after_the_drain_timeout() {
        let stubborn = ServerTask::spawn(|_stop| async {
            std::future::pending::<()>().await;
            Ok::<(), std::convert::Infallible>(())
        });
        let started = tokio::time::Instant::now();
        let result = stubborn.stop(Duration::from_secs(3), "test").await;
        assert!(result.is_ok());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
