//! The short fuzz run CI makes: the committed seeds of `fuzz/seeds/` and a
//! fixed-seed mutation run over them, through the same harness the cargo-fuzz targets drive
//! (`streampool_serve::fuzzing`), with no sanitizer build. The coverage-guided runs are
//! longer and documented in `fuzz/README.md`; any crash input they find is committed to
//! `fuzz/seeds/` and so replayed here from then on.
//!
//! A finding fails the test: a panic, a 500, a malformed or `null`-carrying answer, or a
//! single allocation over [`ALLOC_LIMIT`] (the test binary's allocator, defined here, refuses
//! it, which aborts the process, as an 8 TiB request once did). That allocator is the whole
//! binary's, so every server test of this crate runs under the same bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use streampool_serve::fuzzing::{decode_embeddings_input, decode_kserve, Harness};

/// The largest single allocation a request may cause. The harness's body limit is 64 KiB;
/// decoded tensors, tokenization and the model's buffers stay far below this.
const ALLOC_LIMIT: usize = 256 << 20;

struct Bounded;

// SAFETY: forwards to the system allocator unchanged; refusing (null) is allowed by the
// `GlobalAlloc` contract, and the standard library then reports the failed allocation.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller upholds `alloc`'s contract, which `System.alloc` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `dealloc`; `new_size` is non-zero by the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Bounded = Bounded;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    let out: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).expect("seed"))
        .collect();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// Numbers that sit on the edges the decoders must hold: sizes past usize, i64 and f32,
/// negative and zero dimensions, element counts that overflow when multiplied.
const INTERESTING: [&str; 16] = [
    "0",
    "-1",
    "1",
    "4294967296",
    "3037000500",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "1e39",
    "1e38",
    "-1e309",
    "65536",
    "2147483648",
    "100000000",
    "0.5",
    "30522",
];

/// One mutation of `input`, libFuzzer-style, plus a structure-aware one that swaps a JSON
/// number for an interesting one.
fn mutate(rng: &mut StdRng, input: &[u8], pool: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = rng.gen_range(1..=4);
    for _ in 0..rounds {
        match rng.gen_range(0..7) {
            0 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                out[i] = rng.gen();
            }
            2 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                let n = rng.gen_range(1..=8).min(out.len() - i);
                out.drain(i..i + n);
            }
            3 => {
                let i = rng.gen_range(0..=out.len());
                let b = *b"[]{},:\"0123456789.-e";
                out.insert(i, b[rng.gen_range(0..b.len())]);
            }
            4 => {
                // Splice with another seed.
                let other = &pool[rng.gen_range(0..pool.len())];
                if !other.is_empty() && !out.is_empty() {
                    let at = rng.gen_range(0..out.len());
                    let from = rng.gen_range(0..other.len());
                    out.truncate(at);
                    out.extend_from_slice(&other[from..]);
                }
            }
            _ => {
                // Swap a number for an interesting one.
                let spans = number_spans(&out);
                if !spans.is_empty() {
                    let (a, b) = spans[rng.gen_range(0..spans.len())];
                    let n = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                    out.splice(a..b, n.bytes());
                }
            }
        }
    }
    out
}

/// Byte ranges of the JSON numbers in `s` (digits, sign, dot, exponent).
fn number_spans(s: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i].is_ascii_digit() || (s[i] == b'-' && s.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            i += 1;
            while i < s.len() && matches!(s[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    spans
}

/// Runs the seeds and `mutations` mutants of them through `one`; returns how many ran.
fn run(target: &str, mutations: usize, mut one: impl FnMut(&[u8])) -> usize {
    let pool = seeds(target);
    for s in &pool {
        one(s);
    }
    let mut rng = StdRng::seed_from_u64(25);
    for _ in 0..mutations {
        let base = &pool[rng.gen_range(0..pool.len())];
        one(&mutate(&mut rng, base, &pool));
    }
    pool.len() + mutations
}

#[test]
fn serve_request_seeds_and_mutants_find_nothing() {
    let harness = Harness::new().expect("harness");
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    // Every seed is a valid request: it must be answered 200.
    for (i, s) in seeds("serve_request").iter().enumerate() {
        assert_eq!(harness.run(s), Ok(200), "seed {i} is a valid request");
    }
    let n = run("serve_request", 20_000, |data| match harness.run(data) {
        Ok(status) => *statuses.entry(status).or_default() += 1,
        Err(finding) => panic!("finding for input {data:?}: {finding}"),
    });
    println!("serve_request: {n} inputs, answers by status {statuses:?}");
    // The mutants reach past the parsers: some are still valid, most are refused.
    assert!(
        statuses.get(&200).copied().unwrap_or(0) > 50,
        "{statuses:?}"
    );
    assert!(
        statuses.keys().any(|s| (400..500).contains(s)),
        "{statuses:?}"
    );
}

#[test]
fn kserve_decoder_seeds_and_mutants_find_nothing() {
    let n = run("kserve_decode", 20_000, decode_kserve);
    println!("kserve_decode: {n} inputs");
}

#[test]
fn embeddings_input_decoder_seeds_and_mutants_find_nothing() {
    let n = run("embeddings_input", 20_000, decode_embeddings_input);
    println!("embeddings_input: {n} inputs");
}
