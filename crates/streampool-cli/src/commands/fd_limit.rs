//! The process's open-file limit (`RLIMIT_NOFILE`): raised to its hard limit at start-up,
//! as nginx and most servers do (the soft limit is often 1,024, a few hundred idle clients'
//! worth), and what `--max-connections` must fit in.

/// Descriptors kept for everything but served connections: the listener, the refusals the
/// server answers at once past its connection cap (64), model files, the runtime's epoll
/// and event descriptors, logs.
const RESERVED: usize = 256;

/// Raises the soft open-file limit to the hard limit and logs both; returns the soft limit
/// in force afterwards (`None` where it cannot be read).
#[cfg(unix)]
pub fn raise() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "could not read the open-file limit"
        );
        return None;
    }
    let before = lim.rlim_cur;
    // macOS refuses an unlimited soft limit for files; its kernel maximum is what works.
    #[cfg(target_os = "macos")]
    let hard = lim.rlim_max.min(10_240);
    #[cfg(not(target_os = "macos"))]
    let hard = lim.rlim_max;
    if hard > before {
        let raised = libc::rlimit {
            rlim_cur: hard,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` through a pointer to a live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = hard;
        } else {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                soft = before,
                hard,
                "could not raise the open-file limit to its hard limit"
            );
        }
    }
    tracing::info!(
        soft = lim.rlim_cur,
        hard = lim.rlim_max,
        was = before,
        "open-file limit (RLIMIT_NOFILE)"
    );
    Some(usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX))
}

#[cfg(not(unix))]
pub fn raise() -> Option<usize> {
    None
}

/// `wanted` connections, lowered (with a warning) so that they and [`RESERVED`] other
/// descriptors fit in the open-file limit `open_files`: the server then refuses connections
/// past its cap with a clear 503 instead of failing to accept them.
pub fn fit_connections(wanted: usize, open_files: Option<usize>) -> usize {
    let Some(limit) = open_files else {
        return wanted;
    };
    let room = if limit > 2 * RESERVED {
        limit - RESERVED
    } else {
        limit / 2
    }
    .max(1);
    if wanted > room {
        tracing::warn!(
            wanted,
            open_file_limit = limit,
            max_connections = room,
            "--max-connections lowered to fit the open-file limit (raise its hard limit: \
             `ulimit -Hn`, docker --ulimit nofile, deploy/README.md)"
        );
        room
    } else {
        wanted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_fit_the_open_file_limit() {
        assert_eq!(fit_connections(4096, None), 4096);
        assert_eq!(fit_connections(4096, Some(1 << 20)), 4096);
        assert_eq!(fit_connections(4096, Some(1024)), 1024 - RESERVED);
        assert_eq!(fit_connections(100, Some(1024)), 100);
        assert_eq!(fit_connections(4096, Some(256)), 128);
        assert_eq!(fit_connections(4096, Some(1)), 1);
    }

    #[cfg(unix)]
    #[test]
    fn raising_leaves_the_soft_limit_at_most_the_hard_limit() {
        let soft = raise().expect("getrlimit works on unix");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a pointer to a live local.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX), soft);
        assert!(lim.rlim_cur <= lim.rlim_max);
    }
}
