//! Tenants: several API keys, each with a name, the models it may call and optional
//! limits, read from a TOML file ([`ServeConfig::tenants_file`](crate::ServeConfig::tenants_file))
//! and re-read while serving when it changes.
//!
//! ```toml
//! [[tenant]]
//! name = "search"                  # in /metrics and in 429 messages; never the key
//! key_sha256 = "9f86d081884c7d65..."   # hex SHA-256 of the key (or `key = "..."`: the key itself)
//! models = ["minilm", "rerank"]    # absent or ["*"]: every model
//! requests_per_second = 50.0       # optional limits
//! tokens_per_second = 200000.0
//! max_concurrent = 8
//!
//! [[tenant]]
//! name = "batch-jobs"
//! key = "sp-3f0c...e1"
//! ```
//!
//! **Keys.** Each tenant has exactly one of `key` (the key) or `key_sha256` (the hex
//! SHA-256 of the key, e.g. `printf %s "$KEY" | sha256sum`), so a file or Kubernetes Secret
//! need not hold usable keys. Only digests are kept in memory. A plain, unsalted hash is
//! enough because keys are random (use 32 random bytes, `openssl rand -hex 32`): nobody
//! can search a 256-bit key space from a leaked digest, whereas a short or guessable key
//! stored as a digest could be found by trying candidates.
//!
//! **Lookup.** The presented token is hashed (SHA-256) and the table is indexed by the
//! first 8 bytes of that digest; the tenant found there, if any, is confirmed by comparing
//! all 32 bytes in constant time (`subtle`). The map's own hashing and comparisons touch
//! only those 8 bytes of a digest an attacker cannot choose: making a token whose digest
//! starts with given bytes is a preimage search, so whatever timing reveals about which
//! prefixes are stored does not help forge a key, and the full comparison takes the same
//! time wherever the digests differ. A lookup costs one SHA-256 of the token, one hash-map
//! probe and one 32-byte comparison, whatever the number of tenants.
//!
//! **Models.** A tenant that may not call a model sees it as absent: the same 404 as an
//! unknown model on every route, its default models (TEI's routes, `/v1/embeddings` and
//! `/v1/rerank` without `model`) chosen among its own, and the model lists show only its
//! own (see [`Caller`]). Names in `models` need not be served (yet).
//!
//! **Limits** are described in `limits.rs` ([`Limits`]): token buckets of one second's
//! burst for requests and tokens per second, a counter for concurrent requests; past
//! them, 429 with `Retry-After`.
//!
//! **Reload.** The file is re-read every
//! [`ServeConfig::tenants_poll_interval`](crate::ServeConfig::tenants_poll_interval) and,
//! when its content changed, parsed and put in force at once for new requests; a file
//! that does not parse (or breaks a rule below) is logged and the tenants in force stay.
//! A tenant that keeps its name keeps its limits' state (a drained bucket stays drained,
//! requests in flight still count) and its counters, whatever else changed.
//!
//! **Rules.** Names are unique, non-empty, at most 128 characters without control
//! characters; keys are unique, non-empty, without whitespace or control characters; a
//! `key_sha256` is 64 hex digits; unknown fields are errors (a misspelt limit is not
//! silently ignored). A file of no tenants refuses every request that needs a key.
//!
//! A single [`ApiKey`] ([`ServeConfig::api_key`](crate::ServeConfig::api_key)) is served as
//! one tenant named [`DEFAULT_TENANT`], allowed every model, without limits.

mod caller;
mod limits;
mod reload;

pub use caller::{Caller, Kind};
pub use limits::{Admission, Limit, Limits, Outcome, Refusal};
pub(crate) use reload::{watch, TenantTable};

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{ApiKey, Error, Result};
use limits::TenantState;

/// The name of the tenant a single [`ApiKey`] is served as.
pub const DEFAULT_TENANT: &str = "default";

/// The longest tenant name accepted.
const MAX_NAME_CHARS: usize = 128;

/// A SHA-256 digest: of a key, or of the tenants file's content.
pub(crate) type Sha256Digest = [u8; 32];

/// The SHA-256 digest of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256::digest(bytes).into()
}

/// What the lookup map is keyed by: the first 8 bytes of a key's digest (see the module
/// docs for why only these).
fn prefix(digest: &Sha256Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// The models a tenant may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Models {
    /// Every model served, now or later.
    All,
    /// Only these names.
    Only(BTreeSet<String>),
}

