//! The KServe v2 decoder alone: bytes 0-1 the binary header length, the rest a body split,
//! parsed and decoded within an element limit (`streampool_serve::fuzzing::decode_kserve`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| streampool_serve::fuzzing::decode_kserve(data));
