//! This crate's process-wide settings, in one place: [`Settings`] (where models are found,
//! the tokenization pool's size). The runtime's own tunables are
//! [`streampool::config::Tuning`]; `docs/configuration.md` lists the variables of both.
//!
//! As for the runtime: the values come from [`set`], when a program calls it before the
//! first use, else from the environment ([`Settings::from_env`], read once, on first use).
//! Nothing else in this crate reads the environment.
//!
//! ```
//! use streampool_nn::settings::{self, Settings};
//!
//! let mut s = Settings::from_env();
//! s.tokenize_threads = Some(2);
//! settings::set(s).unwrap();
//! assert_eq!(settings::settings().tokenize_threads, Some(2));
//! assert_eq!(streampool_nn::TokenizePool::global().threads(), 2);
//! ```

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::OnceLock;

use streampool::config::{read_vars, Var};

use crate::{Error, Result};

/// Environment variable naming an all-MiniLM-L6-v2 folder ([`Settings::minilm_dir`]).
pub const MINILM_DIR_ENV: &str = "STREAMPOOL_MINILM_DIR";
/// Environment variable naming streampool's cache folder ([`Settings::cache`]).
pub const CACHE_ENV: &str = "STREAMPOOL_CACHE";
/// Environment variable setting the tokenization pool's size ([`Settings::tokenize_threads`]).
pub const TOKENIZE_THREADS_ENV: &str = "STREAMPOOL_TOKENIZE_THREADS";

/// The settings of this crate.
///
/// ```
/// use std::ffi::OsString;
/// use streampool_nn::settings::Settings;
/// let s = Settings::from_vars(|name| match name {
///     "HOME" => Some(OsString::from("/home/me")),
///     _ => None,
/// });
/// assert_eq!(s.cache_dir(), Some("/home/me/.cache/streampool".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Settings {
    /// An all-MiniLM-L6-v2 folder: [`find_minilm`](crate::find_minilm) takes it over the
    /// cache's pointer.
    ///
    /// Variable `STREAMPOOL_MINILM_DIR`; default: unset.
    pub minilm_dir: Option<PathBuf>,
    /// streampool's cache folder, where `scripts/fetch-minilm.sh` leaves `minilm.path`.
    ///
    /// Variable `STREAMPOOL_CACHE`; default: `$HOME/.cache/streampool`.
    pub cache: Option<PathBuf>,
    /// The home folder, for the default cache folder.
    ///
    /// Variable `HOME`; default: unset.
    pub home: Option<PathBuf>,
    /// Threads of the tokenization pool ([`TokenizePool::global`](crate::TokenizePool));
    /// `1` tokenizes serially on one pool thread.
    ///
    /// Variable `STREAMPOOL_TOKENIZE_THREADS`; default: the cores this process may use.
    pub tokenize_threads: Option<usize>,
}

