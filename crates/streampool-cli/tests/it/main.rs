//! The `streampool` binary as a user runs it: one test binary for the CLI crate (each binary
//! links the whole workspace, minutes on a 2-core CI), a module per area.

mod request_cost;
mod soak;
mod tenants;
