//! The process-wide tunables of the runtime, in one place: [`Tuning`].
//!
//! Every knob that is not a per-device setting ([`DeviceConfig`](crate::DeviceConfig),
//! `WgpuConfig`) lives here as a typed field with its default: the CPU kernels' tiles and
//! paths, the CUDA backend's waits, copies and cuBLASLt tuning, CUDA graphs, the wgpu
//! backend's switches and the kernel cache folder. The library reads them through
//! [`tuning`] and nowhere else reads the environment.
//!
//! The values come from [`set`], when a program calls it before the runtime's first use,
//! else from the environment ([`Tuning::from_env`], read once, on first use). So setting
//! the variables before starting a program keeps working, and a program (the `streampool`
//! binary, an embedding application) may instead build its own [`Tuning`], usually starting
//! from the environment's and changing a few fields.
//!
//! Every variable, with its field, type, default and meaning, is in [`VARS`] and in
//! `docs/configuration.md` (generated from it; a unit test keeps the two in step).
//!
//! ```
//! use streampool::config::{self, Tuning};
//!
//! let mut tuning = Tuning::from_env();
//! tuning.cpu.threads = Some(2);
//! tuning.graph.enabled = false;
//! // Once, before the first device or kernel; a second call is an error.
//! config::set(tuning).unwrap();
//! assert_eq!(config::tuning().cpu.threads, Some(2));
//! assert!(config::set(Tuning::default()).is_err());
//! ```

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Bf16Path, Error, Result};

/// One environment variable of a settings struct `T`: its name, the field it sets, and what
/// the documentation says of it. [`VARS`] lists streampool's; other crates of the workspace
/// describe their own settings with it.
#[derive(Clone, Copy)]
pub struct Var<T: 'static> {
    /// The environment variable.
    pub env: &'static str,
    /// The field it sets, as a path from `T` (`cpu.threads`).
    pub field: &'static str,
    /// The field's Rust type.
    pub ty: &'static str,
    /// The default, in words.
    pub default: &'static str,
    /// What it does and which values it takes (the field's documentation).
    pub doc: &'static str,
    /// Parses a value into the field; `Err` says what was expected.
    pub set: fn(&mut T, &OsStr) -> std::result::Result<(), String>,
}

impl<T> std::fmt::Debug for Var<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Var")
            .field("env", &self.env)
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

/// Sets `target`'s fields from the variables `get` returns, in `vars`' order. An empty
/// value counts as unset; a value that does not parse leaves the field as it was and is
/// logged as a warning naming the variable, the value and what was expected.
///
/// ```
/// use streampool::config::{read_vars, Tuning, VARS};
/// let mut tuning = Tuning::default();
/// read_vars(&mut tuning, VARS, |name| {
///     (name == "STREAMPOOL_CPU_THREADS").then(|| "3".into())
/// });
/// assert_eq!(tuning.cpu.threads, Some(3));
/// ```
pub fn read_vars<T>(target: &mut T, vars: &[Var<T>], get: impl Fn(&str) -> Option<OsString>) {
    for var in vars {
        let Some(value) = get(var.env).filter(|v| !v.is_empty()) else {
            continue;
        };
        if let Err(expected) = (var.set)(target, &value) {
            tracing::warn!(
                "{}={value:?}: expected {expected}; using {}",
                var.env,
                var.default
            );
        }
    }
}

/// `vars` as a Markdown table: variable, field, type, default, meaning (the tables of
/// `docs/configuration.md`). Links to Rust items (`[`x`](crate::x)`) become their text.
pub fn markdown_table<T>(vars: &[Var<T>]) -> String {
    let cell = |s: &str| {
        let joined = s
            .split('\n')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        without_item_links(&joined).replace('|', "\\|")
    };
    let mut out = String::from("| variable | field | type | default | what it does |\n");
    out.push_str("|---|---|---|---|---|\n");
    for v in vars {
        out.push_str(&format!(
            "| `{}` | `{}` | `{}` | {} | {} |\n",
            v.env,
            v.field,
            v.ty,
            cell(v.default),
            cell(v.doc)
        ));
    }
    out
}

