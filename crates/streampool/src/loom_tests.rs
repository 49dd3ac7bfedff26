//! loom models of the runtime's hand-offs (run with `RUSTFLAGS="--cfg loom"`).