/// One tenant: its name, the digest of its key, the models it may call and its limits.
/// Its `Debug` form leaves the digest out.
pub struct Tenant {
    name: String,
    digest: Sha256Digest,
    models: Models,
    limits: Limits,
    /// Limit state and counters, shared with the versions of this tenant before and after
    /// a reload.
    state: Arc<TenantState>,
}

impl Tenant {
    /// Its name (`streampool_tenant_*{tenant="..."}` in `/metrics`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The models it may call.
    pub fn models(&self) -> &Models {
        &self.models
    }

    /// Its limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether it may call the model named `model`.
    pub fn may_call(&self, model: &str) -> bool {
        match &self.models {
            Models::All => true,
            Models::Only(names) => names.contains(model),
        }
    }

    /// Requests that ended with `outcome` so far (over reloads, while it kept its name).
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.state.count(outcome)
    }

    /// Text tokens charged so far.
    pub fn tokens(&self) -> u64 {
        self.state.tokens()
    }

    /// Its requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.state.in_flight()
    }

    /// Counts a request refused by its limits.
    pub(crate) fn record_limited(&self) {
        self.state.record(Outcome::Limited);
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("models", &self.models)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// One `[[tenant]]` of the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_sha256: Option<String>,
    #[serde(default)]
    models: Option<Vec<String>>,
    #[serde(default)]
    requests_per_second: Option<f64>,
    #[serde(default)]
    tokens_per_second: Option<f64>,
    #[serde(default)]
    max_concurrent: Option<u32>,
}

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tenant: Vec<Entry>,
}

/// A table of tenants, looked up by key.
///
/// ```
/// use streampool_serve::Tenants;
/// let tenants = Tenants::parse(r#"
///     [[tenant]]
///     name = "search"
///     key = "sp-search-0123456789"
///     models = ["minilm"]
///     requests_per_second = 50.0
/// "#).unwrap();
/// let search = tenants.authenticate(b"sp-search-0123456789").unwrap();
/// assert_eq!(search.name(), "search");
/// assert!(search.may_call("minilm") && !search.may_call("rerank"));
/// assert!(tenants.authenticate(b"sp-search-012345678").is_none());
/// ```
#[derive(Debug, Default)]
pub struct Tenants {
    /// Every tenant, by name.
    tenants: Vec<Arc<Tenant>>,
    /// Index into `tenants` by [`prefix`] of the key's digest.
    by_prefix: HashMap<u64, usize>,
}

impl Tenants {
    /// The tenants of a tenants file's text (the format of the module docs).
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_after(text, None)
    }

    /// The tenants of the file at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Tenants(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| at(path, e))
    }

    /// One tenant named [`DEFAULT_TENANT`] with `key`, every model, no limits.
    pub fn single(key: &ApiKey) -> Self {
        let digest = key.digest();
        Self {
            tenants: vec![Arc::new(Tenant {
                name: DEFAULT_TENANT.into(),
                digest,
                models: Models::All,
                limits: Limits::default(),
                state: Arc::new(TenantState::new()),
            })],
            by_prefix: HashMap::from([(prefix(&digest), 0)]),
        }
    }

    /// The tenant whose key is `token`, if any (see the module docs for how).
    pub fn authenticate(&self, token: &[u8]) -> Option<&Arc<Tenant>> {
        self.find(&sha256(token))
    }

    /// The tenant named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.tenants[i])
    }

    /// Every tenant, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.tenants.iter()
    }

    /// How many tenants.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    fn find(&self, digest: &Sha256Digest) -> Option<&Arc<Tenant>> {
        let tenant = &self.tenants[*self.by_prefix.get(&prefix(digest))?];
        bool::from(tenant.digest[..].ct_eq(&digest[..])).then_some(tenant)
    }

    /// Parses `text`; a tenant named as one of `previous` takes over its limit state.
    fn parse_after(text: &str, previous: Option<&Tenants>) -> Result<Self> {
        let file: File = toml::from_str(text).map_err(|e| Error::Tenants(e.to_string()))?;
        let tenants = file
            .tenant
            .into_iter()
            .map(|entry| {
                let state = previous
                    .and_then(|p| p.get(&entry.name))
                    .map(|t| t.state.clone());
                Tenant::from_entry(entry, state)
            })
            .collect::<Result<Vec<_>>>()?;
        Self::build(tenants)
    }

    /// The table of `tenants`, checking that names and keys are unique.
    fn build(mut tenants: Vec<Tenant>) -> Result<Self> {
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = tenants.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Error::Tenants(format!(
                "two tenants are named {:?}",
                w[0].name
            )));
        }
        let mut by_prefix = HashMap::with_capacity(tenants.len());
        for (i, t) in tenants.iter().enumerate() {
            if let Some(j) = by_prefix.insert(prefix(&t.digest), i) {
                let other = &tenants[j].name;
                return Err(Error::Tenants(if tenants[j].digest == t.digest {
                    format!("tenants {other:?} and {:?} have the same key", t.name)
                } else {
                    // Two random keys do this once in ~10^16 pairs.
                    format!(
                        "the keys of tenants {other:?} and {:?} have SHA-256 digests that \
                         begin alike; change one of the keys",
                        t.name
                    )
                }));
            }
        }
        Ok(Self {
            tenants: tenants.into_iter().map(Arc::new).collect(),
            by_prefix,
        })
    }
}

