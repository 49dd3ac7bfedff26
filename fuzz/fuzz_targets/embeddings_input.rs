//! OpenAI's and TEI's `input(s)` decoder alone (`streampool_serve::fuzzing::decode_embeddings_input`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| streampool_serve::fuzzing::decode_embeddings_input(data));
