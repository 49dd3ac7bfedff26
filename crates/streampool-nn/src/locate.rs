//! Finding model folders: the tiny model shipped in the repository and an installed
//! all-MiniLM-L6-v2.

use std::path::{Path, PathBuf};

use crate::settings::{settings, CACHE_ENV, MINILM_DIR_ENV};
use crate::{Error, Result};
/// The shipped tiny model, relative to the workspace root.
pub const TINY_BERT_RELATIVE: &str = "models/tiny-bert";

/// Files a model folder must hold.
const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Whether `dir` holds `config.json`, `tokenizer.json` and `model.safetensors`.
pub fn is_model_dir(dir: &Path) -> bool {
    MODEL_FILES.iter().all(|f| dir.join(f).is_file())
}

/// `$STREAMPOOL_CACHE`, else `$HOME/.cache/streampool` (the process's
/// [`Settings::cache_dir`](crate::settings::Settings::cache_dir)).
pub fn cache_dir() -> Option<PathBuf> {
    settings().cache_dir()
}

/// The folder of an installed all-MiniLM-L6-v2: `$STREAMPOOL_MINILM_DIR` (the process's
/// [`Settings::minilm_dir`](crate::settings::Settings::minilm_dir)) if set, else the path in
/// `<cache>/minilm.path` written by `scripts/fetch-minilm.sh`. The error says where it
/// looked and how to install the model.
pub fn find_minilm() -> Result<PathBuf> {
    const HINT: &str = "run scripts/fetch-minilm.sh to install it (pip, ~83 MB) or set \
                        STREAMPOOL_MINILM_DIR to a folder with config.json, tokenizer.json and \
                        model.safetensors";
    if let Some(dir) = settings().minilm_dir.clone() {
        return if is_model_dir(&dir) {
            Ok(dir)
        } else {
            Err(Error::NotFound(format!(
                "the MiniLM folder {} ({MINILM_DIR_ENV}) does not hold {}",
                dir.display(),
                MODEL_FILES.join(", ")
            )))
        };
    }
    let Some(cache) = cache_dir() else {
        return Err(Error::NotFound(format!(
            "all-MiniLM-L6-v2: neither {MINILM_DIR_ENV}, {CACHE_ENV} nor HOME is set; {HINT}"
        )));
    };
    let pointer = cache.join("minilm.path");
    let text = std::fs::read_to_string(&pointer).map_err(|_| {
        Error::NotFound(format!(
            "all-MiniLM-L6-v2 is not installed ({} is missing); {HINT}",
            pointer.display()
        ))
    })?;
    let dir = PathBuf::from(text.trim());
    if is_model_dir(&dir) {
        Ok(dir)
    } else {
        Err(Error::NotFound(format!(
            "{} points to {}, which does not hold {}; {HINT}",
            pointer.display(),
            dir.display(),
            MODEL_FILES.join(", ")
        )))
    }
}

/// `models/tiny-bert` in the source tree this crate was built from (for tests and examples;
/// a binary moved elsewhere should use [`find_tiny_bert`]).
pub fn tiny_bert_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(TINY_BERT_RELATIVE)
}

/// `models/<name>` in the source tree this crate was built from: the shipped tiny
/// checkpoints of the other families (`tiny-xlmr`, `tiny-xlmr-reranker`,
/// `tiny-bert-classifier`, `tiny-mpnet`, `tiny-gte`, `tiny-nomic`, `tiny-modernbert`, `tiny-qwen3`; for tests and examples).
///
/// ```
/// assert!(streampool_nn::is_model_dir(&streampool_nn::tiny_model_dir("tiny-xlmr")));
/// ```
pub fn tiny_model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// Finds the shipped tiny model: `models/tiny-bert` under the current directory or any of
/// its parents, then under any parent of the running executable (e.g. `target/release/..`
/// of a checkout), then in the source tree this crate was built from.
pub fn find_tiny_bert() -> Result<PathBuf> {
    let mut tried = Vec::new();
    let cwd = std::env::current_dir().ok();
    let exe = std::env::current_exe().ok();
    let roots = cwd
        .iter()
        .flat_map(|d| d.ancestors())
        .chain(exe.iter().flat_map(|e| e.ancestors().skip(1)));
    for root in roots {
        let dir = root.join(TINY_BERT_RELATIVE);
        if is_model_dir(&dir) {
            return Ok(dir);
        }
        tried.push(dir);
    }
    let built = tiny_bert_dir();
    if is_model_dir(&built) {
        return Ok(built);
    }
    tried.push(built);
    Err(Error::NotFound(format!(
        "the tiny model {TINY_BERT_RELATIVE} was not found (looked in {}); pass a model folder",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}