/// `s` with each link to a Rust item (`[text](path::to::item)`) replaced by its text.
fn without_item_links(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let link = after.find("](").and_then(|close| {
            let target = &after[close + 2..];
            let end = target.find(')')?;
            let path = &target[..end];
            let item = path.contains("::") && !path.contains('/');
            item.then_some((close, close + 2 + end + 1))
        });
        out.push_str(&rest[..open]);
        match link {
            Some((close, past)) => {
                out.push_str(&after[..close]);
                rest = &after[past..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Checks (or, with `write`, rewrites) the block of the Markdown file `doc` between
/// `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name -->` against `table`.
/// `Err` says what differs and how to regenerate; for the crates' documentation tests.
#[doc(hidden)]
pub fn sync_docs_block(
    doc: &Path,
    name: &str,
    table: &str,
    write: bool,
    regenerate: &str,
) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let (begin, end) = (
        format!("<!-- BEGIN GENERATED: {name} -->\n"),
        format!("<!-- END GENERATED: {name} -->"),
    );
    let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) else {
        return Err(format!(
            "{} lacks the markers {begin:?} and {end:?}",
            doc.display()
        ));
    };
    let start = b + begin.len();
    if &text[start..e] == table {
        return Ok(());
    }
    if write {
        let new = format!("{}{table}{}", &text[..start], &text[e..]);
        return std::fs::write(doc, new).map_err(|e| format!("{}: {e}", doc.display()));
    }
    Err(format!(
        "{} is out of date with the variables in the code; regenerate it with `{regenerate}`. \
         The table should read:\n\n{table}",
        doc.display()
    ))
}

/// The environment variables' values, typed, and how [`VARS`] and the structs are built
/// from one list: each group becomes a struct (`CpuTuning`, ...) with its documented
/// fields and `Default`, [`Tuning`] holds one of each, and every field is one row of
/// [`VARS`].
macro_rules! tunables {
    (
        $(
            $(#[doc = $gdoc:literal])+
            $group:ident: $Group:ident {
                $(
                    $(#[doc = $doc:literal])+
                    $field:ident: $ty:ty = $default:expr,
                    env $env:literal $(as $konst:ident)?,
                    default $shown:literal,
                    parse $parse:expr;
                )+
            }
        )+
    ) => {
        $(
            $(#[doc = $gdoc])+
            #[derive(Debug, Clone, PartialEq)]
            #[non_exhaustive]
            pub struct $Group {
                $(
                    $(#[doc = $doc])+
                    #[doc = ""]
                    #[doc = concat!("Variable `", $env, "`; default: ", $shown, ".")]
                    pub $field: $ty,
                )+
            }

            impl Default for $Group {
                fn default() -> Self {
                    Self { $($field: $default,)+ }
                }
            }

            $($(
                #[doc = concat!("The environment variable of [`", stringify!($Group), "::",
                    stringify!($field), "`].")]
                pub const $konst: &str = $env;
            )?)+
        )+

        /// The process-wide tunables, one group per part of the runtime. `Default` is every
        /// field's documented default with no environment at all (so no kernel cache
        /// folder: that one comes from `HOME`); [`Tuning::from_env`] is what the runtime
        /// uses unless [`set`] says otherwise.
        ///
        /// Build one from the environment and change fields (the structs are
        /// `non_exhaustive`: fields are added as the runtime grows):
        ///
        /// ```
        /// use streampool::config::{CudaWait, Tuning};
        /// let mut tuning = Tuning::from_env();
        /// tuning.cuda.wait = CudaWait::Blocking;
        /// tuning.cpu.sgemm_units = 8;
        /// assert_eq!(Tuning::default().cpu.sgemm_units, 4);
        /// ```
        #[derive(Debug, Clone, PartialEq, Default)]
        #[non_exhaustive]
        pub struct Tuning {
            $(
                $(#[doc = $gdoc])+
                pub $group: $Group,
            )+
        }

        /// Every environment variable of [`Tuning`], in the order of its fields.
        pub const VARS: &[Var<Tuning>] = &[
            $($(
                Var {
                    env: $env,
                    field: concat!(stringify!($group), ".", stringify!($field)),
                    ty: stringify!($ty),
                    default: $shown,
                    doc: concat!($($doc, "\n"),+),
                    set: |t: &mut Tuning, v: &OsStr| {
                        t.$group.$field = ($parse)(v)?;
                        Ok(())
                    },
                },
            )+)+
        ];
    };
}

tunables! {
    /// The CPU backend: its intra-op pool and its kernels' tiles and paths.
    cpu: CpuTuning {
        /// Threads of the intra-op pool that every CPU kernel splits its work over (one per
        /// process, shared by every stream). [`set_cpu_threads`](crate::set_cpu_threads),
        /// called before the first CPU kernel, wins over it.
        threads: Option<usize> = None,
            env "STREAMPOOL_CPU_THREADS" as CPU_THREADS_ENV,
            default "the cores this process may use",
            parse some(positive);
        /// Tiles per pool thread and the fewest rows per tile of `f32` products without a
        /// packed weight, `PER_THREAD,MIN_ROWS`: a tuning knob for new hosts.
        gemm_tiles: (usize, usize) = (4, 32),
            env "STREAMPOOL_CPU_GEMM_TILES",
            default "`4,32`",
            parse tile_pair;
        /// How large `f32` products without a packed weight are split: `tiles`, a grid of
        /// single-threaded tiles over the pool, or `gemm`, the `gemm` crate's own threads
        /// (kept to compare the two on new hosts).
        gemm_split: GemmSplit = GemmSplit::Tiles,
            env "STREAMPOOL_CPU_GEMM",
            default "`tiles`",
            parse named(&[("tiles", GemmSplit::Tiles), ("gemm", GemmSplit::Gemm)]);
        /// The path of `f32` products against packed weights: `avx512`, `avx2` or `gemm`
        /// (the `gemm` crate); unset or `auto`, the best the host has. A path the host lacks
        /// falls back to the best it has, with a warning.
        sgemm: Option<SgemmPath> = None,
            env "STREAMPOOL_CPU_SGEMM" as CPU_SGEMM_ENV,
            default "`auto`",
            parse auto(&[
                ("avx512", SgemmPath::Avx512),
                ("avx2", SgemmPath::Avx2),
                ("gemm", SgemmPath::Gemm),
            ]);
        /// KiB of activations per row block of packed-weight products, sized to stay in L2
        /// while a task walks the weight's panels.
        sgemm_block_kib: usize = 256,
            env "STREAMPOOL_CPU_SGEMM_BLOCK_KIB",
            default "`256`",
            parse positive;
        /// Steps along `k` per pass of packed-weight products' row tiles over a panel; `0`:
        /// all of `k` in one pass (faster on many threads on the hosts measured so far).
        sgemm_kc: usize = 0,
            env "STREAMPOOL_CPU_SGEMM_KC",
            default "`0`",
            parse number;
        /// Units of a packed-weight product's grid per pool thread that its rows are cut
        /// for (at least).
        sgemm_units: usize = 4,
            env "STREAMPOOL_CPU_SGEMM_UNITS",
            default "`4`",
            parse positive;
        /// How pool tasks share a packed-weight product's units: `guided`, runs claimed from
        /// a shared counter, long ones first, or `pieces`, one fixed piece per task (kept to
        /// compare).
        sgemm_schedule: SgemmSchedule = SgemmSchedule::Guided,
            env "STREAMPOOL_CPU_SGEMM_SCHED",
            default "`guided`",
            parse named(&[("guided", SgemmSchedule::Guided), ("pieces", SgemmSchedule::Pieces)]);
        /// The path of `bf16` products: `amx`, `avx512` or `portable`; unset or `auto`, the
        /// best the host has. A path the host lacks falls back to the best it has.
        bf16: Option<Bf16Path> = None,
            env "STREAMPOOL_CPU_BF16" as CPU_BF16_ENV,
            default "`auto`",
            parse auto(&[
                ("amx", Bf16Path::Amx),
                ("avx512", Bf16Path::Avx512Bf16),
                ("portable", Bf16Path::Portable),
            ]);
        /// The path of fused attention: `avx512` (where the host and the shape allow) or
        /// `gemm` (`gemm` crate calls); unset or `auto`, the best the host has.
        attention: Option<CpuAttentionPath> = None,
            env "STREAMPOOL_CPU_ATTENTION" as CPU_ATTENTION_ENV,
            default "`auto`",
            parse auto(&[
                ("avx512", CpuAttentionPath::Avx512),
                ("gemm", CpuAttentionPath::Gemm),
            ]);
        /// Times every CPU kernel, per kernel and shape
        /// ([`cpu_kernel_profile`](crate::cpu_kernel_profile)); off, it costs one load per
        /// kernel.
        profile: bool = false,
            env "STREAMPOOL_CPU_PROFILE" as CPU_PROFILE_ENV,
            default "off",
            parse switch;
    }

    /// The CUDA backend (feature `cuda`): host waits, copies, kernels and cuBLASLt.
    cuda: CudaTuning {
        /// How the host waits for the GPU: `spin` (lowest latency, a core busy while it
        /// waits), `blocking` (the thread sleeps; pays with more waiting threads than
        /// cores), `yield` (polls, yielding between polls) or `hybrid` (spins for
        /// `spin_us`, then sleeps).
        wait: CudaWait = CudaWait::Spin,
            env "STREAMPOOL_CUDA_WAIT",
            default "`spin`",
            parse named(&[
                ("spin", CudaWait::Spin),
                ("blocking", CudaWait::Blocking),
                ("yield", CudaWait::Yield),
                ("hybrid", CudaWait::Hybrid),
            ]);
        /// Microseconds a `hybrid` wait spins before it sleeps.
        spin_us: u64 = 30,
            env "STREAMPOOL_CUDA_SPIN_US",
            default "`30`",
            parse number;
        /// Whether small device-to-host copies go through pinned buffers of the stream
        /// (off: the driver's pageable path, which serializes copies from many threads).
        staging: bool = true,
            env "STREAMPOOL_CUDA_STAGING",
            default "on",
            parse switch;
        /// How small host-to-device copies travel: `staged`, through the stream's pinned
        /// upload ring, or `pageable`, the driver's own path (to compare).
        h2d: CudaH2d = CudaH2d::Staged,
            env "STREAMPOOL_CUDA_H2D",
            default "`staged`",
            parse named(&[("staged", CudaH2d::Staged), ("pageable", CudaH2d::Pageable)]);
        /// The f16/bf16 layer norm kernel: `vec8` (a half-warp per row, 16-byte accesses)
        /// or `warp` (a warp per row, to compare).
        layer_norm: CudaLayerNorm = CudaLayerNorm::Vec8,
            env "STREAMPOOL_CUDA_LN",
            default "`vec8`",
            parse named(&[("vec8", CudaLayerNorm::Vec8), ("warp", CudaLayerNorm::Warp)]);
        /// What NVRTC builds at run time: `auto`, machine code for the GPU (PTX where NVRTC
        /// cannot target it), or `ptx`, always PTX for the driver to compile at load (to
        /// compare). `ptx` also skips the kernels embedded at build time.
        nvrtc_output: NvrtcOutput = NvrtcOutput::Auto,
            env "STREAMPOOL_CUDA_KERNELS",
            default "`auto`",
            parse named(&[
                ("auto", NvrtcOutput::Auto),
                ("cubin", NvrtcOutput::Auto),
                ("ptx", NvrtcOutput::Ptx),
            ]);
        /// How many of cuBLASLt's heuristic algorithms are timed per product shape on its
        /// first use (at most 32); `0` or `off` keeps the heuristic's first choice. Choices
        /// are kept in the tuning cache beside the kernel cache.
        cublaslt_tune: usize = 16,
            env "STREAMPOOL_CUBLASLT_TUNE",
            default "`16`",
            parse tune_count;
        /// When a product takes the residual that follows it through cuBLASLt's `C`:
        /// `auto` when the product has at least twice as many inputs as outputs per row
        /// (where the extra read hides under the arithmetic), `off` never, `all` always.
        cublaslt_residual: ResidualFusion = ResidualFusion::Auto,
            env "STREAMPOOL_CUBLASLT_RESIDUAL",
            default "`auto`",
            parse named(&[
                ("auto", ResidualFusion::Auto),
                ("off", ResidualFusion::Off),
                ("0", ResidualFusion::Off),
                ("all", ResidualFusion::All),
            ]);
    }

    /// CUDA graphs: repeated calls of one shape replayed as one launch.
    graph: GraphTuning {
        /// Whether graphs are captured and replayed at all (off: every call runs eagerly).
        enabled: bool = true,
            env "STREAMPOOL_GRAPHS",
            default "on",
            parse switch;
        /// Bytes the kept graphs' memory pools may hold together; the variable is in MiB.
        /// See [`GraphCache::with_max_bytes`](crate::GraphCache::with_max_bytes).
        max_bytes: usize = crate::DEFAULT_GRAPH_MEMORY,
            env "STREAMPOOL_GRAPH_MEMORY_MB",
            default "`4096` MiB",
            parse mebibytes;
    }

    /// The wgpu backend (feature `wgpu`). `WgpuConfig`'s fields of the same meaning, when
    /// set, win over these.
    wgpu: WgpuTuning {
        /// The adapter: its index in the adapter list (`0`) or a case-insensitive part of
        /// its name, backend or type (`nvidia`, `vulkan`, `cpu`); unset, the best one.
        adapter: Option<String> = None,
            env "STREAMPOOL_WGPU_ADAPTER",
            default "the best adapter",
            parse some(text);
        /// f16 products on cooperative matrices (matrix units): `auto` on the adapters
        /// they were verified on, `1` wherever the adapter has them, `0` never, `emulate`
        /// written out in plain WGSL (slow; for tests).
        cooperative_matrix: WgpuCoopMatrix = WgpuCoopMatrix::Auto,
            env "STREAMPOOL_WGPU_COOP_MATRIX",
            default "`auto`",
            parse named(&[
                ("auto", WgpuCoopMatrix::Auto),
                ("1", WgpuCoopMatrix::On),
                ("0", WgpuCoopMatrix::Off),
                ("emulate", WgpuCoopMatrix::Emulated),
            ]);
        /// The quarantine lock around encoding and submission: `auto` (on for Metal), `1`
        /// always, `0` never.
        quarantine: WgpuQuarantine = WgpuQuarantine::Auto,
            env "STREAMPOOL_WGPU_QUARANTINE",
            default "`auto`",
            parse named(&[
                ("auto", WgpuQuarantine::Auto),
                ("1", WgpuQuarantine::On),
                ("0", WgpuQuarantine::Off),
            ]);
        /// The longest a host wait for the GPU may take before it fails; the variable is
        /// in seconds.
        wait_limit: Duration = WGPU_DEFAULT_WAIT_LIMIT,
            env "STREAMPOOL_WGPU_WAIT_LIMIT_S",
            default "`60` s",
            parse seconds;
        /// Forces one matmul kernel: `16` (16x16 tile), `64` or `128` (register-blocked
        /// tiles); unset or `auto`, chosen by shape.
        matmul_tile: Option<u32> = None,
            env "STREAMPOOL_WGPU_MATMUL_TILE",
            default "`auto`",
            parse auto_number;
        /// The blocked tile `BMxBNxBK` the automatic choice takes where it takes one (BM
        /// and BN 64 or 128, BK 4, 8, 16 or 32); unset, by shape. For tuning.
        matmul_block: Option<[u32; 3]> = None,
            env "STREAMPOOL_WGPU_MATMUL_BLOCK",
            default "by shape",
            parse some(block);
        /// Workgroups a blocked matmul should give before a larger tile is taken. For
        /// tuning.
        matmul_groups: usize = 256,
            env "STREAMPOOL_WGPU_MATMUL_GROUPS",
            default "`256`",
            parse number;
        /// Attention kernel: `tiled` (blocks of 32 queries where the head width allows)
        /// or `token` (a workgroup per token and head, to compare).
        attention: WgpuAttention = WgpuAttention::Tiled,
            env "STREAMPOOL_WGPU_ATTENTION",
            default "`tiled`",
            parse named(&[("tiled", WgpuAttention::Tiled), ("token", WgpuAttention::Token)]);
        /// Whether kernels keep naga's loop bounding (a counter in every loop; our loops
        /// all end, and the counter costs in inner loops).
        loop_bounds: bool = false,
            env "STREAMPOOL_WGPU_LOOP_BOUNDS",
            default "off",
            parse switch;
        /// Whether each stream keeps its read-back staging buffers for reuse.
        keep_readback: bool = true,
            env "STREAMPOOL_WGPU_KEEP_READBACK",
            default "on",
            parse switch;
        /// Whether launch parameters go into buffers the host maps directly, where the
        /// adapter allows it (else through a staging copy).
        mapped_params: bool = true,
            env "STREAMPOOL_WGPU_MAPPED_PARAMS",
            default "on",
            parse switch;
        /// Whether the first command buffers after a host wait are submitted after fewer
        /// launches (4, 8, 16, then 32), so the GPU starts sooner; off, every 32.
        submit_ramp: bool = true,
            env "STREAMPOOL_WGPU_SUBMIT_RAMP",
            default "on",
            parse switch;
        /// The opt-in profile (`wgpu_profile()`): `1` times
        /// every launch on the GPU and the host's phases, `host` only the host's phases,
        /// `0` nothing. GPU timestamps need it on before the device opens.
        profile: WgpuProfiling = WgpuProfiling::Off,
            env "STREAMPOOL_WGPU_PROFILE" as WGPU_PROFILE_ENV,
            default "off",
            parse named(&[
                ("0", WgpuProfiling::Off),
                ("off", WgpuProfiling::Off),
                ("1", WgpuProfiling::Gpu),
                ("host", WgpuProfiling::Host),
            ]);
    }

    /// Where compiled kernels are kept between processes (the CUDA backend's NVRTC
    /// output); [`CacheTuning::kernel_dir`] resolves the folder.
    cache: CacheTuning {
        /// Whether kernels are kept on disk at all.
        kernels: bool = true,
            env "STREAMPOOL_KERNEL_CACHE" as KERNEL_CACHE_ENV,
            default "on",
            parse switch;
        /// The kernel cache folder itself (entries are stored directly in it).
        kernel_dir: Option<PathBuf> = None,
            env "STREAMPOOL_CACHE_DIR" as CACHE_DIR_ENV,
            default "unset",
            parse some(path);
        /// streampool's cache root, as for `scripts/fetch-minilm.sh`: kernels go in its
        /// `kernels` folder unless `STREAMPOOL_CACHE_DIR` is set.
        root: Option<PathBuf> = None,
            env "STREAMPOOL_CACHE" as CACHE_ROOT_ENV,
            default "unset",
            parse some(path);
        /// The user's cache folder (the XDG convention): kernels in `streampool/kernels`
        /// under it when neither `STREAMPOOL_CACHE_DIR` nor `STREAMPOOL_CACHE` is set.
        xdg_cache_home: Option<PathBuf> = None,
            env "XDG_CACHE_HOME",
            default "unset",
            parse some(path);
        /// The home folder: kernels in `.cache/streampool/kernels` under it when none of
        /// `STREAMPOOL_CACHE_DIR`, `STREAMPOOL_CACHE` and `XDG_CACHE_HOME` is set.
        home: Option<PathBuf> = None,
            env "HOME",
            default "unset (no kernel cache)",
            parse some(path);
    }
}

/// The `tracing` target of the CUDA backend's cuBLASLt tuning log: one `info` line per
/// product shape it times, with each candidate's time. Enable it in a subscriber's filter
/// (`RUST_LOG=streampool::cublaslt_tune=info`) to see why an algorithm was chosen.
pub const CUBLASLT_TUNE_LOG_TARGET: &str = "streampool::cublaslt_tune";

/// The default of the wgpu backend's wait limit ([`WgpuTuning::wait_limit`]): far above any
/// one submission of ours (the largest MiniLM batch's forward takes milliseconds on the
/// H100, a second on a software adapter).
pub const WGPU_DEFAULT_WAIT_LIMIT: Duration = Duration::from_secs(60);

impl Tuning {
    /// The tunables the environment sets, every other field at its default. Values that
    /// do not parse are logged as warnings and leave the default.
    ///
    /// ```
    /// let tuning = streampool::config::Tuning::from_env();
    /// assert!(tuning.cpu.sgemm_block_kib > 0);
    /// ```
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// The tunables `get` gives values for (a variable's name to its value, as the
    /// environment does), every other field at its default: for settings read from
    /// elsewhere than the process's environment, and for tests.
    ///
    /// ```
    /// use streampool::config::{CudaWait, Tuning};
    /// let tuning = Tuning::from_vars(|name| match name {
    ///     "STREAMPOOL_CUDA_WAIT" => Some("hybrid".into()),
    ///     "STREAMPOOL_GRAPHS" => Some("0".into()),
    ///     _ => None,
    /// });
    /// assert_eq!(tuning.cuda.wait, CudaWait::Hybrid);
    /// assert!(!tuning.graph.enabled);
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Self {
        let mut tuning = Self::default();
        read_vars(&mut tuning, VARS, get);
        tuning
    }
}

impl CacheTuning {
    /// The kernel cache folder these settings name, first found: `kernel_dir`,
    /// `root/kernels`, `xdg_cache_home/streampool/kernels`,
    /// `home/.cache/streampool/kernels`; `None` when `kernels` is off or none is set.
    ///
    /// ```
    /// let mut cache = streampool::config::CacheTuning::default();
    /// cache.home = Some("/home/me".into());
    /// assert_eq!(cache.kernel_dir(), Some("/home/me/.cache/streampool/kernels".into()));
    /// cache.root = Some("/srv/cache".into());
    /// assert_eq!(cache.kernel_dir(), Some("/srv/cache/kernels".into()));
    /// cache.kernels = false;
    /// assert_eq!(cache.kernel_dir(), None);
    /// ```
    pub fn kernel_dir(&self) -> Option<PathBuf> {
        if !self.kernels {
            return None;
        }
        if let Some(dir) = &self.kernel_dir {
            return Some(dir.clone());
        }
        if let Some(root) = &self.root {
            return Some(root.join("kernels"));
        }
        if let Some(xdg) = &self.xdg_cache_home {
            return Some(xdg.join("streampool/kernels"));
        }
        self.home
            .as_ref()
            .map(|home| home.join(".cache/streampool/kernels"))
    }
}

static TUNING: OnceLock<Tuning> = OnceLock::new();

/// The process's tunables: those given to [`set`], else the environment's
/// ([`Tuning::from_env`]), read on the first call. The runtime reads every tunable through
/// this.
///
/// ```
/// let tuning = streampool::config::tuning();
/// assert!(tuning.cpu.sgemm_units > 0);
/// ```
pub fn tuning() -> &'static Tuning {
    TUNING.get_or_init(Tuning::from_env)
}

/// Sets the process's tunables. Call it once, at start-up, before the first device or
/// kernel: many are read once, when the part of the runtime they tune first runs.
///
/// # Errors
/// [`Error::InvalidArgument`] when the tunables are already fixed: by an earlier `set`, or
/// because the runtime (or anyone) called [`tuning`] first.
///
/// ```
/// use streampool::config::{self, Tuning};
/// let mut tuning = Tuning::from_env();
/// tuning.cpu.profile = true;
/// config::set(tuning).unwrap();
/// assert!(config::tuning().cpu.profile);
/// ```
pub fn set(tuning: Tuning) -> Result<()> {
    TUNING.set(tuning).map_err(|_| {
        Error::InvalidArgument(
            "the process's tunables are already fixed: call streampool::config::set once, \
             before the first device or kernel"
                .into(),
        )
    })
}

/// How large CPU products without a packed weight are split ([`CpuTuning::gemm_split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmSplit {
    /// A grid of single-threaded `gemm` tiles over the intra-op pool.
    Tiles,
    /// The `gemm` crate's own parallel split.
    Gemm,
}

/// A forced path of CPU products against packed weights ([`CpuTuning::sgemm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgemmPath {
    /// 8 x 48 register tiles in AVX-512.
    Avx512,
    /// 6 x 16 register tiles in AVX2.
    Avx2,
    /// The `gemm` crate.
    Gemm,
}

/// How pool tasks share a packed-weight product's units ([`CpuTuning::sgemm_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgemmSchedule {
    /// Runs of units claimed from a shared counter, long runs first.
    Guided,
    /// One fixed piece per task.
    Pieces,
}

/// A forced path of CPU attention ([`CpuTuning::attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuAttentionPath {
    /// Register tiles in AVX-512, where the shape allows.
    Avx512,
    /// `gemm` crate calls.
    Gemm,
}

