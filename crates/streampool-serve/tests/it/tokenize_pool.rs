//! Requests over the inline limit tokenize on the process's tokenization pool: the answers
//! are those of the in-process embedder, in order, and a failing input fails the request
//! with its own message (the first in input order), as inline tokenization does.

use crate::util::{assert_close, embed_one, floats, start, test_config, EMBEDDER};
use serde_json::{json, Value};
use streampool_serve::ServeConfig;

/// 48 texts of mixed lengths, ASCII and not: over 1 KB in all.
fn bulk() -> Vec<String> {
    let words = [
        "the", "Cat", "sat,", "on", "a", "mat", "quietly", "today", "naïve",
    ];
    (0..48)
        .map(|i| {
            (0..1 + (i * 5) % 23)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_requests_tokenize_on_the_pool() {
    let texts = bulk();
    assert!(texts.iter().map(String::len).sum::<usize>() > 1024);
    let s = start(test_config(), vec![]).await;
    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": texts}),
        )
        .await
        .json()
        .await
        .unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), texts.len());
    let mut tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        assert_close(
            &floats(&data[i]["embedding"]),
            &embed_one(&s.embedder, text),
            1e-5,
            text,
        );
        tokens += s.embedder.tokenizer().encode_ids(text).unwrap().len();
    }
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_input_fails_a_bulk_request_with_its_message() {
    let config = ServeConfig {
        max_seq_len: Some(8),
        truncate: false,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let mut texts = vec!["short".to_string(); 40];
    texts[25] = "one two three four five six seven eight nine ten".into();
    texts[30] = "eleven twelve thirteen fourteen fifteen sixteen seventeen".into();
    texts.push("x".repeat(1024));
    let resp = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": texts}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    let body = resp.text().await.unwrap();
    // Text 25 (12 tokens) is the first too long, in input order.
    assert!(body.contains("input of 12 tokens"), "{body}");
    s.handle.shutdown().await.unwrap();
}
