//! The AMX kernel (`tdpbf16ps`): blocks of 32 output columns by 32 rows, four `f32`
//! accumulator tiles (tmm0-3), two weight tiles (tmm4-5: 16 weight rows by 32 `bf16` along
//! `k`, loaded where the weight lies) and two activation tiles (tmm6-7: 16 `k` pairs of a
//! packed panel, the VNNI layout `tdpbf16ps` wants). Each block computes `out^T`, stored to
//! a buffer and turned back.
//!
//! Linux hands AMX state to a process only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); [`available`] asks once, and a refusal leaves the AVX-512 path.

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::{store_tile, target_tasks, Epilogue, Packed};

/// `arch_prctl` request to be allowed an extended state component, and AMX tile data's one.
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), the
/// AVX-512 kernel is there for the shapes AMX does not take, and the kernel granted the tile
/// state to this process.
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // CPUID leaf 7 is read only where the CPU reports it (max leaf >= 7).
        let cpu = std::arch::x86_64::__cpuid(0).eax >= 7 && {
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            edx & (1 << 24) != 0 && edx & (1 << 22) != 0
        };
        if !cpu || !super::avx512::available() {
            return false;
        }
        // SAFETY: arch_prctl with this request only changes the process's permissions.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        if rc != 0 {
            tracing::warn!("AMX present but arch_prctl(ARCH_REQ_XCOMP_PERM) refused: bf16 products use AVX-512");
        }
        rc == 0
    })
}

/// The tile configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

fn config() -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
    }
    TileConfig(c)
}

/// As [`super::avx512::product`], through AMX; needs `n % 32 == 0`, `k % 32 == 0` and an
/// even number of panels.
///
/// # Safety
/// As `avx512::product`, [`available`] holds, and the shape fits as above.
pub(super) unsafe fn product(
    p: &Packed,
    w: DevicePtr,
    ldw: usize,
    c: DevicePtr,
    m: usize,
    n: usize,
    epi: &Epilogue,
) {
    let mblocks = m.div_ceil(32);
    let nblocks = n / 32;
    let per_m = target_tasks().div_ceil(mblocks).max(1);
    let per_task = nblocks.div_ceil(per_m).max(1);
    let nchunks = nblocks.div_ceil(per_task);
    let kp = p.kp;
    intra_op::for_ranges(mblocks * nchunks, 32 * 32 * per_task * kp * 2, |r| {
        let cfg = config();
        // SAFETY: AMX is available and granted (the caller's contract); the config is a
        // valid palette-1 configuration for this thread's tiles, released below.
        std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let mut tile = [0.0f32; 4 * 256];
        for t in r {
            let (mb, nc) = (t / nchunks, t % nchunks);
            let rows = (m - mb * 32).min(32);
            let pa = (p.ptr.0 as *const u16).add(mb * 2 * kp * 32);
            for nb in nc * per_task..((nc + 1) * per_task).min(nblocks) {
                let j = nb * 32;
                // SAFETY: the weight rows j..j+32 and the two panels of this row block are
                // in bounds (n % 32 == 0, panels even), and `tile` holds four 16 x 16 tiles.
                block(pa, kp, (w.0 as *const u16).add(j * ldw), ldw, &mut tile);
                let cj = (c.0 as *mut u16).add(mb * 32 * n + j);
                // SAFETY: the task owns rows mb*32.. of `c` (valid for m x n), and the
                // block's 32 columns lie inside n.
                store_block(&tile, rows, cj, n, epi, j);
            }
        }
        // SAFETY: releases this thread's tile state configured above.
        std::arch::asm!("tilerelease", options(nostack, nomem));
    });
}

/// One 32 x 32 block over all of `k` (`kp / 16` steps of 32): tiles 0-3 =
/// (W0 a0, W0 a1, W1 a0, W1 a1), stored to `out` as four 16 x 16 `f32` tiles.
///
/// # Safety
/// Tiles are configured on this thread; `pa` holds two panels of `kp` pairs (`kp % 16 ==
/// 0`); `w` holds 32 rows of `2 * kp` `bf16` at stride `ldw`.
unsafe fn block(pa: *const u16, kp: usize, w: *const u16, ldw: usize, out: &mut [f32; 1024]) {
    let steps = kp / 16;
    let panel_bytes = kp * 64;
    std::arch::asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "2:",
        "tileloadd tmm4, [{w0} + {sw}*1]",
        "tileloadd tmm5, [{w1} + {sw}*1]",
        "tileloadd tmm6, [{a0} + {s64}*1]",
        "tileloadd tmm7, [{a1} + {s64}*1]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "add {w0}, 64",
        "add {w1}, 64",
        "add {a0}, 1024",
        "add {a1}, 1024",
        "dec {steps}",
        "jnz 2b",
        "tilestored [{o} + {s64}*1], tmm0",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm1",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm2",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm3",
        w0 = inout(reg) w => _,
        w1 = inout(reg) w.add(16 * ldw) => _,
        a0 = inout(reg) pa => _,
        a1 = inout(reg) pa.add(panel_bytes / 2) => _,
        o = inout(reg) out.as_mut_ptr() => _,
        steps = inout(reg) steps => _,
        sw = in(reg) ldw * 2,
        s64 = in(reg) 64usize,
        options(nostack),
    );
}

/// The four tiles of a block through the epilogue: tile `2 * wt + at` holds weight rows
/// `wt * 16..` (output columns) by activation rows `at * 16..` (output rows), as
/// `tile[col * 16 + row]`. AVX-512 is there wherever AMX is ([`available`] checks it), so
/// the epilogue's loops vectorize for it.
///
/// # Safety
/// `c` is valid for `rows` rows of 32 `bf16` at stride `ldc`; `epi`'s bias holds columns
/// `j0..j0 + 32`; AVX-512F is available.
#[target_feature(enable = "avx512f")]
unsafe fn store_block(
    tile: &[f32; 1024],
    rows: usize,
    c: *mut u16,
    ldc: usize,
    epi: &Epilogue,
    j0: usize,
) {
    for wt in 0..2 {
        for at in 0..2 {
            let r0 = at * 16;
            if r0 >= rows {
                continue;
            }
            store_tile(
                &tile[(2 * wt + at) * 256..],
                16,
                (rows - r0).min(16),
                16,
                c.add(r0 * ldc + wt * 16),
                ldc,
                epi,
                j0 + wt * 16,
            );
        }
    }
}