/// How the host waits for a CUDA event ([`CudaTuning::wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaWait {
    /// `cuEventSynchronize` on a default event: the driver spins.
    Spin,
    /// Events with `CU_EVENT_BLOCKING_SYNC`: the thread sleeps until the GPU signals.
    Blocking,
    /// Polls `cuEventQuery`, yielding the CPU between polls.
    Yield,
    /// Polls for [`CudaTuning::spin_us`], then sleeps as `Blocking` does.
    Hybrid,
}

/// How small host-to-device copies travel ([`CudaTuning::h2d`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaH2d {
    /// Through the stream's pinned upload ring.
    Staged,
    /// The driver's pageable path.
    Pageable,
}

/// The CUDA f16/bf16 layer norm kernel ([`CudaTuning::layer_norm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLayerNorm {
    /// A half-warp per row, 16-byte accesses.
    Vec8,
    /// A warp per row.
    Warp,
}

/// What NVRTC builds at run time ([`CudaTuning::nvrtc_output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvrtcOutput {
    /// Machine code for the GPU where NVRTC can target it, else PTX.
    Auto,
    /// PTX, compiled by the driver at load.
    Ptx,
}

/// When a product takes its residual through cuBLASLt's `C` ([`CudaTuning::cublaslt_residual`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidualFusion {
    /// When the product has at least twice as many inputs as outputs per row.
    Auto,
    /// Never.
    Off,
    /// Always.
    All,
}

