//! The AMX kernel (`tdpbf16ps`): blocks of 32 output rows by 32 columns, four `f32`
//! accumulator tiles (tmm0-3), two activation tiles (tmm4-5: 16 rows by 32 `bf16` along `k`,
//! loaded where the activations lie) and two weight tiles (tmm6-7: 16 `k` pairs of 16
//! columns, the VNNI layout [`super::pack_b`] wrote with blocks of 16). A last block of fewer
//! than 32 rows is copied to a zero-padded buffer first (a tile load reads 16 whole rows).
//!
//! Linux hands AMX state to a process only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); [`available`] asks once, and a refusal leaves the AVX-512 path.

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::{store_tile, target_tasks, Epilogue};

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

/// `c[m, n] = act(a @ b + bias)` in `bf16` through AMX: `a` the `[m, k]` rows at `a`, `lda`
/// elements apart (unit stride along `k`), `b` in `w` by [`super::pack_b`] with blocks of 16.
///
/// # Safety
/// [`available`] holds; `n % 32 == 0`, `kp % 16 == 0` (`k = 2 * kp`); `a` is valid for `m`
/// rows of `k` at stride `lda`; `w` holds `n / 16 * kp * 16` words; `c` is valid for `m * n`
/// `bf16` writes and owned by this call; `epi.bias` holds `n` values.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product(
    a: DevicePtr,
    lda: usize,
    w: &[u32],
    kp: usize,
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
    let k = 2 * kp;
    let pw = DevicePtr(w.as_ptr() as u64);
    intra_op::for_ranges(mblocks * nchunks, 32 * 32 * per_task * k, |r| {
        let cfg = config();
        // SAFETY: AMX is available and granted (the caller's contract); the config is a
        // valid palette-1 configuration for this thread's tiles, released below.
        std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let mut tile = [0.0f32; 4 * 256];
        let mut padded: Vec<u16> = Vec::new();
        for t in r {
            let (mb, nc) = (t / nchunks, t % nchunks);
            let rows = (m - mb * 32).min(32);
            let mut pa = (a.0 as *const u16).add(mb * 32 * lda);
            let mut ld = lda;
            if rows < 32 {
                // SAFETY: rows mb*32.. < m of `a` are in bounds; the rest stay zero.
                padded.clear();
                padded.resize(32 * k, 0);
                for i in 0..rows {
                    std::ptr::copy_nonoverlapping(
                        pa.add(i * lda),
                        padded.as_mut_ptr().add(i * k),
                        k,
                    );
                }
                pa = padded.as_ptr();
                ld = k;
            }
            for nb in nc * per_task..((nc + 1) * per_task).min(nblocks) {
                // Weight blocks of 16 columns 2nb and 2nb + 1.
                let w0 = (pw.0 as *const u32).add(2 * nb * kp * 16);
                // SAFETY: 32 rows of `pa` at stride `ld`, two packed blocks of `kp * 16`
                // words, and `tile` holds four 16 x 16 tiles.
                block(pa, ld, kp, w0, &mut tile);
                let j = nb * 32;
                // SAFETY: the task owns rows mb*32.. of `c` (valid for m x n), and the
                // block's 32 columns lie inside n.
                store_block(
                    &tile,
                    rows,
                    (c.0 as *mut u16).add(mb * 32 * n + j),
                    n,
                    epi,
                    j,
                );
            }
        }
        // SAFETY: releases this thread's tile state configured above.
        std::arch::asm!("tilerelease", options(nostack, nomem));
    });
}

/// One 32 x 32 block over all of `k` (`kp / 16` steps of 32): tiles 0-3 = (a0 w0, a0 w1,
/// a1 w0, a1 w1), stored to `out` as four 16 x 16 `f32` tiles, rows then columns.
///
/// # Safety
/// Tiles are configured on this thread; `pa` holds 32 rows of `2 * kp` `bf16` at stride
/// `lda` (`kp % 16 == 0`); `w` holds two packed blocks of `kp * 16` words.
unsafe fn block(pa: *const u16, lda: usize, kp: usize, w: *const u32, out: &mut [f32; 1024]) {
    let steps = kp / 16;
    std::arch::asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "2:",
        "tileloadd tmm4, [{a0} + {sa}*1]",
        "tileloadd tmm5, [{a1} + {sa}*1]",
        "tileloadd tmm6, [{w0} + {s64}*1]",
        "tileloadd tmm7, [{w1} + {s64}*1]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "add {a0}, 64",
        "add {a1}, 64",
        "add {w0}, 1024",
        "add {w1}, 1024",
        "dec {steps}",
        "jnz 2b",
        "tilestored [{o} + {s64}*1], tmm0",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm1",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm2",
        "add {o}, 1024",
        "tilestored [{o} + {s64}*1], tmm3",
        a0 = inout(reg) pa => _,
        a1 = inout(reg) pa.add(16 * lda) => _,
        w0 = inout(reg) w => _,
        w1 = inout(reg) w.add(kp * 16) => _,
        o = inout(reg) out.as_mut_ptr() => _,
        steps = inout(reg) steps => _,
        sa = in(reg) lda * 2,
        s64 = in(reg) 64usize,
        options(nostack),
    );
}

/// The four tiles of a block through the epilogue: tile `2 * at + wt` holds rows `at * 16..`
/// by columns `wt * 16..`, as `tile[row * 16 + col]`. AVX-512 is there wherever AMX is
/// ([`available`] checks it), so the epilogue's loops vectorize for it.
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
    for at in 0..2 {
        let r0 = at * 16;
        if r0 >= rows {
            continue;
        }
        for wt in 0..2 {
            store_tile(
                &tile[(2 * at + wt) * 256..],
                (16, 1),
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
