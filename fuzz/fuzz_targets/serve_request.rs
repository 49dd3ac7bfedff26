//! The full request-to-response path of the server: the router as a tower service (no
//! sockets), with the tiny embedder and an 8-wide MLP on the CPU. The first byte picks the
//! route (KServe JSON or binary, OpenAI, TEI), the rest is the body
//! (`streampool_serve::fuzzing::request`). Findings: a panic, an abort (run with
//! `-malloc_limit_mb` to make any single allocation over the bound one), a 500, a body that is
//! not the JSON its content type says, or `null` in a 200 answer.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use streampool_serve::fuzzing::Harness;

static HARNESS: OnceLock<Harness> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let harness = HARNESS.get_or_init(|| Harness::new().expect("the harness's models load"));
    if let Err(finding) = harness.run(data) {
        panic!("{finding}");
    }
});
