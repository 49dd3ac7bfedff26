//! Kernels over strided views: gathers and broadcasting binary ops.

use crate::backend::DevicePtr;
use crate::kernel::{BinaryOp, Strided};

use super::{dst, src};

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

pub(super) unsafe fn copy(s: &Strided, shape: &[usize], out: DevicePtr, elem_size: usize) {
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

pub(super) unsafe fn binary(
    op: BinaryOp,
    a: &Strided,
    b: &Strided,
    shape: &[usize],
    out: DevicePtr,
) {
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

/// `Kernel::IndexSelect` in `f32` (`row_len > 0`): rows of `table` by `i64` id; ids outside
/// `0..table_rows` give zero rows (the documented contract of `index_select`).
///
/// # Safety
/// `table` is valid for `table_rows * row_len` reads, `ids` for `n_ids` reads of `i64`, `out`
/// for `n_ids * row_len` writes.
pub(super) unsafe fn index_select(
    table: DevicePtr,
    ids: DevicePtr,
    out: DevicePtr,
    n_ids: usize,
    row_len: usize,
    table_rows: usize,
) {
    let ids = std::slice::from_raw_parts(ids.0 as *const i64, n_ids);
    let table = src(table, table_rows * row_len);
    let y = dst(out, n_ids * row_len);
    for (yr, &id) in y.chunks_exact_mut(row_len).zip(ids) {
        if id < 0 || id as usize >= table_rows {
            yr.fill(0.0);
        } else {
            let id = id as usize;
            yr.copy_from_slice(&table[id * row_len..(id + 1) * row_len]);
        }
    }
}
