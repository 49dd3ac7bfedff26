//! The CPU backend's kernels: plain loops over slices, and `matrixmultiply` for matmul.
//!
//! Each stream's worker runs its kernels single-threaded: streams are the parallelism. Half
//! kernels run as their `f32` versions on widened copies ([`super::half`]).

use crate::backend::DevicePtr;
use crate::kernel::{Activation, BinaryOp, Kernel, ReduceOp, Strided, UnaryOp};

/// # Safety
/// `ptr` is valid for `len` reads of `f32` and nothing writes it meanwhile.
unsafe fn src<'a>(ptr: DevicePtr, len: usize) -> &'a [f32] {
    std::slice::from_raw_parts(ptr.0 as *const f32, len)
}

/// # Safety
/// `ptr` is valid for `len` writes of `f32` and no one else accesses it meanwhile.
unsafe fn dst<'a>(ptr: DevicePtr, len: usize) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut(ptr.0 as *mut f32, len)
}

/// Runs one kernel on the calling thread.
///
/// # Safety
/// Every pointer in `kernel` is valid for the extent it describes, outputs do not alias
/// inputs, and no other thread writes those bytes while this runs (the allocator's event
/// gating and the tensor layer's cross-stream waits guarantee it).
pub(crate) unsafe fn run(kernel: &Kernel) {
    if super::half::run_if_half(kernel) {
        return;
    }
    match kernel {
        Kernel::Cast { .. } => unreachable!("conversions run in run_if_half"),
        Kernel::Fill {
            out, len, value, ..
        } => dst(*out, *len).fill(*value),
        Kernel::Sleep { nanos } => std::thread::sleep(std::time::Duration::from_nanos(*nanos)),
        Kernel::Copy {
            src: s,
            shape,
            out,
            elem_size,
        } => copy(s, shape, *out, *elem_size),
        Kernel::Matmul {
            a,
            b,
            bias,
            out,
            batch,
            m,
            n,
            k,
            ..
        } => {
            for bi in 0..*batch {
                let pa = (a.ptr.0 as *const f32).add(bi * a.batch_stride);
                let pb = (b.ptr.0 as *const f32).add(bi * b.batch_stride);
                let pc = (out.0 as *mut f32).add(bi * m * n);
                matrixmultiply::sgemm(
                    *m,
                    *k,
                    *n,
                    1.0,
                    pa,
                    a.rs as isize,
                    a.cs as isize,
                    pb,
                    b.rs as isize,
                    b.cs as isize,
                    0.0,
                    pc,
                    *n as isize,
                    1,
                );
            }
            if let Some(bias) = bias {
                let bias = src(*bias, *n);
                if *n > 0 {
                    for row in dst(*out, batch * m * n).chunks_exact_mut(*n) {
                        row.iter_mut().zip(bias).for_each(|(y, &b)| *y += b);
                    }
                }
            }
        }
        Kernel::Unary {
            op, x, out, len, ..
        } => {
            let (x, y) = (src(*x, *len), dst(*out, *len));
            match *op {
                UnaryOp::Relu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.max(0.0)),
                UnaryOp::Gelu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = gelu(x)),
                UnaryOp::Tanh => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.tanh()),
                UnaryOp::Exp => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.exp()),
                UnaryOp::Sqrt => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.sqrt()),
                UnaryOp::Sqr => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * x),
                UnaryOp::Neg => y.iter_mut().zip(x).for_each(|(y, &x)| *y = -x),
                UnaryOp::Recip => y.iter_mut().zip(x).for_each(|(y, &x)| *y = 1.0 / x),
                UnaryOp::Affine { mul, add } => {
                    y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * mul + add)
                }
            }
        }
        Kernel::Binary {
            op,
            a,
            b,
            shape,
            out,
            ..
        } => binary(*op, a, b, shape, *out),
        // Zero-width rows have nothing to compute (and `chunks_exact(0)` panics).
        Kernel::Softmax { cols: 0, .. } | Kernel::BiasAct { cols: 0, .. } => {}
        Kernel::IndexSelect { row_len: 0, .. } => {}
        Kernel::Softmax {
            x, out, rows, cols, ..
        } => {
            let (x, y) = (src(*x, rows * cols), dst(*out, rows * cols));
            for (xr, yr) in x.chunks_exact(*cols).zip(y.chunks_exact_mut(*cols)) {
                let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // f64 accumulation: an f32 running sum drifts past 1e-5 on long rows.
                let mut sum = 0.0f64;
                for (y, &x) in yr.iter_mut().zip(xr) {
                    *y = (x - max).exp();
                    sum += *y as f64;
                }
                let inv = (1.0 / sum) as f32;
                yr.iter_mut().for_each(|y| *y *= inv);
            }
        }
        Kernel::LayerNorm {
            x,
            residual,
            gamma,
            beta,
            out,
            rows,
            cols,
            eps,
            ..
        } => {
            let (n, c) = (rows * cols, *cols);
            let (x, y) = (src(*x, n), dst(*out, n));
            let res = residual.map(|r| src(r, n));
            let (g, bt) = (src(*gamma, c), src(*beta, c));
            for r in 0..*rows {
                let yr = &mut y[r * c..(r + 1) * c];
                yr.copy_from_slice(&x[r * c..(r + 1) * c]);
                if let Some(res) = res {
                    yr.iter_mut()
                        .zip(&res[r * c..(r + 1) * c])
                        .for_each(|(y, &r)| *y += r);
                }
                // f64 accumulation keeps the statistics accurate for wide rows at no real cost.
                let mean = yr.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
                let var = yr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
                let inv = 1.0 / (var + *eps as f64).sqrt();
                for ((y, &g), &b) in yr.iter_mut().zip(g).zip(bt) {
                    *y = ((*y as f64 - mean) * inv) as f32 * g + b;
                }
            }
        }
        Kernel::BiasAct {
            x,
            bias,
            out,
            rows,
            cols,
            act,
            ..
        } => {
            let (x, y, b) = (
                src(*x, rows * cols),
                dst(*out, rows * cols),
                src(*bias, *cols),
            );
            for (xr, yr) in x.chunks_exact(*cols).zip(y.chunks_exact_mut(*cols)) {
                for ((y, &x), &b) in yr.iter_mut().zip(xr).zip(b) {
                    let v = x + b;
                    *y = match act {
                        Activation::Identity => v,
                        Activation::Relu => v.max(0.0),
                        Activation::Gelu => gelu(v),
                    };
                }
            }
        }
        Kernel::IndexSelect {
            table,
            ids,
            out,
            n_ids,
            row_len,
            table_rows,
            ..
        } => {
            let ids = std::slice::from_raw_parts(ids.0 as *const i64, *n_ids);
            let table = src(*table, table_rows * row_len);
            let y = dst(*out, n_ids * row_len);
            for (yr, &id) in y.chunks_exact_mut(*row_len).zip(ids) {
                // Out-of-range ids give zero rows (the documented contract of `index_select`).
                if id < 0 || id as usize >= *table_rows {
                    yr.fill(0.0);
                } else {
                    let id = id as usize;
                    yr.copy_from_slice(&table[id * row_len..(id + 1) * row_len]);
                }
            }
        }
        Kernel::Reduce {
            op,
            x,
            out,
            outer,
            axis,
            inner,
            ..
        } => {
            if outer * inner == 0 {
                // An empty output; the input's `outer * axis * inner` need not even fit a usize.
                return;
            }
            let (x, y) = (src(*x, outer * axis * inner), dst(*out, outer * inner));
            for o in 0..*outer {
                for i in 0..*inner {
                    let vals = (0..*axis).map(|a| x[(o * axis + a) * inner + i]);
                    // Sums accumulate in f64: an f32 running sum of 2^20 positive values
                    // is off by more than 1e-5 relative.
                    let sum = || vals.clone().map(f64::from).sum::<f64>();
                    y[o * inner + i] = match op {
                        ReduceOp::Sum => sum() as f32,
                        ReduceOp::Mean => (sum() / *axis as f64) as f32,
                        ReduceOp::Max => vals.clone().fold(f32::NEG_INFINITY, f32::max),
                    };
                }
            }
        }
        Kernel::Attention {
            qkv,
            mask,
            out,
            batch,
            seq,
            heads,
            head_dim,
            ..
        } => attention(*qkv, *mask, *out, *batch, *seq, *heads, *head_dim),
        Kernel::MeanPoolNorm {
            x,
            mask,
            out,
            batch,
            seq,
            dim,
            ..
        } => mean_pool_norm(*x, *mask, *out, *batch, *seq, *dim),
    }
}

