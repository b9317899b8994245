//! Hot reload: the plugin directory is watched (notify, debounced) and the
//! registry brought in step with it on a dedicated thread, so compilation
//! never runs on the async runtime.

use super::Registry;
use notify_debouncer_full::notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long file events are gathered before a scan.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How often a directory with an unsettled file is scanned again.
const RESCAN: Duration = Duration::from_millis(100);
/// How often the directory is scanned with no event at all: a safety net
/// for a change whose event never came (an inotify queue overflow, a file
/// system without events). A file whose length and modification time are
/// unchanged costs one `stat`.
const IDLE_RESCAN: Duration = Duration::from_secs(2);

/// A running watcher; dropping it stops the thread.
pub struct PluginWatcher {
    // Dropping the debouncer closes the channel, which ends the thread.
    debouncer: Option<
        notify_debouncer_full::Debouncer<
            notify_debouncer_full::notify::RecommendedWatcher,
            notify_debouncer_full::RecommendedCache,
        >,
    >,
    thread: Option<JoinHandle<()>>,
}

impl PluginWatcher {
    /// Watches `dir` (not its subdirectories) and re-syncs `registry` on
    /// every change: create, modify, rename, delete of components and sidecars.
    pub fn start(registry: Arc<Registry>, dir: PathBuf) -> anyhow::Result<PluginWatcher> {
        let (tx, rx) = channel::<DebounceEventResult>();
        let mut debouncer = new_debouncer(DEBOUNCE, None, tx)?;
        debouncer.watch(&dir, RecursiveMode::NonRecursive)?;
        let thread = std::thread::Builder::new()
            .name("gavel-plugin-watch".into())
            .spawn(move || {
                let mut unsettled = false;
                loop {
                    let changed = match rx.recv_timeout(if unsettled { RESCAN } else { IDLE_RESCAN }) {
                        Ok(Ok(events)) => !events.is_empty(),
                        Ok(Err(errors)) => {
                            for e in errors {
                                tracing::warn!(error = %e, "plugin directory watch error");
                            }
                            true
                        }
                        Err(RecvTimeoutError::Timeout) => true,
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    if changed {
                        let span = tracing::info_span!("rule.reload", dir = %dir.display());
                        let _enter = span.enter();
                        unsettled = registry.sync_dir(&dir).unwrap_or_else(|e| {
                            tracing::error!(error = %e, "cannot read the plugin directory");
                            false
                        });
                    }
                }
            })?;
        Ok(PluginWatcher {
            debouncer: Some(debouncer),
            thread: Some(thread),
        })
    }
}

impl Drop for PluginWatcher {
    fn drop(&mut self) {
        self.debouncer.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
