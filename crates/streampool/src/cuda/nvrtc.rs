//! Making the module image of one group of `kernels.cu` (`kernel_groups.rs`): the cubins
//! embedded at build time, the on-disk cache, or NVRTC.
//!
//! **Embedded first.** `build.rs` compiles every group for the architectures of
//! `EMBEDDED_ARCHS` (sm_80, sm_90) when the build finds NVRTC, and the library carries the
//! cubins: on those GPUs a new machine loads machine code and runs no compiler. A GPU of
//! compute capability 8.x runs the sm_80 cubin (cubins run on later minor versions of their
//! major architecture); 9.0 runs sm_90. An embedded cubin that the driver refuses (a driver
//! older than the NVRTC that built it, say) falls through to the paths below.
//!
//! **Cubin next.** Elsewhere NVRTC compiles for the GPU's own architecture (`sm_89` on an
//! L4) and hands back a cubin (`nvrtcGetCUBIN`): the driver loads its machine code as is.
//! PTX (the fallback, for an architecture this NVRTC cannot target, or with
//! `STREAMPOOL_CUDA_KERNELS=ptx`) is compiled again by the driver's JIT at module load, a
//! second compile on every start (the driver's own JIT cache, `~/.nv/ComputeCache`, helps
//! only where it is kept). A cubin also loads on a driver older than NVRTC, where newer
//! PTX would be refused. Each group is compiled alone (`-DSP_GROUP=n`), on its first launch
//! or on one of [`super::module::Module::load_all`]'s threads.
//!
//! **Disk cache.** A compiled image is stored in a [`DiskCache`] under a key made of
//! everything it depends on: the source, the NVRTC options (the group among them), NVRTC's
//! version, the GPU's compute capability and the output kind. A changed kernel, compiler or
//! GPU is another key, so an entry is never stale; an entry that fails to load is compiled
//! again and replaced. A cache that cannot be written is logged and costs only the compile.

use std::ffi::{c_char, CString};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{result, sys, Ptx};

use super::driver_err;
use crate::disk_cache::DiskCache;
use crate::phases::timed;
use crate::sync::Arc;
use crate::{Error, Result};

/// A cubin compiled at build time (`build.rs`): one group of `kernels.cu` for `sm_{arch}`.
pub(crate) struct EmbeddedImage {
    pub(crate) arch: u32,
    pub(crate) group: u32,
    pub(crate) image: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/embedded_kernels.rs"));

/// Where a group's image may come from (besides NVRTC, always the last resort).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ImageSources {
    /// The cubins embedded at build time, where the GPU runs one
    /// ([`DeviceConfig::embedded_kernels`](crate::DeviceConfig::embedded_kernels)).
    pub(crate) embedded: bool,
}

/// The embedded architecture whose cubins a GPU of compute capability `cc` runs: its own
/// (`9.0` runs sm_90) or, within compute capability 8, sm_80 (cubins run on later minor
/// versions of their major architecture, not on other majors).
pub(crate) fn embedded_arch(cc: Option<(i32, i32)>) -> Option<u32> {
    let (major, minor) = cc?;
    let (major, minor) = (u32::try_from(major).ok()?, u32::try_from(minor).ok()?);
    let own = major * 10 + minor;
    super::kernel_groups::EMBEDDED_ARCHS
        .iter()
        .copied()
        .filter(|&a| a / 10 == major && a <= own)
        .max()
}

/// The embedded cubin of group `group` for a GPU of compute capability `cc`, if the build
/// embedded one.
fn embedded(group: u32, cc: Option<(i32, i32)>) -> Option<&'static EmbeddedImage> {
    let arch = embedded_arch(cc)?;
    EMBEDDED.iter().find(|e| e.arch == arch && e.group == group)
}

/// Whether this build carries embedded kernels (for the start-up log).
pub(crate) fn embedded_nvrtc() -> Option<&'static str> {
    (!EMBEDDED.is_empty()).then_some(EMBEDDED_NVRTC)
}

/// What NVRTC hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    /// Machine code for one real architecture (`sm_XY`).
    Cubin,
    /// Virtual-architecture assembly, compiled by the driver at load.
    Ptx,
}

/// One way to build: the output kind and NVRTC's options for it.
struct Target {
    output: Output,
    options: Vec<String>,
}

