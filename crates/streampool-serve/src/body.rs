//! Reading a request body within the server's limits: at most `max_body_bytes` (413), within
//! `body_timeout` of the headers (408), in chunks that are not absurdly small (413, see
//! [`chunks_allowed`]), so that neither a large, a slow nor a finely chunked client can
//! hold memory or a task for long, or buy more CPU than the same bytes sent whole. Every
//! handler that takes a body reads it through [`Body`].

use std::sync::Arc;

use axum::body::{BodyDataStream, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

use crate::state::AppState;
use crate::Error;

/// Chunks any body may arrive in, whatever its size.
const FREE_CHUNKS: usize = 4096;
/// Past [`FREE_CHUNKS`], one more chunk is allowed per this many bytes received.
const BYTES_PER_CHUNK: usize = 64;

/// How many chunks a body of `received` bytes may have arrived in: 4,096, plus one per 64
/// bytes. Every chunk costs the server a fixed amount of work (parsing its framing, handing
/// it from the connection to the handler) whatever its size, so a body sent as 1-byte
/// chunks would cost many times the same bytes sent whole; with this bound the per-chunk
/// work of a body of any size is at most about what its bytes cost anyway. Clients that
/// stream a body (`Transfer-Encoding: chunked`) write kilobytes per chunk, and a small JSON
/// body is accepted in any chunking.
pub(crate) fn chunks_allowed(received: usize) -> usize {
    FREE_CHUNKS + received / BYTES_PER_CHUNK
}

/// A request body, read whole within the limits of [`ServeConfig`](crate::ServeConfig).
/// Handlers take it as `Result<Body, Error>` to answer a refusal in their protocol's format.
///
/// A body whose declared `Content-Length` is over the limit is refused before any of it is
/// kept; with `Expect: 100-continue` it is refused before the client is told to send it
/// (no `100 Continue`: hyper sends that only when the body is first read).
pub struct Body(pub Bytes);

impl FromRequest<Arc<AppState>> for Body {
    type Rejection = Error;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Error> {
        let limit = state.config.max_body_bytes;
        let declared = declared_length(req.headers());
        let over = declared.is_some_and(|n| n > limit);
        if over && expects_continue(req.headers()) {
            // The client waits for `100 Continue` before sending: nothing to drain.
            return Err(Error::PayloadTooLarge { limit });
        }
        let mut stream = req.into_body().into_data_stream();
        let timeout = state.config.body_timeout;
        let read = async {
            if over {
                // As much as a body just over the limit would have had drained (see
                // `read_within`), but none of it kept.
                drain(&mut stream, limit.saturating_mul(2)).await;
                return Err(Error::PayloadTooLarge { limit });
            }
            read_within(&mut stream, limit, declared).await
        };
        let bytes = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| Error::BodyTimeout(timeout))??;
        Ok(Body(bytes))
    }
}

/// Reads the whole body if it is at most `limit` bytes, arrives in at most
/// [`chunks_allowed`] chunks and `declared` (its `Content-Length`, if any) sizes the buffer.
async fn read_within(
    stream: &mut BodyDataStream,
    limit: usize,
    declared: Option<usize>,
) -> Result<Bytes, Error> {
    // The common case is one chunk: kept as it is, without a copy. From the second on, all
    // are copied into one buffer (sized from `Content-Length` when there is one, else
    // doubling), never kept as a list of chunks to join at the end.
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut len = 0usize;
    let mut chunks = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Error::BadRequest(format!("reading the body: {e}")))?;
        len += chunk.len();
        chunks += 1;
        if len > limit {
            // Refused, but the rest (up to another `limit` bytes) is read and dropped
            // before answering: a server that answers and closes while the client is still
            // sending makes the client's TCP stack see a reset, and the client then loses
            // the 413 (found as a flaky `IncompleteMessage` in the tests when a declared
            // `Content-Length` was refused before reading). Nothing of it is kept, and the
            // body timeout still bounds the time.
            drop((first, joined));
            drain(stream, limit).await;
            return Err(Error::PayloadTooLarge { limit });
        }
        if chunks > chunks_allowed(len) {
            // Not drained: draining would cost the very per-chunk work this bound refuses.
            return Err(Error::TooLarge(format!(
                "request body sent in too many small chunks ({chunks} for {len} bytes; \
                 the limit is {FREE_CHUNKS} plus one per {BYTES_PER_CHUNK} bytes): send \
                 it in larger chunks"
            )));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            None => joined.extend_from_slice(&chunk),
            Some(one) => {
                let size = declared.unwrap_or(0).max(2 * len).min(limit);
                joined.reserve_exact(size);
                joined.extend_from_slice(&one);
                joined.extend_from_slice(&chunk);
            }
        }
    }
    Ok(match first {
        Some(one) => one,
        None => Bytes::from(joined),
    })
}

/// Reads and drops up to `bound` more bytes of the body, in at most
/// [`chunks_allowed`] chunks (see the comment in [`read_within`] on why a refused body is
/// drained at all).
async fn drain(stream: &mut BodyDataStream, bound: usize) {
    let (mut drained, mut chunks) = (0usize, 0usize);
    while drained <= bound && chunks <= chunks_allowed(drained) {
        match stream.next().await {
            Some(Ok(more)) => {
                drained += more.len();
                chunks += 1;
            }
            _ => break,
        }
    }
}

/// The body length the request declares (`Content-Length`), if any and well-formed (hyper
/// has already refused a malformed one).
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Whether the client waits for `100 Continue` before sending its body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}
