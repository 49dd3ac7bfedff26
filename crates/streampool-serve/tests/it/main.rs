//! The integration tests of `streampool-serve`: one test binary (each binary links the whole
//! dependency tree, which dominates a 2-core CI's build), a module per area, and `util` for
//! starting a test server and comparing answers. The Python client checks live in
//! `tests/clients/`.
//!
//! Every test of this binary runs under `fuzz_replay`'s bounded allocator: one allocation
//! sized by a client aborts the process, whichever test sent it.

mod auth;
mod clients;
#[cfg(unix)]
mod drain;
mod fuzz_replay;
mod hostile;
mod overload;
mod replicas;
mod repository;
mod server;
mod tasks;
mod tei;
mod tenants;
mod tokenize_pool;
mod util;
