//! Reading a request body within the server's limits: at most `max_body_bytes` (413), within
//! `body_timeout` of the headers (408), so neither a large nor a slow client can hold memory
//! or a task for long. Every handler that takes a body reads it through [`Body`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
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
        let too_large = || Error::PayloadTooLarge { limit };
        // A declared length over the limit is refused before reading a byte.
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
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
                    return Err(too_large());
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
