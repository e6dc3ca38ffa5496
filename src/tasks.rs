//! What runs beside the servers: background tasks stopped together, and a
//! server task that can be asked to drain.

use std::future::Future;

use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::Error;

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

/// A server running on its own task until it fails or is asked to stop.
#[derive(Debug)]
pub(crate) struct ServerTask {
    stop: CancellationToken,
    handle: JoinHandle<Result<(), Error>>,
}

impl ServerTask {
    /// Spawns the server `serve` makes from the token that stops it
    /// gracefully.
    pub(crate) fn spawn<F, Fut>(serve: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(serve(stop.clone()));
        ServerTask { stop, handle }
    }

    /// Resolves when the server stops by itself (a failure).
    pub(crate) async fn stopped(&mut self) -> Result<(), Error> {
        flatten((&mut self.handle).await)
    }

    /// Asks the server to stop accepting and to finish what is in flight;
    /// resolves once it has.
    pub(crate) async fn stop(self) -> Result<(), Error> {
        self.stop.cancel();
        flatten(self.handle.await)
    }
}

fn flatten(result: Result<Result<(), Error>, JoinError>) -> Result<(), Error> {
    result.map_err(Error::Task).and_then(|inner| inner)
}
