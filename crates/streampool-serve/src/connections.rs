//! Accepting and serving connections: HTTP/1 with keep-alive (hyper), each connection held to
//! the limits of [`ServeConfig`], and a graceful drain on shutdown.
//!
//! Every connection is in one of three phases, kept in its [`Activity`]:
//! - **head**: waiting for a request's headers, from the accept (first request) or from the
//!   first byte of a later request; closed past [`ServeConfig::header_read_timeout`];
//! - **busy**: a request is being read, handled or answered; the body and request timeouts
//!   bound this phase, not this module;
//! - **idle**: keep-alive, between an answer and the next request's first byte; closed past
//!   [`ServeConfig::keep_alive_timeout`].
//!
//! hyper's own `header_read_timeout` is not used: it starts when the connection becomes
//! ready for a request head, so it would close keep-alive connections after the header
//! timeout, and one knob could not be both short (for trickled headers) and longer than a
//! load balancer's idle timeout (for pooled connections).
//!
//! At most [`ServeConfig::max_connections`] connections are served at once; past it a new
//! connection is answered `503` (see [`refuse`]). A failed `accept` (out of descriptors,
//! out of memory) never ends the loop: it backs off briefly and tries again.

use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Request;
use axum::Router;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::ServeConfig;

/// Refusals answered at once, each holding a socket for at most twice [`REFUSAL_TIME`]; past this
/// many, a connection over the cap is closed without an answer. Counted on top of
/// [`ServeConfig::max_connections`] in the descriptors the server may hold.
pub(crate) const REFUSING_AT_ONCE: usize = 64;

/// How long a refusal waits for the request head it answers (a client sends its request
/// as soon as it is connected; one that has not by then is closed unanswered), and then
/// reads what the client sends after the answer, so that the close does not reset the
/// connection before the client has read the 503.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// The first pause after a failed `accept`, doubled on each failure in a row up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connection limits of [`ServeConfig`] this module applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    header_read_timeout: Duration,
    keep_alive_timeout: Duration,
    max_connections: usize,
}

impl Limits {
    pub(crate) fn new(config: &ServeConfig) -> Self {
        Self {
            header_read_timeout: config.header_read_timeout,
            keep_alive_timeout: config.keep_alive_timeout,
            max_connections: config.max_connections,
        }
    }
}

/// Serves `app` on `listener` until `stop` fires (or its sender is dropped), then drains:
/// the listener closes (new connections are refused by the kernel), idle connections close,
/// and this returns once every request already accepted has been answered.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: oneshot::Receiver<()>,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    // `true` once draining; every connection task watches it.
    let (drain_tx, drain_rx) = watch::channel(false);
    // Every connection task holds a receiver; `closed()` resolves when the last one ends.
    let (done_tx, done_rx) = watch::channel(());
    let mut stop = pin!(stop);
    let mut failures = AcceptFailures::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                failures.recovered();
                stream
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                let pause = failures.failed(&e);
                tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
        };
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let (app, drain, done) = (app.clone(), drain_rx.clone(), done_rx.clone());
                tokio::spawn(async move {
                    serve_connection(stream, app, limits, drain).await;
                    drop((permit, done));
                });
            }
            Err(_) => match refusing.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(async move {
                        refuse(stream, limits.max_connections).await;
                        drop(permit);
                    });
                }
                // Too many refusals in flight already: close at once.
                Err(_) => drop(stream),
            },
        }
    }
    drop(listener);
    // Sent to receivers that exist; none left means nothing to drain.
    let _ = drain_tx.send(true);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// Errors of one incoming connection (it went away before it was accepted): nothing to
/// wait for, accept the next.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Failed `accept`s in a row (e.g. `EMFILE`, out of descriptors): each pauses the loop
/// (the pending connection stays in the kernel's backlog, so trying again at once would
/// spin), and a burst is logged once when it starts and once when it ends.
#[derive(Default)]
struct AcceptFailures {
    in_a_row: u64,
}

impl AcceptFailures {
    /// Records a failure; returns how long to pause before the next `accept`.
    fn failed(&mut self, e: &io::Error) -> Duration {
        if self.in_a_row == 0 {
            tracing::error!(
                error = %e,
                "accept failed; pausing new connections (the open-file limit or \
                 --max-connections may need raising)"
            );
        }
        self.in_a_row += 1;
        let doublings = (self.in_a_row - 1).min(16) as u32;
        ACCEPT_BACKOFF_MIN
            .saturating_mul(1 << doublings)
            .min(ACCEPT_BACKOFF_MAX)
    }

    fn recovered(&mut self) {
        if self.in_a_row > 0 {
            tracing::warn!(failures = self.in_a_row, "accepting connections again");
            self.in_a_row = 0;
        }
    }
}

