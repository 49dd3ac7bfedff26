//! Half-precision kernels on the CPU: every `F16`/`BF16` kernel runs as its `F32` version on
//! widened copies of its inputs, and its output is rounded once to the half type. That is
//! the same contract as the CUDA kernels (load as `f32`, compute in `f32`, round on store),
//! so every dtype is tested in CI, where there is no GPU.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{
    Attention, BiasAct, Binary, Fill, GatedAct, IndexSelect, Kernel, LayerNorm, MatOperand, Matmul,
    MeanPoolNorm, MeanPoolNormPacked, Reduce, RmsNorm, Rope, Softmax, Unary,
};
use crate::sync::Mutex;
use crate::DType;

/// Widened (`f32`) copies of a kernel's inputs and outputs; the heap buffers never move
/// while the pointers handed out are in use (pushing a `Vec` moves only its header). They
/// go back to [`SPARE`] when the kernel is done.
#[derive(Default)]
struct Widened {
    bufs: Vec<Vec<f32>>,
    /// (buffer index, the real output, its dtype).
    outs: Vec<(usize, DevicePtr, DType)>,
}

impl Widened {
    /// # Safety
    /// `p` is valid for `len` reads of `dt`.
    unsafe fn input(&mut self, p: DevicePtr, len: usize, dt: DType) -> DevicePtr {
        self.bufs.push(load(p, len, dt));
        DevicePtr(self.bufs[self.bufs.len() - 1].as_ptr() as u64)
    }

    fn output(&mut self, p: DevicePtr, len: usize, dt: DType) -> DevicePtr {
        self.bufs.push(zeroed(len));
        let i = self.bufs.len() - 1;
        self.outs.push((i, p, dt));
        DevicePtr(self.bufs[i].as_mut_ptr() as u64)
    }

    /// # Safety
    /// Every output pointer is valid for its buffer's length of writes of its dtype.
    unsafe fn store(&self) {
        for &(i, p, dt) in &self.outs {
            store(&self.bufs[i], p, dt);
        }
    }
}

impl Drop for Widened {
    fn drop(&mut self) {
        for v in self.bufs.drain(..) {
            give(v);
        }
    }
}

/// Widened buffers kept for the next half kernels, at most [`SPARE_BYTES`] in all. A
/// `bf16` forward widens a few tensors per layer (attention's input, the layer norms'); a
/// fresh allocation of that size is a fresh `mmap` each time, whose page faults cost as
/// much as the kernel (a batch of 64 x 128 tokens: tens of MB per kernel).
static SPARE: std::sync::OnceLock<Mutex<Vec<Vec<f32>>>> = std::sync::OnceLock::new();

/// The most bytes [`SPARE`] keeps.
const SPARE_BYTES: usize = 256 << 20;

fn spare() -> &'static Mutex<Vec<Vec<f32>>> {
    SPARE.get_or_init(|| Mutex::new(Vec::new()))
}

/// An empty buffer with room for `len` values: the smallest spare one that fits, or a new one.
fn take(len: usize) -> Vec<f32> {
    let mut spare = spare().lock();
    let best = spare
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= len)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    match best {
        Some(i) => {
            let mut v = spare.swap_remove(i);
            v.clear();
            v
        }
        None => Vec::with_capacity(len),
    }
}

/// Keeps `v` for a later [`take`], dropping the smallest spares past [`SPARE_BYTES`].
fn give(v: Vec<f32>) {
    let bytes = |v: &Vec<f32>| v.capacity() * 4;
    if bytes(&v) > SPARE_BYTES || v.capacity() == 0 {
        return;
    }
    let mut spare = spare().lock();
    spare.push(v);
    while spare.iter().map(bytes).sum::<usize>() > SPARE_BYTES {
        let smallest = (0..spare.len())
            .min_by_key(|&i| spare[i].capacity())
            .unwrap_or(0);
        spare.swap_remove(smallest);
    }
}

