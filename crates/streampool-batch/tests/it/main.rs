//! The integration tests of `streampool-batch`: one test binary (each binary links the whole
//! dependency tree, which dominates a 2-core CI's build), a module per area, and `util` for
//! the test models and helpers they share.
//!
//! The modules that use tokio or the router's threads are built only without `--cfg loom`:
//! loom's types panic outside a loom model, and tokio has a loom mode of its own.

#[cfg(not(loom))]
mod batch_queue;
mod pipeline;
#[cfg(not(loom))]
mod policy;
#[cfg(not(loom))]
mod replicas;
#[cfg(not(loom))]
mod row_model;
mod util;
