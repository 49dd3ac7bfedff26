//! Re-reading the tenants file while serving.
//!
//! A task reads the file every poll interval and hands its content to
//! [`TenantTable::reload`], which does nothing when the content's SHA-256 is the one in
//! force, and otherwise parses it and swaps the table. The content is compared, not the
//! modification time: a Kubernetes Secret update swaps a symlink (the file's own mtime
//! need not move), and two writes within one timestamp tick share an mtime. Reading a
//! file of a thousand tenants (about 100 KB) and hashing it every two seconds costs well
//! under a millisecond of one core.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::TenantTable;

/// Polls the file at `path` every `every` and reloads `table` when its content changed,
/// until the table is dropped (the server's state went away) or the task is aborted. A
/// file that cannot be read or parsed leaves the tenants in force and is logged as an
/// error, once per distinct error.
pub(crate) fn watch(table: &Arc<TenantTable>, path: PathBuf, every: Duration) -> JoinHandle<()> {
    let table: Weak<TenantTable> = Arc::downgrade(table);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick is at once; the file was read when the table was made.
        ticks.tick().await;
        let mut last_error: Option<String> = None;
        loop {
            ticks.tick().await;
            let file = path.clone();
            // Off the async workers: the file may sit on a slow (network) filesystem.
            let read = tokio::task::spawn_blocking(move || std::fs::read(file)).await;
            let Some(table) = table.upgrade() else {
                return;
            };
            let result = match read {
                Ok(Ok(text)) => table.reload(&text).map_err(|e| e.to_string()),
                Ok(Err(e)) => Err(format!("reading it: {e}")),
                Err(e) => Err(format!("the read task failed: {e}")),
            };
            match result {
                Ok(None) => {}
                Ok(Some(tenants)) => {
                    tracing::info!(path = %path.display(), tenants, "tenants file reloaded");
                    last_error = None;
                }
                Err(e) => {
                    if last_error.as_deref() != Some(e.as_str()) {
                        tracing::error!(
                            path = %path.display(),
                            error = %e,
                            "tenants file not reloaded; the tenants in force stay"
                        );
                        last_error = Some(e);
                    }
                }
            }
        }
    })
}