/// `Kernel::Attention` in `f32`, one query at a time (the reference for the CUDA kernel).
unsafe fn attention(
    qkv: DevicePtr,
    mask: Option<DevicePtr>,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    heads: usize,
    d: usize,
) {
    let hidden = heads * d;
    let width = 3 * hidden;
    let x = src(qkv, batch * seq * width);
    let y = dst(out, batch * seq * hidden);
    let mask = mask.map(|m| src(m, batch * seq));
    let mut p = vec![0.0f32; seq];
    for b in 0..batch {
        let tok = |j: usize| &x[(b * seq + j) * width..(b * seq + j + 1) * width];
        for h in 0..heads {
            for i in 0..seq {
                let q = &tok(i)[h * d..(h + 1) * d];
                let mut max = f32::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate() {
                    let k = &tok(j)[hidden + h * d..hidden + (h + 1) * d];
                    // A padded key scores f32::MIN: exp underflows to 0 unless every key is
                    // padding, and then the row is uniform (Hugging Face's additive mask).
                    *pj = match mask {
                        Some(m) if m[b * seq + j] == 0.0 => f32::MIN,
                        _ => q.iter().zip(k).map(|(a, b)| a * b).sum(),
                    };
                    max = max.max(*pj);
                }
                let mut sum = 0.0f64;
                for pj in p.iter_mut() {
                    *pj = (*pj - max).exp();
                    sum += *pj as f64;
                }
                let inv = (1.0 / sum) as f32;
                let yr = &mut y[(b * seq + i) * hidden + h * d..][..d];
                yr.fill(0.0);
                for (j, &pj) in p.iter().enumerate() {
                    let v = &tok(j)[2 * hidden + h * d..2 * hidden + (h + 1) * d];
                    yr.iter_mut().zip(v).for_each(|(o, &v)| *o += pj * v);
                }
                yr.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

/// `Kernel::MeanPoolNorm` in `f32`, sums in `f64`.
unsafe fn mean_pool_norm(
    x: DevicePtr,
    mask: DevicePtr,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    dim: usize,
) {
    let (x, m, y) = (
        src(x, batch * seq * dim),
        src(mask, batch * seq),
        dst(out, batch * dim),
    );
    let mut acc = vec![0.0f64; dim];
    for b in 0..batch {
        acc.fill(0.0);
        let mut count = 0.0f64;
        for s in 0..seq {
            let w = m[b * seq + s] as f64;
            count += w;
            if w != 0.0 {
                let row = &x[(b * seq + s) * dim..][..dim];
                acc.iter_mut()
                    .zip(row)
                    .for_each(|(a, &v)| *a += w * v as f64);
            }
        }
        let count = count.max(1e-9);
        let norm = acc
            .iter()
            .map(|a| (a / count).powi(2))
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        for (o, a) in y[b * dim..][..dim].iter_mut().zip(&acc) {
            *o = (a / count / norm) as f32;
        }
    }
}

/// GELU in its exact (erf) form, as BERT uses it.
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Calls `f(outer_offsets, inner_len)` for every run of the innermost dimension of `shape`,
/// with each operand's element offset at the start of that run.
fn for_each_row<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut([usize; N], usize),
) {
    let rank = shape.len();
    if rank == 0 {
        f([0; N], 1);
        return;
    }
    if shape.contains(&0) {
        return;
    }
    let inner = shape[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    loop {
        let mut offs = [0usize; N];
        for (o, s) in offs.iter_mut().zip(strides.iter()) {
            *o = idx.iter().zip(s.iter()).map(|(i, s)| i * s).sum();
        }
        f(offs, inner);
        // Odometer increment over the outer dimensions.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

unsafe fn copy(s: &Strided, shape: &[usize], out: DevicePtr, elem_size: usize) {
    unsafe fn gather<T: Copy>(s: &Strided, shape: &[usize], out: DevicePtr) {
        let rank = shape.len();
        let inner_stride = if rank == 0 { 1 } else { s.strides[rank - 1] };
        let base = s.ptr.0 as *const T;
        let mut y = out.0 as *mut T;
        for_each_row(shape, [&s.strides], |[off], inner| {
            let row = base.add(off);
            if inner_stride == 1 {
                std::ptr::copy_nonoverlapping(row, y, inner);
            } else {
                for i in 0..inner {
                    *y.add(i) = *row.add(i * inner_stride);
                }
            }
            y = y.add(inner);
        });
    }
    match elem_size {
        2 => gather::<u16>(s, shape, out),
        4 => gather::<u32>(s, shape, out),
        8 => gather::<u64>(s, shape, out),
        // The tensor layer only creates copies of its own dtypes (2, 4 or 8 bytes).
        other => panic!("copy kernel: unsupported element size {other}"),
    }
}

unsafe fn binary(op: BinaryOp, a: &Strided, b: &Strided, shape: &[usize], out: DevicePtr) {
    let f: fn(f32, f32) -> f32 = match op {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Sub => |x, y| x - y,
        BinaryOp::Mul => |x, y| x * y,
        BinaryOp::Div => |x, y| x / y,
        BinaryOp::Max => f32::max,
    };
    let rank = shape.len();
    let (sa, sb) = if rank == 0 {
        (0, 0)
    } else {
        (a.strides[rank - 1], b.strides[rank - 1])
    };
    let (pa, pb) = (a.ptr.0 as *const f32, b.ptr.0 as *const f32);
    let mut y = out.0 as *mut f32;
    for_each_row(shape, [&a.strides, &b.strides], |[oa, ob], inner| {
        let (ra, rb) = (pa.add(oa), pb.add(ob));
        for i in 0..inner {
            *y.add(i) = f(*ra.add(i * sa), *rb.add(i * sb));
        }
        y = y.add(inner);
    });
}
