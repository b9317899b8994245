//! The snapshot reader: one thread with a read-only connection of its own
//! reads a claimed batch's snapshots in one call, off the writer's thread
//! and transaction. Its page cache is small on purpose: in WAL mode a
//! connection discards its whole cache when a read starts after another
//! connection committed, and the cost of that grows with the cache (reads
//! of the database file go through mmap instead).

use crate::store::{StoreError, StoreResult};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

type Read = Box<dyn FnOnce(&Connection) + Send>;

/// The handle of the reader thread; the thread ends when it is dropped.
pub(crate) struct Reader {
    queue: mpsc::Sender<Read>,
}

impl Reader {
    pub(crate) fn start(conn: Connection) -> std::io::Result<Reader> {
        let (queue, mut reads) = mpsc::channel::<Read>(1024);
        std::thread::Builder::new()
            .name("gavel-sqlite-reader".into())
            .spawn(move || {
                while let Some(read) = reads.blocking_recv() {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&conn))).is_err() {
                        tracing::error!("a read on the SQLite reader panicked");
                    }
                    // A read never leaves a transaction open: an open one
                    // would keep the WAL from being checkpointed.
                    if !conn.is_autocommit()
                        && let Err(e) = conn.execute_batch("ROLLBACK")
                    {
                        tracing::error!(error = %e, "cannot end the reader's transaction");
                    }
                }
            })?;
        Ok(Reader { queue })
    }

    /// Runs `f` on the reader's connection.
    pub(crate) async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let read: Read = Box::new(move |conn| {
            let _ = reply.send(f(conn));
        });
        self.queue.send(read).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the SQLite reader has stopped".into())
}