/// `len` zeros, in a spare buffer, written over the intra-op pool.
fn zeroed(len: usize) -> Vec<f32> {
    let mut v = take(len);
    let dst = DevicePtr(v.as_mut_ptr() as u64);
    intra_op::for_ranges(len, 1, |r| {
        // SAFETY: `v` has capacity for `len` values; each range is this task's own piece,
        // written through the raw pointer (no reference to uninitialized memory).
        unsafe { std::ptr::write_bytes((dst.0 as *mut f32).add(r.start), 0, r.len()) }
    });
    // SAFETY: every one of the `len` values was written above.
    unsafe { v.set_len(len) };
    v
}

/// # Safety
/// `p` is valid for `len` reads of `dt` (a float type).
unsafe fn load(p: DevicePtr, len: usize, dt: DType) -> Vec<f32> {
    let mut v = take(len);
    let dst = DevicePtr(v.as_mut_ptr() as u64);
    // Large conversions (a batch's activations) split over the intra-op pool; values are
    // written through the raw pointer into `v`'s spare capacity.
    intra_op::for_ranges(len, 2, |r| {
        // SAFETY: `v` has room for `len` values and each range is this task's own piece;
        // `p` is valid for `len` reads of `dt`.
        let out = (dst.0 as *mut f32).add(r.start);
        match dt {
            DType::F16 => {
                let x = (p.0 as *const f16).add(r.start);
                for i in 0..r.len() {
                    out.add(i).write(x.add(i).read().to_f32());
                }
            }
            // bf16 is the top half of an f32: widening is a shift (vectorizes).
            DType::BF16 => {
                let x = (p.0 as *const u16).add(r.start);
                for i in 0..r.len() {
                    out.add(i)
                        .write(f32::from_bits(u32::from(x.add(i).read()) << 16));
                }
            }
            _ => std::ptr::copy_nonoverlapping((p.0 as *const f32).add(r.start), out, r.len()),
        }
    });
    // SAFETY: every one of the `len` values was written above.
    v.set_len(len);
    v
}

/// # Safety
/// `p` is valid for `v.len()` writes of `dt` (a float type).
unsafe fn store(v: &[f32], p: DevicePtr, dt: DType) {
    if v.is_empty() {
        return;
    }
    intra_op::for_ranges(v.len(), 2, |r| {
        let (s, n) = (r.start, r.len());
        // SAFETY: each range is this task's own piece of the output (`p` valid for
        // `v.len()` writes).
        match dt {
            DType::F16 => std::slice::from_raw_parts_mut((p.0 as *mut f16).add(s), n)
                .convert_from_f32_slice(&v[r]),
            // Branch-free rounding (ties to even), so the loop vectorizes.
            DType::BF16 => {
                let o = (p.0 as *mut u16).add(s);
                for (i, &x) in v[r].iter().enumerate() {
                    o.add(i).write(super::kernels::bf16::to_bf16(x));
                }
            }
            _ => std::slice::from_raw_parts_mut((p.0 as *mut f32).add(s), n).copy_from_slice(&v[r]),
        }
    });
}