impl Tenant {
    /// A tenant from its entry in the file, with `state` carried over from a tenant of the
    /// same name, or fresh.
    fn from_entry(e: Entry, state: Option<Arc<TenantState>>) -> Result<Self> {
        let bad = |what: String| Error::Tenants(format!("tenant {:?}: {what}", e.name));
        if e.name.trim().is_empty()
            || e.name.chars().count() > MAX_NAME_CHARS
            || e.name.chars().any(char::is_control)
        {
            return Err(bad(format!(
                "a name must be 1 to {MAX_NAME_CHARS} characters without control characters"
            )));
        }
        let digest = match (&e.key, &e.key_sha256) {
            (Some(key), None) => ApiKey::new(key).map_err(|e| bad(e.to_string()))?.digest(),
            (None, Some(hex)) => parse_hex_digest(hex)
                .ok_or_else(|| bad("key_sha256 must be 64 hexadecimal digits".into()))?,
            _ => return Err(bad("give exactly one of `key` and `key_sha256`".into())),
        };
        let models = match e.models.as_deref() {
            None => Models::All,
            Some([all]) if all == "*" => Models::All,
            Some(names) => {
                if names.iter().any(|n| n == "*") {
                    return Err(bad("\"*\" (every model) must be alone in `models`".into()));
                }
                if names.iter().any(|n| n.is_empty()) {
                    return Err(bad("an empty model name in `models`".into()));
                }
                Models::Only(names.iter().cloned().collect())
            }
        };
        let limits = Limits {
            requests_per_second: e.requests_per_second,
            tokens_per_second: e.tokens_per_second,
            max_concurrent: e.max_concurrent,
        };
        limits.check().map_err(bad)?;
        Ok(Tenant {
            name: e.name,
            digest,
            models,
            limits,
            state: state.unwrap_or_else(|| Arc::new(TenantState::new())),
        })
    }
}

/// `e` about the file at `path`: its message prefixed with the path.
fn at(path: &Path, e: Error) -> Error {
    match e {
        Error::Tenants(m) => Error::Tenants(format!("{}: {m}", path.display())),
        other => other,
    }
}