/// What to try, in order, for a GPU of compute capability `cc`.
fn targets(cc: Option<(i32, i32)>, force_ptx: bool) -> Vec<Target> {
    let mut targets = Vec::new();
    if let (Some((major, minor)), false) = (cc, force_ptx) {
        targets.push(Target {
            output: Output::Cubin,
            options: vec![format!("--gpu-architecture=sm_{major}{minor}")],
        });
    }
    // The device's own virtual architecture (NVRTC's default may predate `__nanosleep`).
    let virtual_arch = match cc {
        Some((7, 5)) => Some("compute_75"),
        Some((8, 0)) => Some("compute_80"),
        Some((8, 6)) => Some("compute_86"),
        Some((8, 9)) => Some("compute_89"),
        Some((9, 0)) => Some("compute_90"),
        Some((10, 0)) => Some("compute_100"),
        Some((12, 0)) => Some("compute_120"),
        _ => None,
    };
    targets.push(Target {
        output: Output::Ptx,
        options: virtual_arch
            .map(|a| format!("--gpu-architecture={a}"))
            .into_iter()
            .collect(),
    });
    targets
}

/// The cache key: every input the image depends on. The format line is bumped if the
/// meaning of an image ever changes.
fn cache_key(
    name: &str,
    src: &str,
    target: &Target,
    nvrtc: (i32, i32),
    cc: Option<(i32, i32)>,
) -> Vec<u8> {
    let mut key = format!(
        "streampool kernel image v1\nname {name}\nnvrtc {}.{}\ncompute capability {cc:?}\n\
         output {:?}\noptions {}\nsource\n",
        nvrtc.0,
        nvrtc.1,
        target.output,
        target.options.join(" "),
    )
    .into_bytes();
    key.extend_from_slice(src.as_bytes());
    key
}

/// Group `(group name, SP_GROUP value)` of `kernels.cu` loaded into `ctx` as a module: the
/// embedded cubin where `sources` allows and the build has one for this GPU, else from
/// `disk` when it holds this build, else compiled (and stored there).
pub(crate) fn load_group(
    ctx: &Arc<CudaContext>,
    device: &str,
    (group, id): (&str, u32),
    cc: Option<(i32, i32)>,
    disk: Option<&DiskCache>,
    sources: ImageSources,
) -> Result<Arc<CudaModule>> {
    // PTX on request (the tunables' `cuda.nvrtc_output`), e.g. to compare with the cubin path.
    let force_ptx = crate::config::tuning().cuda.nvrtc_output == crate::config::NvrtcOutput::Ptx;
    if let (true, false, Some(e)) = (sources.embedded, force_ptx, embedded(id, cc)) {
        match timed("kernels loaded", || {
            module(ctx, Output::Cubin, e.image.to_vec())
        }) {
            Ok(m) => {
                tracing::debug!(device, group, arch = e.arch, "embedded kernels loaded");
                return Ok(m);
            }
            Err(err) => tracing::warn!(
                device,
                group,
                error = ?err,
                nvrtc = EMBEDDED_NVRTC,
                "the embedded kernels did not load; building them with NVRTC"
            ),
        }
    }
    let options = [format!("-DSP_GROUP={id}")];
    load(
        ctx,
        device,
        "streampool_kernels.cu",
        super::module::SOURCE,
        &options,
        cc,
        disk,
        force_ptx,
    )
}

