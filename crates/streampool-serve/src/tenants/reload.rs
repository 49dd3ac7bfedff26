//! The tenants in force ([`TenantTable`]), and re-reading the tenants file while serving.
//!
//! A task reads the file every poll interval and hands its content to
//! [`TenantTable::reload`], which does nothing when the content's SHA-256 is the one in
//! force, and otherwise parses it and swaps the table whole, so a request sees one version
//! of it. The content is compared, not the modification time: a Kubernetes Secret update
//! swaps a symlink (the file's own mtime need not move), and two writes within one
//! timestamp tick share an mtime. Reading a file of a thousand tenants (about 100 KB) and
//! hashing it every two seconds costs well under a millisecond of one core.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{at, sha256, Sha256Digest, Tenant, Tenants};
use crate::{Error, Result};

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

/// The tenants in force: swapped whole when the file is reloaded, so a request sees one
/// version of the table.
#[derive(Debug)]
pub(crate) struct TenantTable {
    /// Read for each lookup (a hash-map probe and a 32-byte comparison); written only to
    /// swap in a reloaded table. Never held across an await.
    current: RwLock<Arc<Tenants>>,
    /// The SHA-256 of the file content `current` was parsed from (`None`: not from a file),
    /// so a poll that reads the same content does nothing. Held only to read or set it.
    loaded: Mutex<Option<Sha256Digest>>,
}

impl TenantTable {
    /// A table of `tenants`, not from a file.
    pub(crate) fn new(tenants: Tenants) -> Self {
        Self {
            current: RwLock::new(Arc::new(tenants)),
            loaded: Mutex::new(None),
        }
    }

    /// The tenants of the file at `path`.
    pub(crate) fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read(path)
            .map_err(|e| Error::Tenants(format!("reading {}: {e}", path.display())))?;
        let table = Self::new(Tenants::default());
        let count = table.reload(&text).map_err(|e| at(path, e))?;
        if count == Some(0) {
            tracing::warn!(
                path = %path.display(),
                "the tenants file has no tenants: every request that needs a key is refused"
            );
        }
        Ok(table)
    }

    /// The tenant whose key is `token`, if any.
    pub(crate) fn authenticate(&self, token: &[u8]) -> Option<Arc<Tenant>> {
        // Hashed before the lock: the lock covers only the probe.
        let digest = sha256(token);
        self.current.read().find(&digest).cloned()
    }

    /// The tenants in force now.
    pub(crate) fn snapshot(&self) -> Arc<Tenants> {
        self.current.read().clone()
    }

    /// Puts the tenants of the file content `text` in force, unless it is the content
    /// already in force. Returns how many tenants are now in force, or `None` when the
    /// content did not change. On error the tenants in force stay.
    pub(crate) fn reload(&self, text: &[u8]) -> Result<Option<usize>> {
        let digest = sha256(text);
        if *self.loaded.lock() == Some(digest) {
            return Ok(None);
        }
        let text = std::str::from_utf8(text)
            .map_err(|_| Error::Tenants("the file is not UTF-8 text".into()))?;
        // Parsed outside the write lock, so lookups go on meanwhile; only the reload task
        // writes, so nothing changes `current` between this read and the swap.
        let next = Tenants::parse_after(text, Some(&self.snapshot()))?;
        let count = next.len();
        *self.current.write() = Arc::new(next);
        *self.loaded.lock() = Some(digest);
        Ok(Some(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{Limit, Outcome};

    const KEY_A: &str = "sp-a-0123456789abcdef";
    const KEY_B: &str = "sp-b-0123456789abcdef";

    #[test]
    fn a_reload_swaps_the_table_and_keeps_state_by_name() {
        let first = format!(
            "[[tenant]]\nname = \"a\"\nkey = \"{KEY_A}\"\nrequests_per_second = 1.0\n\
             [[tenant]]\nname = \"b\"\nkey = \"{KEY_B}\"\n"
        );
        let table = TenantTable::new(Tenants::default());
        assert_eq!(table.reload(first.as_bytes()).unwrap(), Some(2));
        // The same content again: nothing to do.
        assert_eq!(table.reload(first.as_bytes()).unwrap(), None);
        let a = table.authenticate(KEY_A.as_bytes()).unwrap();
        let running = a.admit().unwrap();
        assert!(a.admit().is_err(), "the one request of the second is taken");
        // a's key changes, b goes, c comes; a's drained bucket and request in flight stay.
        let second = format!(
            "[[tenant]]\nname = \"a\"\nkey = \"{KEY_B}\"\nrequests_per_second = 1.0\n\
             [[tenant]]\nname = \"c\"\nkey = \"{KEY_A}\"\n"
        );
        assert_eq!(table.reload(second.as_bytes()).unwrap(), Some(2));
        let a2 = table.authenticate(KEY_B.as_bytes()).unwrap();
        assert_eq!(a2.name(), "a");
        assert_eq!(a2.in_flight(), 1);
        assert_eq!(a2.admit().unwrap_err().limit, Limit::Requests);
        assert_eq!(table.authenticate(KEY_A.as_bytes()).unwrap().name(), "c");
        running.finish(axum::http::StatusCode::OK);
        assert_eq!((a2.in_flight(), a2.requests(Outcome::Ok)), (0, 1));
        // A file that does not parse leaves the table as it was.
        assert!(table.reload(b"[[tenant]]\nname = 1\n").is_err());
        assert!(table.reload(&[0xff, 0xfe]).is_err());
        assert_eq!(table.snapshot().len(), 2);
        assert!(table.authenticate(KEY_B.as_bytes()).is_some());
    }
}
