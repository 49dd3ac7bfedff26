//! `POST /v1/rerank` in the shape Cohere and Jina define and LangChain, LlamaIndex and most
//! retrieval stacks call: `{"model", "query", "documents", "top_n", "return_documents"}` to
//! `{"id", "results": [{"index", "relevance_score", "document"}], "usage", "meta"}`, best
//! first.
//!
//! Documents are strings or `{"text": ...}` objects; each is scored against the query by a
//! served cross-encoder (a classifier of one label), its relevance the sigmoid of the logit
//! (0 to 1, as Cohere's). Long documents are truncated to the model's token limit (the
//! providers' behaviour: a retrieval stack sends whatever its chunker made) unless the request
//! says `"truncate": false`; `max_chunks_per_doc` (splitting a document into several scored
//! chunks) is refused by name. Errors use the `/v1` format (OpenAI's `{"error": {...}}`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::body::Body;
use crate::deadline::Arrival;
use crate::metrics::{phase, Phase};
use crate::openai::OpenAiError;
use crate::state::AppState;
use crate::Error;
use streampool_core::ServedModel;
use streampool_nn::Quoted;

#[derive(Deserialize)]
struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: bool,
    #[serde(default)]
    max_chunks_per_doc: Option<usize>,
    /// Not the providers': `false` refuses a document over the token limit instead of
    /// truncating it.
    #[serde(default)]
    truncate: Option<bool>,
}

/// A document: a string, or an object with a `text` (Cohere's and Jina's object form).
#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn into_text(self) -> String {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

#[derive(Serialize)]
struct RerankResponse<'a> {
    id: String,
    model: &'a str,
    results: Vec<Ranked>,
    usage: Usage,
    meta: Meta,
}

#[derive(Serialize)]
struct Ranked {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize)]
struct DocumentText {
    text: String,
}

#[derive(Serialize)]
struct Usage {
    total_tokens: usize,
}

/// Cohere's accounting: one search unit per query (of up to 100 documents).
#[derive(Serialize)]
struct Meta {
    billed_units: BilledUnits,
}

#[derive(Serialize)]
struct BilledUnits {
    search_units: usize,
}

/// Answers are numbered per process, so a client can quote one in a report.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `POST /v1/rerank`: see the module docs.
pub async fn rerank(
    State(state): State<Arc<AppState>>,
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, OpenAiError> {
    phase(Phase::Read);
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let req: RerankRequest = serde_json::from_slice(&body)
        .map_err(|e| Error::BadRequest(format!("malformed rerank request: {e}")))?;
    if req.max_chunks_per_doc.is_some() {
        return Err(Error::BadRequest(
            "max_chunks_per_doc is not supported: documents are truncated to the model's \
             token limit; split long documents before ranking them"
                .into(),
        )
        .into());
    }
    let name = match req.model.as_deref() {
        Some(name) => name.to_string(),
        // The first reranker: a classifier of one label.
        None => state
            .registry
            .snapshot()
            .into_iter()
            .find(|(_, m)| matches!(&**m, ServedModel::Classifier(c) if c.labels().len() == 1))
            .map(|(name, _)| name)
            .ok_or_else(|| Error::NotFound("no reranker model is served".into()))?,
    };
    let model = state.registry.get(&name)?;
    let ServedModel::Classifier(c) = &*model else {
        return Err(Error::BadRequest(format!("model {} is not a reranker", Quoted(&name))).into());
    };
    if c.labels().len() != 1 {
        return Err(Error::BadRequest(format!(
            "model {} is a classifier of {} labels, not a reranker",
            Quoted(&name),
            c.labels().len()
        ))
        .into());
    }
    if req.documents.is_empty() {
        return Err(Error::BadRequest("documents is an empty list".into()).into());
    }
    if req.documents.len() > state.config.max_inputs {
        return Err(Error::TooLarge(format!(
            "{} documents exceed the maximum of {} per request",
            req.documents.len(),
            state.config.max_inputs
        ))
        .into());
    }
    if req.top_n == Some(0) {
        return Err(Error::BadRequest("top_n must be at least 1".into()).into());
    }
    phase(Phase::Parse);
    let count = req.documents.len();
    let texts: Vec<String> = req.documents.into_iter().map(Document::into_text).collect();
    // The texts are needed again for `return_documents` only.
    let kept = req.return_documents.then(|| texts.clone());
    let tokens = c
        .tokenize_ranked(&req.query, texts, req.truncate.unwrap_or(true), deadline)
        .await?;
    let total_tokens = tokens.iter().map(|(ids, _)| ids.len()).sum();
    phase(Phase::Tokenize);
    let logits = c.logits(tokens, deadline).await?;
    phase(Phase::Queue);
    let mut results: Vec<Ranked> = logits
        .iter()
        .enumerate()
        .map(|(index, l)| Ranked {
            index,
            relevance_score: streampool_nn::tasks::sigmoid(l[0]),
            document: None,
        })
        .collect();
    // Best first; equal scores keep document order.
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    results.truncate(req.top_n.unwrap_or(count));
    if let Some(mut texts) = kept {
        for r in &mut results {
            r.document = Some(DocumentText {
                text: std::mem::take(&mut texts[r.index]),
            });
        }
    }
    let resp = Json(RerankResponse {
        id: format!("rerank-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        model: &name,
        results,
        usage: Usage { total_tokens },
        meta: Meta {
            billed_units: BilledUnits {
                search_units: count.div_ceil(100),
            },
        },
    })
    .into_response();
    phase(Phase::Encode);
    Ok(resp)
}
