//! `--device` parsing shared by the subcommands: one place that knows the spellings.
//!
//! | spelling | devices |
//! |---|---|
//! | `cpu` | the process-wide CPU device |
//! | `cpu:N` | separate CPU device number N (own stream pool and allocator); `cpu:0,cpu:1` gives two CPU replicas |
//! | `cuda`, `cuda:N` | GPU 0, GPU N (feature `cuda`) |
//! | `cuda:all` | every GPU the driver reports |
//! | `wgpu`, `wgpu:ADAPTER` | the best wgpu adapter (or `STREAMPOOL_WGPU_ADAPTER`), or the one an index or part of its name picks, e.g. `wgpu:llvmpipe` (feature `wgpu`) |
//! | `A,B,...` | each of them, in order (for `serve`: one model replica per device) |

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use streampool::{Device, DeviceConfig, DeviceKind};
use streampool_nn::ComputeDType;

/// The compute dtype a model runs in when `--dtype` is not given: f16 on CUDA (tensor cores,
/// fused attention; what an embedding server on an NVIDIA GPU runs, e.g. TEI's default), f32
/// on the CPU and on wgpu (whose f16 depends on the adapter).
pub fn default_dtype(dev: &Device) -> ComputeDType {
    match dev.kind() {
        DeviceKind::Cuda(_) => ComputeDType::F16,
        _ => ComputeDType::F32,
    }
}

/// Opens the one device named on the command line (`cpu`, `cpu:N`, `cuda`, `cuda:N`, `wgpu`
/// or `wgpu:ADAPTER`).
pub fn open(spec: &str) -> Result<Device> {
    let mut devices = open_all(spec)?;
    if devices.len() != 1 {
        bail!(
            "{spec:?} names {} devices; this command takes one",
            devices.len()
        );
    }
    Ok(devices.remove(0))
}

/// Opens every device of a comma-separated list (see the module table); each device at
/// most once.
pub fn open_all(spec: &str) -> Result<Vec<Device>> {
    let mut devices: Vec<Device> = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let opened = match part {
            "cpu" => vec![Device::cpu()],
            "cuda:all" => {
                let n = cuda_count()?;
                if n == 0 {
                    bail!("cuda:all: no CUDA GPU present");
                }
                (0..n).map(open_cuda).collect::<Result<_>>()?
            }
            s if s.starts_with("cpu:") => {
                let n: usize = s["cpu:".len()..]
                    .parse()
                    .with_context(|| format!("device {s:?}: expected cpu:N"))?;
                vec![separate_cpu(n)?]
            }
            s if s == "wgpu" || s.starts_with("wgpu:") => vec![open_wgpu(s.strip_prefix("wgpu:"))?],
            s if s == "cuda" || s.starts_with("cuda:") => {
                let ordinal: usize = s
                    .strip_prefix("cuda:")
                    .map(str::parse)
                    .transpose()
                    .with_context(|| format!("device {s:?}: expected cuda:N or cuda:all"))?
                    .unwrap_or(0);
                vec![open_cuda(ordinal)?]
            }
            other => bail!(
                "unknown device {other:?}: expected cpu, cpu:N, cuda, cuda:N, cuda:all, wgpu, wgpu:ADAPTER, or a comma-separated list"
            ),
        };
        for d in opened {
            if devices.iter().any(|seen| seen.same(&d)) {
                bail!("device {part:?} named twice in {spec:?}");
            }
            devices.push(d);
        }
    }
    Ok(devices)
}

/// CPU device number `n`: made once per process with its own pool and allocator, so
/// `cpu:0,cpu:1` are two devices (like two GPUs) and `cpu:0` names the same one each time.
fn separate_cpu(n: usize) -> Result<Device> {
    static CPUS: OnceLock<Mutex<HashMap<usize, Device>>> = OnceLock::new();
    // Held only to look up or insert one device; creating a CPU device waits on nothing.
    let mut map = CPUS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(d) = map.get(&n) {
        return Ok(d.clone());
    }
    let d = Device::cpu_with(DeviceConfig::default())?;
    map.insert(n, d.clone());
    Ok(d)
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    Ok(Device::cuda(ordinal)?)
}

#[cfg(feature = "cuda")]
fn cuda_count() -> Result<usize> {
    Ok(Device::cuda_count()?)
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

#[cfg(not(feature = "cuda"))]
fn cuda_count() -> Result<usize> {
    open_cuda(0).map(|_| 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings() {
        assert_eq!(open_all("cpu").unwrap().len(), 1);
        let two = open_all("cpu:0, cpu:1").unwrap();
        assert_eq!(two.len(), 2);
        assert!(!two[0].same(&two[1]));
        assert!(
            open_all("cpu:0").unwrap()[0].same(&two[0]),
            "cpu:N is one device per N"
        );
        assert!(open_all("cpu,cpu").is_err(), "a device named twice");
        assert!(open_all("cpu:x").is_err());
        assert!(open_all("tpu").is_err());
        assert!(
            open("cpu:0,cpu:1").is_err(),
            "one-device commands refuse a list"
        );
        #[cfg(not(feature = "cuda"))]
        assert!(open_all("cuda:all").is_err());
    }
}
