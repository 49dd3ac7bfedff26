//! One module per subcommand.

pub mod bench;
pub mod check;
pub mod device;
pub mod embed;
pub mod fd_limit;
pub mod first_use;
pub mod loadgen;
pub mod serve;
pub mod soak;
pub mod startup;