/// Answers a connection over [`ServeConfig::max_connections`]: `503` with `Retry-After: 1`
/// and `Connection: close`, so that a client or balancer sees why and retries (a plain
/// close would look like a crashed server, and not accepting at all would leave clients
/// waiting in the kernel's backlog until their connect timeout). The request head is read
/// first (a client that has not sent its request yet could take an early answer for a
/// broken connection), then what follows the answer is read and dropped briefly, so that
/// closing does not reset the connection before the client has read the answer. Each within
/// [`REFUSAL_TIME`].
async fn refuse(mut stream: TcpStream, max_connections: usize) {
    let body = format!(
        "{{\"error\":\"the server has {max_connections} connections open, its limit: retry \
         later\"}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buf = [0u8; 4096];
    let read_head = async {
        let mut head = Vec::new();
        // At most 16 KiB of head: past it, answer anyway.
        while head.len() < 16 << 10 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, io::Error>(())
    };
    if !matches!(
        tokio::time::timeout(REFUSAL_TIME, read_head).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let answer_and_linger = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut drained = 0usize;
        while drained < 64 << 10 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            drained += n;
        }
        Ok::<_, io::Error>(())
    };
    // Either way the socket closes here; the client may have gone away.
    let _ = tokio::time::timeout(REFUSAL_TIME, answer_and_linger).await;
}

/// Serves one connection until it ends, a timeout of [`Limits`] closes it, or a drain
/// closes it after its request in progress (if any) is answered.
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    mut drain: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            activity.busy();
            let idle = IdleWhenDropped(activity.clone());
            let answer = app.clone().oneshot(req);
            async move {
                let response = answer.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| Tracked { body, _idle: idle }),
                )
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The header timeout is this module's (see the module docs); hyper's would only take
    // effect with a timer, and none is set.
    builder.keep_alive(true).header_read_timeout(None);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut draining = false;
    loop {
        let check = activity.next_check(&limits);
        // The connection first: bytes that arrived by now count before a deadline that
        // passed while this task waited to run (a loaded server must not close a
        // keep-alive connection whose next request is already in its socket).
        tokio::select! {
            biased;
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            _ = tokio::time::sleep_until(check) => {
                if let Some(why) = activity.expired(&limits, Instant::now()) {
                    tracing::debug!("closing a connection: {why}");
                    break;
                }
            }
            // An error means the server is gone: drain as well.
            _ = drain.wait_for(|d| *d), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}

/// Where a connection is in its request cycle (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for a request head since this instant.
    Head(Instant),
    /// A request is being read, handled or answered.
    Busy,
    /// Between an answer and the next request since this instant.
    Idle(Instant),
}

/// The phase of one connection. Every change happens on the connection's own task (hyper
/// polls the reads, the handler and the response body there, and the timeouts are checked
/// there too), so the lock is never contended: it only makes the shared handle `Sync`.
struct Activity {
    phase: Mutex<Phase>,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Head(Instant::now())),
        }
    }

    /// A request head is complete and handed to the service.
    fn busy(&self) {
        *self.phase.lock() = Phase::Busy;
    }

    /// The answer is written (its body ended or was dropped).
    fn idle(&self) {
        *self.phase.lock() = Phase::Idle(Instant::now());
    }

    /// Bytes arrived: an idle connection starts a request head.
    fn read_some(&self) {
        let mut phase = self.phase.lock();
        if matches!(*phase, Phase::Idle(_)) {
            *phase = Phase::Head(Instant::now());
        }
    }

    /// When to look at the phase next: its deadline, or while busy (no deadline of this
    /// module) after the shorter timeout, so that a phase entered later is checked no later
    /// than its own deadline. An idle connection that starts a head is checked at its idle
    /// deadline first, so a head that follows an idle time closes at most one idle timeout
    /// late.
    fn next_check(&self, limits: &Limits) -> Instant {
        match *self.phase.lock() {
            Phase::Head(since) => since + limits.header_read_timeout,
            Phase::Idle(since) => since + limits.keep_alive_timeout,
            Phase::Busy => {
                Instant::now() + limits.header_read_timeout.min(limits.keep_alive_timeout)
            }
        }
    }

    /// Why the connection must close at `now`, if it must.
    fn expired(&self, limits: &Limits, now: Instant) -> Option<&'static str> {
        match *self.phase.lock() {
            Phase::Head(since) if now >= since + limits.header_read_timeout => {
                Some("request headers not received within the header read timeout")
            }
            Phase::Idle(since) if now >= since + limits.keep_alive_timeout => {
                Some("idle past the keep-alive timeout")
            }
            _ => None,
        }
    }
}

/// Marks the connection idle when the response body it is held by is done: hyper drops a
/// response body once its last frame is written (or the connection ends).
struct IdleWhenDropped(Arc<Activity>);

impl Drop for IdleWhenDropped {
    fn drop(&mut self) {
        self.0.idle();
    }
}

/// A response body that marks its connection idle when hyper is done with it.
struct Tracked {
    body: axum::body::Body,
    /// Held for its `Drop` only.
    _idle: IdleWhenDropped,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket that tells its [`Activity`] when bytes arrive.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