/// Every environment variable of [`Settings`].
pub const VARS: &[Var<Settings>] = &[
    Var {
        env: MINILM_DIR_ENV,
        field: "minilm_dir",
        ty: "Option<PathBuf>",
        default: "unset",
        doc: "An all-MiniLM-L6-v2 folder (config.json, tokenizer.json, model.safetensors); \
              it wins over the cache's pointer written by `scripts/fetch-minilm.sh`.",
        set: |s, v| {
            s.minilm_dir = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Var {
        env: CACHE_ENV,
        field: "cache",
        ty: "Option<PathBuf>",
        default: "`$HOME/.cache/streampool`",
        doc: "streampool's cache folder, where `scripts/fetch-minilm.sh` installs MiniLM and \
              leaves `minilm.path`.",
        set: |s, v| {
            s.cache = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Var {
        env: "HOME",
        field: "home",
        ty: "Option<PathBuf>",
        default: "unset",
        doc: "The home folder: the cache is its `.cache/streampool` when `STREAMPOOL_CACHE` \
              is unset.",
        set: |s, v| {
            s.home = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Var {
        env: TOKENIZE_THREADS_ENV,
        field: "tokenize_threads",
        ty: "Option<usize>",
        default: "the cores this process may use",
        doc: "Threads of the process's tokenization pool, started on first use; `1` \
              tokenizes serially on one pool thread.",
        set: |s, v| {
            s.tokenize_threads = Some(positive(v)?);
            Ok(())
        },
    },
];

fn positive(v: &OsStr) -> std::result::Result<usize, String> {
    v.to_str()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| "a positive integer".to_string())
}

impl Settings {
    /// The settings the environment gives, every other field at its default. Values that
    /// do not parse are logged as warnings and leave the default.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// The settings `get` gives values for (a variable's name to its value, as the
    /// environment does), every other field at its default.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Self {
        let mut s = Self::default();
        read_vars(&mut s, VARS, get);
        s
    }

    /// streampool's cache folder: `cache`, else `home/.cache/streampool`.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.cache
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".cache/streampool")))
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// The process's settings: those given to [`set`], else the environment's
/// ([`Settings::from_env`]), read on the first call.
///
/// ```
/// assert!(streampool_nn::settings::settings().tokenize_threads != Some(0));
/// ```
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(Settings::from_env)
}

/// Sets the process's settings. Call it once, at start-up, before the first tokenization or
/// model lookup.
///
/// # Errors
/// [`Error::Config`] when the settings are already fixed (by an earlier `set`, or by a first
/// use).
///
/// ```
/// use streampool_nn::settings::{self, Settings};
/// let mut s = Settings::from_env();
/// s.minilm_dir = Some("/models/all-MiniLM-L6-v2".into());
/// settings::set(s).unwrap();
/// assert!(settings::set(Settings::default()).is_err());
/// ```
pub fn set(settings: Settings) -> Result<()> {
    SETTINGS.set(settings).map_err(|_| {
        Error::Config(
            "streampool-nn's settings are already fixed: call streampool_nn::settings::set \
             once, before the first tokenization or model lookup"
                .into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn variables_set_their_fields() {
        let s = Settings::from_vars(|name| {
            let v = match name {
                "STREAMPOOL_MINILM_DIR" => "/m",
                "STREAMPOOL_CACHE" => "/c",
                "HOME" => "/h",
                "STREAMPOOL_TOKENIZE_THREADS" => " 3 ",
                _ => return None,
            };
            Some(v.into())
        });
        assert_eq!(s.minilm_dir.as_deref(), Some(Path::new("/m")));
        assert_eq!(s.cache_dir().as_deref(), Some(Path::new("/c")));
        assert_eq!(s.tokenize_threads, Some(3));
        assert_eq!(Settings::from_vars(|_| None), Settings::default());
        assert_eq!(Settings::default().cache_dir(), None);
        let bad = Settings::from_vars(|n| (n == TOKENIZE_THREADS_ENV).then(|| "0".into()));
        assert_eq!(bad.tokenize_threads, None);
    }

    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    const REGENERATE: &str =
        "cargo test -p streampool-nn --lib settings::tests::write_docs -- --ignored";

    /// `docs/configuration.md`'s table is [`VARS`]'s.
    #[test]
    fn docs_list_every_variable() {
        let table = streampool::config::markdown_table(VARS);
        let doc = Path::new(DOC);
        if let Err(e) =
            streampool::config::sync_docs_block(doc, "streampool-nn", &table, false, REGENERATE)
        {
            panic!("{e}");
        }
    }

    /// Rewrites `docs/configuration.md`'s table from [`VARS`].
    #[test]
    #[ignore = "writes docs/configuration.md"]
    fn write_docs() {
        let table = streampool::config::markdown_table(VARS);
        streampool::config::sync_docs_block(
            Path::new(DOC),
            "streampool-nn",
            &table,
            true,
            REGENERATE,
        )
        .unwrap();
    }
}
