// The groups `kernels.cu` is built in. Shared with `build.rs` through `include!`, so it holds
// plain constants only, no crate items.

/// Each group of `kernels.cu`'s entry points: its name and the `SP_GROUP` value that builds
/// it alone (`SP_GROUP_*` in `kernels.cu`). A group is the unit of a run-time compile and of
/// a module load: a model pays only for the groups it launches, and the groups compile on
/// several threads at once.
pub const KERNEL_GROUPS: [(&str, u32); 12] = [
    ("basic", 1),
    ("norm", 2),
    ("pool", 3),
    ("act", 4),
    ("attention16", 10),
    ("attention32", 11),
    ("attention64", 12),
    ("attention128", 13),
    ("attention_mma16", 20),
    ("attention_mma32", 21),
    ("attention_mma64", 22),
    ("attention_mma128", 23),
];

/// The GPU architectures (`sm_XY` as `XY`) whose cubins the build embeds in the library when
/// it finds NVRTC: the data-centre GPUs we support (A100 and the rest of compute capability
/// 8.x, which run sm_80 code; H100 and H200).
pub const EMBEDDED_ARCHS: [u32; 2] = [80, 90];