/// Whether the wgpu device serializes encoding and submission behind its quarantine lock
/// (exported as `WgpuQuarantine`; see `WgpuConfig::quarantine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WgpuQuarantine {
    /// On for Metal, off for other backends (unless [`WgpuTuning::quarantine`] says
    /// otherwise, when a `WgpuConfig` leaves it at `Auto`).
    #[default]
    Auto,
    /// Always take the lock.
    On,
    /// Never take it.
    Off,
}

/// Whether wgpu f16 matmuls run on cooperative matrices (wgpu's experimental
/// `EXPERIMENTAL_COOPERATIVE_MATRIX`: Vulkan's `VK_KHR_cooperative_matrix`, Apple's
/// simdgroup matrices), the kernels of `wgpu/coop.rs` (exported as `WgpuCoopMatrix`). They
/// are taken only where the adapter reports the feature, lists 16x16x16 f16 -> f32
/// products, has `SHADER_F16` and `SUBGROUP` with 32-wide subgroups, and then for f16
/// products of 64 rows and columns and K of 32 or more; elsewhere the FMA kernels run.
/// `Device::wgpu_cooperative_matrix` says what the adapter offers and
/// `Device::wgpu_matmul_paths` what each shape takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WgpuCoopMatrix {
    /// On where the adapter is one the kernels were run, checked and measured faster on
    /// (`wgpu/choice.rs`, `COOP_VERIFIED`), off elsewhere (unless
    /// [`WgpuTuning::cooperative_matrix`] says otherwise, when a `WgpuConfig` leaves it at
    /// `Auto`).
    #[default]
    Auto,
    /// On wherever the adapter has what they need (the opt-in for unverified adapters).
    On,
    /// Off: the FMA kernels everywhere.
    Off,
    /// The same kernels with their matrix operations written out in plain WGSL, on any
    /// adapter with `SHADER_F16`: for checking their tiling, staging and epilogue on
    /// adapters without matrix units (lavapipe). Slow; for tests.
    Emulated,
}