/// Elements a strided view of `shape` spans (0 if empty).
fn strided_extent(shape: &[usize], strides: &[usize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    1 + shape
        .iter()
        .zip(strides)
        .map(|(n, s)| (n - 1) * s)
        .sum::<usize>()
}

/// Elements a `[batch, rows, cols]` matmul operand spans (0 if empty).
fn mat_extent(x: &MatOperand, batch: usize, rows: usize, cols: usize) -> usize {
    if batch == 0 || rows == 0 || cols == 0 {
        return 0;
    }
    1 + (batch - 1) * x.batch_stride + (rows - 1) * x.rs + (cols - 1) * x.cs
}

/// Runs `kernel` if it is a conversion or works on half tensors, and says whether it did
/// (the caller runs every other kernel as it is).
///
/// # Safety
/// As [`super::kernels::run`].
pub(crate) unsafe fn run_if_half(kernel: &Kernel) -> bool {
    if let Kernel::Cast(p) = kernel {
        let v = load(p.x, p.len, p.from);
        store(&v, p.out, p.to);
        give(v);
        return true;
    }
    let Some(dt) = kernel.float_dtype() else {
        return false;
    };
    if dt == DType::F32 {
        return false;
    }
    match kernel {
        // A gather copies values as they are: no need to widen the whole table (a
        // vocabulary's embeddings: 47 MB of f32 per call for MiniLM).
        Kernel::IndexSelect(p) => {
            index_select_u16(p.table, p.ids, p.out, p.n_ids, p.row_len, p.table_rows);
            return true;
        }
        // bf16 products through the host's bf16 instructions where they fit.
        Kernel::Matmul(p) if p.dtype == DType::BF16 => {
            let (a, b, slot) = (&p.a, &p.b, p.b_pack.as_ref());
            let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
            if super::kernels::bf16::matmul(a, b, slot, p.bias, p.act, p.out, batch, m, n, k) {
                return true;
            }
        }
        _ => {}
    }
    run_widened(kernel, dt);
    true
}

/// Runs a half `kernel` (of dtype `dt`) as its `f32` version on widened copies: the portable
/// path of every half kernel.
///
/// # Safety
/// As [`run_if_half`].
pub(crate) unsafe fn run_widened(kernel: &Kernel, dt: DType) {
    let mut w = Widened::default();
    // No float dtype: `float_dtype` gave none, so run_if_half never hands these over.
    let Some(widened) = widen(kernel, &mut w, dt) else {
        return;
    };
    super::kernels::run(&widened);
    w.store();
}

/// The `F32` version of a half `kernel` (of dtype `dt`): its inputs widened into `w`, its
/// outputs in `w`'s buffers (stored back by [`Widened::store`]); `None` for the kernels
/// without a float dtype.
///
/// # Safety
/// As [`run_if_half`].
unsafe fn widen(kernel: &Kernel, w: &mut Widened, dt: DType) -> Option<Kernel> {
    use Kernel as K;
    let f = DType::F32;
    let widened = match kernel.clone() {
        K::Fill(p) => K::Fill(Fill {
            out: w.output(p.out, p.len, dt),
            dtype: f,
            ..p
        }),
        K::Matmul(p) => K::Matmul(widen_matmul(p, w, dt)),
        K::Unary(p) => K::Unary(Unary {
            x: w.input(p.x, p.len, dt),
            out: w.output(p.out, p.len, dt),
            dtype: f,
            ..p
        }),
        K::Binary(mut p) => {
            p.a.ptr = w.input(p.a.ptr, strided_extent(&p.shape, &p.a.strides), dt);
            p.b.ptr = w.input(p.b.ptr, strided_extent(&p.shape, &p.b.strides), dt);
            let n = if p.shape.contains(&0) {
                0
            } else {
                p.shape.iter().product()
            };
            K::Binary(Binary {
                out: w.output(p.out, n, dt),
                dtype: f,
                ..p
            })
        }
        K::Softmax(p) => K::Softmax(Softmax {
            x: w.input(p.x, p.rows * p.cols, dt),
            out: w.output(p.out, p.rows * p.cols, dt),
            dtype: f,
            ..p
        }),
        K::LayerNorm(p) => K::LayerNorm(LayerNorm {
            x: w.input(p.x, p.rows * p.cols, dt),
            residual: p.residual.map(|r| w.input(r, p.rows * p.cols, dt)),
            gamma: w.input(p.gamma, p.cols, dt),
            beta: w.input(p.beta, p.cols, dt),
            out: w.output(p.out, p.rows * p.cols, dt),
            dtype: f,
            ..p
        }),
        K::BiasAct(p) => K::BiasAct(BiasAct {
            x: w.input(p.x, p.len(), dt),
            bias: w.input(p.bias, p.cols, dt),
            out: w.output(p.out, p.len(), dt),
            dtype: f,
            ..p
        }),
        K::IndexSelect(p) => K::IndexSelect(IndexSelect {
            table: w.input(p.table, p.table_rows * p.row_len, dt),
            out: w.output(p.out, p.len(), dt),
            dtype: f,
            ..p
        }),
        K::Reduce(p) => {
            // An empty output reads nothing (and the input's size need not fit a usize).
            let len = if p.outputs() == 0 {
                0
            } else {
                p.outer * p.axis * p.inner
            };
            K::Reduce(Reduce {
                x: w.input(p.x, len, dt),
                out: w.output(p.out, p.outputs(), dt),
                dtype: f,
                ..p
            })
        }
        K::Attention(p) => {
            let tokens = p.packed.map_or(p.batch * p.seq, |s| s.tokens);
            let width = p.heads * p.head_dim;
            K::Attention(Attention {
                qkv: w.input(p.qkv, tokens * 3 * width, dt),
                out: w.output(p.out, tokens * width, dt),
                dtype: f,
                ..p
            })
        }
        // The mask and the output are `F32` already.
        K::MeanPoolNorm(p) => K::MeanPoolNorm(MeanPoolNorm {
            x: w.input(p.x, p.batch * p.seq * p.dim, dt),
            dtype: f,
            ..p
        }),
        K::RmsNorm(p) => K::RmsNorm(RmsNorm {
            x: w.input(p.x, p.rows * p.cols, dt),
            gamma: w.input(p.gamma, p.cols, dt),
            out: w.output(p.out, p.rows * p.cols, dt),
            dtype: f,
            ..p
        }),
        // The tables are `F32` already.
        K::Rope(p) => {
            let n = p.batch * p.seq * p.heads * p.head_dim;
            K::Rope(Rope {
                x: w.input(p.x, n, dt),
                out: w.output(p.out, n, dt),
                dtype: f,
                ..p
            })
        }
        K::GatedAct(p) => K::GatedAct(GatedAct {
            x: w.input(p.x, p.rows * 2 * p.cols, dt),
            out: w.output(p.out, p.rows * p.cols, dt),
            dtype: f,
            ..p
        }),
        // The output is `F32` already.
        K::MeanPoolNormPacked(p) => K::MeanPoolNormPacked(MeanPoolNormPacked {
            x: w.input(p.x, p.seqs.tokens * p.dim, dt),
            dtype: f,
            ..p
        }),
        K::Copy(_) | K::Sleep { .. } | K::Cast(_) => return None,
    };
    Some(widened)
}

/// [`widen`] of a product.
///
/// # Safety
/// As [`run_if_half`].
unsafe fn widen_matmul(p: Matmul, w: &mut Widened, dt: DType) -> Matmul {
    let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
    Matmul {
        // The widened copy is a temporary: nothing to keep packed.
        b_pack: None,
        bias: p.bias.map(|b| w.input(b, n, dt)),
        // The CPU backend never fuses a residual (`fuses_matmul_residual` is false).
        residual: None,
        a: MatOperand {
            ptr: w.input(p.a.ptr, mat_extent(&p.a, batch, m, k), dt),
            ..p.a
        },
        b: MatOperand {
            ptr: w.input(p.b.ptr, mat_extent(&p.b, batch, k, n), dt),
            ..p.b
        },
        out: w.output(p.out, batch * m * n, dt),
        dtype: DType::F32,
        ..p
    }
}

/// `Kernel::IndexSelect` on 2-byte values (f16, bf16): rows of `table` by `ids`, zeros (+0)
/// for ids out of range, as the `f32` kernel.
///
/// # Safety
/// `table` is valid for `table_rows * row_len` reads of 2 bytes each, `ids` for `n_ids`
/// `i64` reads, `out` for `n_ids * row_len` writes.
unsafe fn index_select_u16(
    table: DevicePtr,
    ids: DevicePtr,
    out: DevicePtr,
    n_ids: usize,
    row_len: usize,
    table_rows: usize,
) {
    if n_ids == 0 || row_len == 0 {
        return;
    }
    intra_op::for_ranges(n_ids, row_len, |r| {
        for i in r {
            // SAFETY: row i of `out` is this task's own; id-th row of `table` is in bounds.
            let id = (ids.0 as *const i64).add(i).read();
            let dst = (out.0 as *mut u16).add(i * row_len);
            if id < 0 || id as usize >= table_rows {
                std::ptr::write_bytes(dst, 0, row_len);
            } else {
                let src = (table.0 as *const u16).add(id as usize * row_len);
                std::ptr::copy_nonoverlapping(src, dst, row_len);
            }
        }
    });
}