/// `src` loaded into `ctx` as a module: from `disk` when it holds this build, else compiled
/// with `options` added to each target's (and stored there).
#[allow(clippy::too_many_arguments)]
fn load(
    ctx: &Arc<CudaContext>,
    device: &str,
    name: &str,
    src: &str,
    options: &[String],
    cc: Option<(i32, i32)>,
    disk: Option<&DiskCache>,
    force_ptx: bool,
) -> Result<Arc<CudaModule>> {
    let backend_err = |msg: String| Error::Backend {
        device: device.to_string(),
        msg,
    };
    // SAFETY: only tries to load the library; nothing is called through it.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Unavailable(format!(
            "{device}: libnvrtc not found, and this GPU has no kernels embedded in the build"
        )));
    }
    let nvrtc = version().map_err(|e| backend_err(format!("nvrtcVersion failed: {e:?}")))?;
    let mut targets = targets(cc, force_ptx);
    for t in &mut targets {
        t.options.extend_from_slice(options);
    }
    let last = targets.len() - 1;
    for (i, target) in targets.iter().enumerate() {
        let key = cache_key(name, src, target, nvrtc, cc);
        if let Some(cache) = disk {
            if let Some(image) = timed("kernels cache read", || cache.get(&key)) {
                let bytes = image.len();
                match timed("kernels loaded", || module(ctx, target.output, image)) {
                    Ok(m) => {
                        tracing::info!(
                            device,
                            output = ?target.output,
                            bytes,
                            path = %cache.path_for(&key).display(),
                            "kernels loaded from the disk cache"
                        );
                        return Ok(m);
                    }
                    Err(e) => tracing::warn!(
                        device,
                        error = ?e,
                        "cached kernels did not load; compiling them again"
                    ),
                }
            }
        }
        let began = std::time::Instant::now();
        let image = match timed("kernels compiled", || {
            compile(src, name, &target.options, target.output)
        }) {
            Ok(image) => image,
            Err(log) if i < last => {
                tracing::info!(device, options = ?target.options, log, "NVRTC cannot build a cubin here; falling back to PTX");
                continue;
            }
            Err(log) => {
                return Err(backend_err(format!(
                    "NVRTC compile of {name} failed: {log}"
                )))
            }
        };
        tracing::info!(
            device,
            output = ?target.output,
            options = ?target.options,
            nvrtc = %format!("{}.{}", nvrtc.0, nvrtc.1),
            seconds = began.elapsed().as_secs_f64(),
            "kernels compiled with NVRTC"
        );
        let module = match timed("kernels loaded", || {
            module(ctx, target.output, image.clone())
        }) {
            Ok(m) => m,
            Err(e) if i < last => {
                tracing::warn!(device, error = ?e, "the cubin did not load; falling back to PTX");
                continue;
            }
            Err(e) => return Err(driver_err(device, e)),
        };
        if let Some(cache) = disk {
            match cache.put(&key, &image) {
                Ok(path) => {
                    tracing::info!(path = %path.display(), "kernels stored in the disk cache")
                }
                Err(e) => tracing::warn!(
                    dir = %cache.dir().display(),
                    error = %e,
                    "kernel cache not writable: the next start compiles again"
                ),
            }
        }
        return Ok(module);
    }
    // `targets` always ends with PTX, which returns or fails above.
    Err(backend_err(format!("no NVRTC target for {name}")))
}

/// Loads an image into `ctx`. An image that is not what its kind says (PTX that is not
/// text) fails like a driver refusal.
fn module(
    ctx: &Arc<CudaContext>,
    output: Output,
    image: Vec<u8>,
) -> std::result::Result<Arc<CudaModule>, cudarc::driver::DriverError> {
    let invalid =
        cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_IMAGE);
    let ptx = match output {
        Output::Cubin => Ptx::from_binary(image),
        Output::Ptx => match String::from_utf8(image) {
            // `load_module` makes a C string of it: an interior NUL would panic there.
            Ok(text) if !text.contains('\0') => Ptx::from_src(text),
            _ => return Err(invalid),
        },
    };
    ctx.load_module(ptx)
}

/// NVRTC's version.
fn version() -> std::result::Result<(i32, i32), result::NvrtcError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers; NVRTC writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Compiles `src` and returns the image (PTX without its trailing NUL, or the cubin); on
/// failure, NVRTC's error and log.
fn compile(
    src: &str,
    name: &str,
    options: &[String],
    output: Output,
) -> std::result::Result<Vec<u8>, String> {
    // Declared before the program, so they outlive it (NVRTC may keep pointers to them).
    let src_c = CString::new(src).map_err(|_| "source holds a NUL byte".to_string())?;
    let name_c = CString::new(name).map_err(|_| "name holds a NUL byte".to_string())?;
    let prog =
        Program(result::create_program(&src_c, Some(&name_c)).map_err(|e| format!("{e:?}"))?);
    // SAFETY (each call below): `prog` is a live program of this function.
    if let Err(e) = unsafe { result::compile_program(prog.0, options) } {
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| c_text(&l))
            .unwrap_or_default();
        return Err(format!("{e:?}: {log}"));
    }
    match output {
        Output::Ptx => {
            let ptx = unsafe { result::get_ptx(prog.0) }.map_err(|e| format!("{e:?}"))?;
            Ok(c_text(&ptx).into_bytes())
        }
        Output::Cubin => {
            let mut size = 0usize;
            unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
                .result()
                .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds the `size` bytes NVRTC said it writes.
            unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) }
                .result()
                .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
            if cubin.is_empty() {
                return Err("NVRTC returned an empty cubin".into());
            }
            Ok(cubin)
        }
    }
}