/// The wgpu attention kernel ([`WgpuTuning::attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgpuAttention {
    /// Blocks of 32 queries where the head width allows.
    Tiled,
    /// A workgroup per token and head.
    Token,
}

/// What the wgpu profile records ([`WgpuTuning::profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgpuProfiling {
    /// Nothing.
    Off,
    /// The host's phases only, with no change to the device.
    Host,
    /// The host's phases and GPU timestamps of every launch.
    Gpu,
}

// Parsers of variable values, for the table above: each gives the field's value or says
// what it expected.

type Parsed<T> = std::result::Result<T, String>;

fn text(v: &OsStr) -> Parsed<String> {
    v.to_str()
        .map(|s| s.trim().to_string())
        .ok_or_else(|| "UTF-8 text".to_string())
}

fn path(v: &OsStr) -> Parsed<PathBuf> {
    Ok(PathBuf::from(v))
}

fn some<T>(parse: fn(&OsStr) -> Parsed<T>) -> impl Fn(&OsStr) -> Parsed<Option<T>> {
    move |v: &OsStr| parse(v).map(Some)
}

fn number<T: std::str::FromStr>(v: &OsStr) -> Parsed<T> {
    text(v)?
        .parse()
        .map_err(|_| "a non-negative integer".to_string())
}

