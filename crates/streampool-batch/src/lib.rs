//! Dynamic batching over any model (work in progress).