/// NVRTC's NUL-terminated text as a string.
fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubin_for_the_gpu_first_then_ptx() {
        let t = targets(Some((9, 0)), false);
        assert_eq!(t[0].output, Output::Cubin);
        assert_eq!(t[0].options, ["--gpu-architecture=sm_90"]);
        assert_eq!(t[1].output, Output::Ptx);
        assert_eq!(t[1].options, ["--gpu-architecture=compute_90"]);
        let forced = targets(Some((9, 0)), true);
        assert_eq!(forced.len(), 1);
        assert_eq!(forced[0].output, Output::Ptx);
        // An unknown GPU: NVRTC's default virtual architecture.
        let unknown = targets(None, false);
        assert_eq!((unknown.len(), unknown[0].options.len()), (1, 0));
    }

    #[test]
    fn embedded_cubins_serve_their_own_major_architecture_only() {
        assert_eq!(embedded_arch(Some((9, 0))), Some(90));
        assert_eq!(embedded_arch(Some((8, 0))), Some(80));
        // sm_80 machine code runs on later 8.x GPUs (A10, L4), not on other majors.
        assert_eq!(embedded_arch(Some((8, 6))), Some(80));
        assert_eq!(embedded_arch(Some((8, 9))), Some(80));
        assert_eq!(embedded_arch(Some((7, 5))), None);
        assert_eq!(embedded_arch(Some((10, 0))), None);
        assert_eq!(embedded_arch(Some((12, 0))), None);
        assert_eq!(embedded_arch(None), None);
    }

    #[test]
    fn the_groups_table_matches_kernels_cu() {
        use super::super::kernel_groups::KERNEL_GROUPS;
        let src = super::super::module::SOURCE;
        // `#define SP_GROUP_NAME value`, then `SP_WANT(SP_GROUP_NAME)` or `+ k`.
        let define = |name: &str| -> u32 {
            let line = src
                .lines()
                .find(|l| l.starts_with(&format!("#define SP_GROUP_{name} ")))
                .unwrap_or_else(|| panic!("SP_GROUP_{name} not defined"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let mut used = Vec::new();
        for line in src
            .lines()
            .filter(|l| l.starts_with("#if SP_WANT(SP_GROUP_"))
        {
            let expr = &line["#if SP_WANT(SP_GROUP_".len()..line.len() - 1];
            let id = match expr.split_once(" + ") {
                Some((name, k)) => define(name) + k.parse::<u32>().unwrap(),
                None => define(expr),
            };
            used.push(id);
        }
        for (name, id) in KERNEL_GROUPS {
            assert!(used.contains(&id), "group {name} ({id}) has no kernels");
        }
        for id in used {
            assert!(
                KERNEL_GROUPS.iter().any(|g| g.1 == id),
                "kernels.cu group {id} is not in KERNEL_GROUPS"
            );
        }
        // Group ids are distinct.
        let mut ids: Vec<u32> = KERNEL_GROUPS.iter().map(|g| g.1).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), KERNEL_GROUPS.len());
    }

    #[test]
    fn every_input_changes_the_key() {
        let t = targets(Some((9, 0)), false);
        let base = cache_key("k.cu", "src", &t[0], (13, 0), Some((9, 0)));
        let others = [
            cache_key("k.cu", "src2", &t[0], (13, 0), Some((9, 0))),
            cache_key("k.cu", "src", &t[1], (13, 0), Some((9, 0))),
            cache_key("k.cu", "src", &t[0], (13, 1), Some((9, 0))),
            cache_key("k.cu", "src", &t[0], (13, 0), Some((8, 0))),
            cache_key("j.cu", "src", &t[0], (13, 0), Some((9, 0))),
        ];
        for other in &others {
            assert_ne!(&base, other);
        }
        assert_eq!(base, cache_key("k.cu", "src", &t[0], (13, 0), Some((9, 0))));
    }
}