fn positive(v: &OsStr) -> Parsed<usize> {
    number(v)
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| "a positive integer".to_string())
}

fn auto_number(v: &OsStr) -> Parsed<Option<u32>> {
    match text(v)?.as_str() {
        "auto" => Ok(None),
        s => s
            .parse()
            .map(Some)
            .map_err(|_| "a number or auto".to_string()),
    }
}

fn switch(v: &OsStr) -> Parsed<bool> {
    match text(v)?.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err("1/on/true/yes or 0/off/false/no".to_string()),
    }
}

/// One of `names` (case-insensitive).
fn named<T: Copy>(names: &'static [(&'static str, T)]) -> impl Fn(&OsStr) -> Parsed<T> {
    move |v: &OsStr| {
        let v = text(v)?.to_ascii_lowercase();
        names
            .iter()
            .find(|(n, _)| *n == v)
            .map(|&(_, t)| t)
            .ok_or_else(|| {
                let list: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                format!("one of {}", list.join(", "))
            })
    }
}

/// One of `names`, or `auto` (`None`).
fn auto<T: Copy>(names: &'static [(&'static str, T)]) -> impl Fn(&OsStr) -> Parsed<Option<T>> {
    move |v: &OsStr| match text(v)?.to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        _ => named(names)(v)
            .map(Some)
            .map_err(|e| format!("{e} or auto")),
    }
}

