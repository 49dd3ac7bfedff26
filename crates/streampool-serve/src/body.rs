//! Reading a request body within the server's limits: at most `max_body_bytes` (413), within
//! `body_timeout` of the headers (408), so neither a large nor a slow client can hold memory
//! or a task for long. Every handler that takes a body reads it through [`Body`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use futures_util::StreamExt;

use crate::state::AppState;
use crate::Error;

/// A request body, read whole within the limits of [`ServeConfig`](crate::ServeConfig).
/// Handlers take it as `Result<Body, Error>` to answer a refusal in their protocol's format.
pub struct Body(pub Bytes);

impl FromRequest<Arc<AppState>> for Body {
    type Rejection = Error;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Error> {
        let limit = state.config.max_body_bytes;
        let mut stream = req.into_body().into_data_stream();
        let read = async {
            // The common case is one chunk: kept as it is, without a copy.
            let mut chunks: Vec<Bytes> = Vec::new();
            let mut len = 0usize;
            while let Some(chunk) = stream.next().await {
                let chunk =
                    chunk.map_err(|e| Error::BadRequest(format!("reading the body: {e}")))?;
                len += chunk.len();
                if len > limit {
                    // Refused, but the rest (up to another `limit` bytes) is read and dropped
                    // before answering: a server that answers and closes while the client is
                    // still sending makes the client's TCP stack see a reset, and the client
                    // then loses the 413 (found as a flaky `IncompleteMessage` in the tests
                    // when a declared `Content-Length` was refused before reading). Nothing
                    // of it is kept, and the body timeout still bounds the time.
                    drop(chunks);
                    let mut drained = 0usize;
                    while drained <= limit {
                        match stream.next().await {
                            Some(Ok(more)) => drained += more.len(),
                            _ => break,
                        }
                    }
                    return Err(Error::PayloadTooLarge { limit });
                }
                chunks.push(chunk);
            }
            Ok(match chunks.len() {
                0 => Bytes::new(),
                1 => chunks.swap_remove(0),
                _ => Bytes::from(chunks.concat()),
            })
        };
        let timeout = state.config.body_timeout;
        let bytes = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| Error::BodyTimeout(timeout))??;
        Ok(Body(bytes))
    }
}
