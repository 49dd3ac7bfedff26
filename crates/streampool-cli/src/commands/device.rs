//! `--device` parsing shared by the subcommands.

use anyhow::{bail, Result};
use streampool::Device;

/// Opens the device named on the command line: `cpu`, `cuda`, `cuda:N`, `wgpu` (the adapter
/// `STREAMPOOL_WGPU_ADAPTER` names, else the best one) or `wgpu:ADAPTER` (an index or a part
/// of the adapter's name, e.g. `wgpu:llvmpipe`).
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
        s if s == "wgpu" || s.starts_with("wgpu:") => open_wgpu(s.strip_prefix("wgpu:")),
        other => {
            bail!("unknown device {other:?}: expected cpu, cuda, cuda:N, wgpu or wgpu:ADAPTER")
        }
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

#[cfg(feature = "wgpu")]
fn open_wgpu(adapter: Option<&str>) -> Result<Device> {
    Ok(match adapter {
        None => Device::wgpu()?,
        Some(a) => Device::wgpu_with(streampool::WgpuConfig {
            adapter: Some(a.to_string()),
            ..streampool::WgpuConfig::default()
        })?,
    })
}

#[cfg(not(feature = "wgpu"))]
fn open_wgpu(_adapter: Option<&str>) -> Result<Device> {
    bail!("this binary was built without wgpu support; rebuild with `--features wgpu`")
}