fn tile_pair(v: &OsStr) -> Parsed<(usize, usize)> {
    let v = text(v)?;
    let pair = v.split_once(',').and_then(|(a, b)| {
        let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        (a > 0 && b > 0).then_some((a, b))
    });
    pair.ok_or_else(|| "PER_THREAD,MIN_ROWS, two positive integers".to_string())
}

fn tune_count(v: &OsStr) -> Parsed<usize> {
    match text(v)?.to_ascii_lowercase().as_str() {
        "off" => Ok(0),
        s => s.parse().map_err(|_| "a count or off".to_string()),
    }
}

fn mebibytes(v: &OsStr) -> Parsed<usize> {
    number::<usize>(v).map(|mb| mb.saturating_mul(1 << 20))
}

fn seconds(v: &OsStr) -> Parsed<Duration> {
    text(v)?
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| "seconds".to_string())
}

fn block(v: &OsStr) -> Parsed<[u32; 3]> {
    let v: Option<Vec<u32>> = text(v)?.split('x').map(|p| p.trim().parse().ok()).collect();
    match v.as_deref() {
        Some(&[bm, bn, bk]) => Ok([bm, bn, bk]),
        _ => Err("BMxBNxBK, e.g. 128x64x16".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Tuning {
        Tuning::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn no_variables_give_the_defaults() {
        assert_eq!(with(&[]), Tuning::default());
        let t = Tuning::default();
        assert_eq!(t.cpu.threads, None);
        assert_eq!(t.cpu.gemm_tiles, (4, 32));
        assert_eq!(t.cpu.sgemm_block_kib, 256);
        assert_eq!(t.cuda.cublaslt_tune, 16);
        assert_eq!(t.cuda.spin_us, 30);
        assert_eq!(t.graph.max_bytes, crate::DEFAULT_GRAPH_MEMORY);
        assert_eq!(t.wgpu.wait_limit, Duration::from_secs(60));
        assert_eq!(t.cache.kernel_dir(), None);
    }

    #[test]
    fn every_variable_sets_its_field() {
        let t = with(&[
            ("STREAMPOOL_CPU_THREADS", " 3 "),
            ("STREAMPOOL_CPU_GEMM_TILES", "2, 16"),
            ("STREAMPOOL_CPU_GEMM", "gemm"),
            ("STREAMPOOL_CPU_SGEMM", "gemm"),
            ("STREAMPOOL_CPU_SGEMM_BLOCK_KIB", "512"),
            ("STREAMPOOL_CPU_SGEMM_KC", "192"),
            ("STREAMPOOL_CPU_SGEMM_UNITS", "8"),
            ("STREAMPOOL_CPU_SGEMM_SCHED", "pieces"),
            ("STREAMPOOL_CPU_BF16", "avx512"),
            ("STREAMPOOL_CPU_ATTENTION", "gemm"),
            ("STREAMPOOL_CPU_PROFILE", "1"),
            ("STREAMPOOL_CUDA_WAIT", "hybrid"),
            ("STREAMPOOL_CUDA_SPIN_US", "50"),
            ("STREAMPOOL_CUDA_STAGING", "0"),
            ("STREAMPOOL_CUDA_H2D", "pageable"),
            ("STREAMPOOL_CUDA_LN", "warp"),
            ("STREAMPOOL_CUDA_KERNELS", "PTX"),
            ("STREAMPOOL_CUBLASLT_TUNE", "off"),
            ("STREAMPOOL_CUBLASLT_RESIDUAL", "all"),
            ("STREAMPOOL_GRAPHS", "0"),
            ("STREAMPOOL_GRAPH_MEMORY_MB", "2"),
            ("STREAMPOOL_WGPU_ADAPTER", "llvmpipe"),
            ("STREAMPOOL_WGPU_COOP_MATRIX", "emulate"),
            ("STREAMPOOL_WGPU_QUARANTINE", "1"),
            ("STREAMPOOL_WGPU_WAIT_LIMIT_S", "2.5"),
            ("STREAMPOOL_WGPU_MATMUL_TILE", "64"),
            ("STREAMPOOL_WGPU_MATMUL_BLOCK", "128x64x16"),
            ("STREAMPOOL_WGPU_MATMUL_GROUPS", "128"),
            ("STREAMPOOL_WGPU_ATTENTION", "token"),
            ("STREAMPOOL_WGPU_LOOP_BOUNDS", "1"),
            ("STREAMPOOL_WGPU_KEEP_READBACK", "0"),
            ("STREAMPOOL_WGPU_MAPPED_PARAMS", "0"),
            ("STREAMPOOL_WGPU_SUBMIT_RAMP", "0"),
            ("STREAMPOOL_WGPU_PROFILE", "host"),
            ("STREAMPOOL_KERNEL_CACHE", "1"),
            ("STREAMPOOL_CACHE_DIR", "/d"),
        ]);
        let (cpu, cuda, wgpu) = (&t.cpu, &t.cuda, &t.wgpu);
        assert_eq!(cpu.threads, Some(3));
        assert_eq!(cpu.gemm_tiles, (2, 16));
        assert_eq!(cpu.gemm_split, GemmSplit::Gemm);
        assert_eq!(cpu.sgemm, Some(SgemmPath::Gemm));
        assert_eq!(
            (cpu.sgemm_block_kib, cpu.sgemm_kc, cpu.sgemm_units),
            (512, 192, 8)
        );
        assert_eq!(cpu.sgemm_schedule, SgemmSchedule::Pieces);
        assert_eq!(cpu.bf16, Some(Bf16Path::Avx512Bf16));
        assert_eq!(cpu.attention, Some(CpuAttentionPath::Gemm));
        assert!(cpu.profile);
        assert_eq!((cuda.wait, cuda.spin_us), (CudaWait::Hybrid, 50));
        assert!(!cuda.staging);
        assert_eq!(cuda.h2d, CudaH2d::Pageable);
        assert_eq!(cuda.layer_norm, CudaLayerNorm::Warp);
        assert_eq!(cuda.nvrtc_output, NvrtcOutput::Ptx);
        assert_eq!(cuda.cublaslt_tune, 0);
        assert_eq!(cuda.cublaslt_residual, ResidualFusion::All);
        assert!(!t.graph.enabled);
        assert_eq!(t.graph.max_bytes, 2 << 20);
        assert_eq!(wgpu.adapter.as_deref(), Some("llvmpipe"));
        assert_eq!(wgpu.cooperative_matrix, WgpuCoopMatrix::Emulated);
        assert_eq!(wgpu.quarantine, WgpuQuarantine::On);
        assert_eq!(wgpu.wait_limit, Duration::from_millis(2500));
        assert_eq!(wgpu.matmul_tile, Some(64));
        assert_eq!(wgpu.matmul_block, Some([128, 64, 16]));
        assert_eq!(wgpu.matmul_groups, 128);
        assert_eq!(wgpu.attention, WgpuAttention::Token);
        assert!(wgpu.loop_bounds && !wgpu.keep_readback && !wgpu.mapped_params);
        assert!(!wgpu.submit_ramp);
        assert_eq!(wgpu.profile, WgpuProfiling::Host);
        assert_eq!(t.cache.kernel_dir(), Some("/d".into()));
    }

    #[test]
    fn values_that_do_not_parse_leave_the_default() {
        let t = with(&[
            ("STREAMPOOL_CPU_THREADS", "0"),
            ("STREAMPOOL_CPU_GEMM_TILES", "4"),
            ("STREAMPOOL_CPU_SGEMM", "avx9"),
            ("STREAMPOOL_CPU_SGEMM_UNITS", "-1"),
            ("STREAMPOOL_CUDA_WAIT", "sometimes"),
            ("STREAMPOOL_CUBLASLT_TUNE", "many"),
            ("STREAMPOOL_GRAPHS", "maybe"),
            ("STREAMPOOL_WGPU_WAIT_LIMIT_S", "soon"),
            ("STREAMPOOL_WGPU_MATMUL_BLOCK", "128x64"),
            ("STREAMPOOL_WGPU_MATMUL_TILE", "big"),
            ("STREAMPOOL_CUDA_SPIN_US", ""),
        ]);
        assert_eq!(t, Tuning::default());
        // `auto` is the default spelled out.
        let auto = with(&[
            ("STREAMPOOL_CPU_BF16", "auto"),
            ("STREAMPOOL_WGPU_MATMUL_TILE", "auto"),
        ]);
        assert_eq!(auto, Tuning::default());
    }

    #[test]
    fn kernel_cache_folder_resolution_order() {
        let dir = |vars: &[(&str, &str)]| with(vars).cache.kernel_dir();
        let home = [("HOME", "/h")];
        assert_eq!(dir(&home), Some("/h/.cache/streampool/kernels".into()));
        let xdg = [("HOME", "/h"), ("XDG_CACHE_HOME", "/x")];
        assert_eq!(dir(&xdg), Some("/x/streampool/kernels".into()));
        let root = [("XDG_CACHE_HOME", "/x"), (CACHE_ROOT_ENV, "/r")];
        assert_eq!(dir(&root), Some("/r/kernels".into()));
        let both = [(CACHE_ROOT_ENV, "/r"), (CACHE_DIR_ENV, "/d")];
        assert_eq!(dir(&both), Some("/d".into()));
        // Empty means unset.
        assert_eq!(
            dir(&[(CACHE_DIR_ENV, ""), ("HOME", "/h")]),
            Some("/h/.cache/streampool/kernels".into())
        );
        assert_eq!(dir(&[]), None);
        for off in ["0", "off", "OFF", "false", "no"] {
            assert_eq!(dir(&[(KERNEL_CACHE_ENV, off), (CACHE_DIR_ENV, "/d")]), None);
        }
        assert_eq!(
            dir(&[(KERNEL_CACHE_ENV, "1"), (CACHE_DIR_ENV, "/d")]),
            Some("/d".into())
        );
    }

    #[test]
    fn item_links_become_their_text() {
        assert_eq!(
            without_item_links("see [`f`](crate::f), [x](https://e.org) and [a] b"),
            "see `f`, [x](https://e.org) and [a] b"
        );
    }

    #[test]
    fn the_table_names_each_variable_and_field_once() {
        let mut envs: Vec<&str> = VARS.iter().map(|v| v.env).collect();
        let mut fields: Vec<&str> = VARS.iter().map(|v| v.field).collect();
        envs.sort_unstable();
        fields.sort_unstable();
        let (n_envs, n_fields) = (envs.len(), fields.len());
        envs.dedup();
        fields.dedup();
        assert_eq!((envs.len(), fields.len()), (n_envs, n_fields));
        for konst in [
            CPU_THREADS_ENV,
            CPU_SGEMM_ENV,
            CPU_BF16_ENV,
            CPU_ATTENTION_ENV,
            CPU_PROFILE_ENV,
            WGPU_PROFILE_ENV,
            KERNEL_CACHE_ENV,
            CACHE_DIR_ENV,
            CACHE_ROOT_ENV,
        ] {
            assert!(envs.contains(&konst), "{konst}");
        }
    }

    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    const REGENERATE: &str =
        "cargo test -p streampool --lib config::tests::write_docs -- --ignored";

    /// `docs/configuration.md`'s table is [`VARS`]'s.
    #[test]
    fn docs_list_every_variable() {
        let table = markdown_table(VARS);
        if let Err(e) = sync_docs_block(Path::new(DOC), "streampool", &table, false, REGENERATE) {
            panic!("{e}");
        }
    }

    /// Rewrites `docs/configuration.md`'s table from [`VARS`].
    #[test]
    #[ignore = "writes docs/configuration.md"]
    fn write_docs() {
        let table = markdown_table(VARS);
        sync_docs_block(Path::new(DOC), "streampool", &table, true, REGENERATE).unwrap();
    }
}