/// The 32 bytes of 64 hex digits (either case), or `None`.
fn parse_hex_digest(hex: &str) -> Option<Sha256Digest> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "sp-a-0123456789abcdef";

    fn hex(d: &Sha256Digest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn keys_may_be_given_plain_or_as_their_sha256() {
        // The digest of "test", as `printf %s test | sha256sum` prints it.
        let test_digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(hex(&sha256(b"test")), test_digest);
        let text = format!(
            "[[tenant]]\nname = \"a\"\nkey = \"{KEY_A}\"\n\
             [[tenant]]\nname = \"b\"\nkey_sha256 = \"{}\"\nmodels = [\"mlp\"]\n",
            test_digest.to_uppercase()
        );
        let t = Tenants::parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        let a = t.authenticate(KEY_A.as_bytes()).unwrap();
        assert_eq!((a.name(), a.models()), ("a", &Models::All));
        let b = t.authenticate(b"test").unwrap();
        assert_eq!(b.name(), "b");
        assert!(b.may_call("mlp") && !b.may_call("tiny-bert"));
        assert!(t.authenticate(b"tes").is_none());
        assert!(t.authenticate(test_digest.as_bytes()).is_none());
        assert!(t.authenticate(b"").is_none());
        assert_eq!(t.iter().map(|t| t.name()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(t.get("b").is_some() && t.get("c").is_none());
    }

    #[test]
    fn the_debug_form_leaves_the_key_out() {
        let t = Tenants::parse(&format!("[[tenant]]\nname = \"a\"\nkey = \"{KEY_A}\"\n")).unwrap();
        let shown = format!("{t:?}");
        assert!(shown.contains("\"a\""), "{shown}");
        assert!(
            !shown.contains(&hex(&sha256(KEY_A.as_bytes()))[..8]),
            "{shown}"
        );
    }

    #[test]
    fn broken_rules_are_errors_that_say_which() {
        let cases = [
            ("[[tenant]]\nname = \"a\"\n", "exactly one of"),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1-0123456789\"\nkey_sha256 = \"00\"\n",
                "exactly one of",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey_sha256 = \"0123\"\n",
                "64 hexadecimal",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"two words\"\n",
                "whitespace",
            ),
            (
                "[[tenant]]\nname = \"\"\nkey = \"k1-0123456789\"\n",
                "a name",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1-0123456789\"\nmodels = [\"*\", \"mlp\"]\n",
                "alone",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1-0123456789\"\nrequest_per_second = 5.0\n",
                "unknown field",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1-0123456789\"\n\
                 [[tenant]]\nname = \"a\"\nkey = \"k2-0123456789\"\n",
                "two tenants are named",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1-0123456789\"\n\
                 [[tenant]]\nname = \"b\"\nkey = \"k1-0123456789\"\n",
                "the same key",
            ),
            (
                "[[tenant]]\nname = \"a\"\nkey = \"k1\"\nmodels = \"mlp\"\n",
                "sequence",
            ),
            ("[[tenants]]\nname = \"a\"\n", "unknown field"),
            ("not toml", ""),
        ];
        for (text, says) in cases {
            let e = Tenants::parse(text).unwrap_err();
            assert!(matches!(e, Error::Tenants(_)), "{text}: {e:?}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
        // Integers are accepted for rates; no tenants at all is a valid (closed) table.
        let t = Tenants::parse(&format!(
            "[[tenant]]\nname = \"a\"\nkey = \"{KEY_A}\"\nrequests_per_second = 5\n"
        ))
        .unwrap();
        assert_eq!(t.get("a").unwrap().limits().requests_per_second, Some(5.0));
        assert!(Tenants::parse("").unwrap().is_empty());
    }

    #[test]
    fn a_single_key_is_the_default_tenant_allowed_everything() {
        let key = ApiKey::new(KEY_A).unwrap();
        let t = Tenants::single(&key);
        let d = t.authenticate(KEY_A.as_bytes()).unwrap();
        assert_eq!(d.name(), DEFAULT_TENANT);
        assert!(d.may_call("anything"));
        assert_eq!(d.limits(), &Limits::default());
    }

    #[test]
    fn a_thousand_tenants_load_and_each_key_finds_its_own() {
        let mut text = String::new();
        for i in 0..1000u32 {
            let key = format!(
                "sp-{i:04}-{}",
                hex(&sha256(&i.to_le_bytes()))[..32].to_owned()
            );
            if i % 2 == 0 {
                text += &format!("[[tenant]]\nname = \"t{i}\"\nkey = \"{key}\"\n");
            } else {
                let d = hex(&sha256(key.as_bytes()));
                text += &format!(
                    "[[tenant]]\nname = \"t{i}\"\nkey_sha256 = \"{d}\"\nmodels = [\"m{i}\"]\n\
                     requests_per_second = {i}.5\nmax_concurrent = 4\n"
                );
            }
        }
        let t = Tenants::parse(&text).unwrap();
        assert_eq!(t.len(), 1000);
        for i in 0..1000u32 {
            let key = format!(
                "sp-{i:04}-{}",
                hex(&sha256(&i.to_le_bytes()))[..32].to_owned()
            );
            let found = t.authenticate(key.as_bytes()).unwrap();
            assert_eq!(found.name(), format!("t{i}"));
            assert_eq!(found.may_call("m1"), i % 2 == 0 || i == 1);
        }
    }
}
