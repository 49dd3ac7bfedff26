//! The `device=` and `dtype=` spellings of the Python API (those of `streampool --device` and
//! `--dtype`, one device at a time).

use std::str::FromStr;

use streampool::{Device, DeviceKind};
use streampool_nn::ComputeDType;

use crate::{Error, Result};

/// Opens `"cpu"`, `"cuda"` or `"cuda:N"`.
pub fn open(spec: &str) -> Result<Device> {
    match spec.trim() {
        "cpu" => Ok(Device::cpu()),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal = match s.strip_prefix("cuda:") {
                None => 0,
                Some(n) => n.parse::<usize>().map_err(|_| {
                    Error::Value(format!(
                        "device {s:?}: expected \"cuda:N\" with N a GPU number"
                    ))
                })?,
            };
            open_cuda(ordinal)
        }
        other => Err(Error::Value(format!(
            "unknown device {other:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
        ))),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    Ok(Device::cuda(ordinal)?)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device> {
    Err(Error::Value(
        "this streampool build has no CUDA support; build the package with the `cuda` feature \
         (maturin build --features cuda)"
            .into(),
    ))
}

/// The compute dtype: the one named, else f16 on CUDA (tensor cores) and f32 on the CPU.
pub fn dtype(name: Option<&str>, device: &Device) -> Result<ComputeDType> {
    match name {
        Some(n) => ComputeDType::from_str(n).map_err(|e| Error::Value(e.to_string())),
        None => Ok(match device.kind() {
            DeviceKind::Cuda(_) => ComputeDType::F16,
            _ => ComputeDType::F32,
        }),
    }
}

/// The name Python sees for a device (`"cpu"`, `"cuda:0"`).
pub fn name(device: &Device) -> String {
    match device.kind() {
        DeviceKind::Cuda(n) => format!("cuda:{n}"),
        _ => "cpu".to_string(),
    }
}
