//! `--device` parsing shared by the subcommands.

use anyhow::{bail, Result};
use streampool::Device;

/// Opens the device named on the command line: `cpu`, `cuda` or `cuda:N`.
pub fn open(spec: &str) -> Result<Device> {
    match spec {
        "cpu" => Ok(Device::cpu()),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal: usize = s
                .strip_prefix("cuda:")
                .map(str::parse)
                .transpose()?
                .unwrap_or(0);
            open_cuda(ordinal)
        }
        other => bail!("unknown device {other:?}: expected cpu, cuda or cuda:N"),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    Ok(Device::cuda(ordinal)?)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device> {
    bail!("this binary was built without CUDA support; rebuild with `--features cuda`")
}
