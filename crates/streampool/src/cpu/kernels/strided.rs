//! Kernels over strided views: gathers and broadcasting binary ops, split by rows of the
//! innermost dimension over the intra-op pool.

use std::ops::Range;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{BinaryOp, Strided};

use super::{dst_at, src};

/// The number of runs of the innermost dimension of `shape` and their length (a scalar is
/// one run of one; a shape with a zero has no runs).
fn rows_of(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        None => (1, 1),
        Some((&inner, outer)) if inner > 0 => (outer.iter().product(), inner),
        Some(_) => (0, 0),
    }
}

/// Calls `f(row, outer_offsets)` for the runs `rows` of the innermost dimension of `shape`
/// (numbered in row-major order), with each operand's element offset at the start of the run.
fn for_rows<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    rows: Range<usize>,
    mut f: impl FnMut(usize, [usize; N]),
) {
    let outer = &shape[..shape.len().saturating_sub(1)];
    // The multi-index of the first run, then an odometer over the outer dimensions.
    let mut idx = vec![0usize; outer.len()];
    let mut rest = rows.start;
    for (d, &n) in outer.iter().enumerate().rev() {
        idx[d] = rest % n;
        rest /= n;
    }
    for row in rows {
        let mut offs = [0usize; N];
        for (o, s) in offs.iter_mut().zip(strides.iter()) {
            *o = idx.iter().zip(s.iter()).map(|(i, s)| i * s).sum();
        }
        f(row, offs);
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `Kernel::Copy`: gathers a strided view into contiguous `out`.
///
/// # Safety
/// `s` is valid for reads over `shape` under its strides and `out` for the shape's element
/// count of writes of `elem_size` bytes.
pub(super) unsafe fn copy(s: &Strided, shape: &[usize], out: DevicePtr, elem_size: usize) {
    unsafe fn gather<T: Copy + Send + Sync>(s: &Strided, shape: &[usize], out: DevicePtr) {
        let (rows, inner) = rows_of(shape);
        let inner_stride = shape.len().checked_sub(1).map_or(1, |d| s.strides[d]);
        let (base, y) = (s.ptr.0 as usize, out.0 as usize);
        intra_op::for_ranges(rows, inner, |r| {
            for_rows(shape, [&s.strides], r, |row, [off]| {
                let src = (base as *const T).add(off);
                let dst = (y as *mut T).add(row * inner);
                if inner_stride == 1 {
                    std::ptr::copy_nonoverlapping(src, dst, inner);
                } else {
                    for i in 0..inner {
                        *dst.add(i) = *src.add(i * inner_stride);
                    }
                }
            })
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

/// `Kernel::Binary` in `f32`, broadcasting through zero strides.
///
/// # Safety
/// `a` and `b` are valid for reads over `shape` under their strides, `out` for the shape's
/// element count of writes.
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
    let (rows, inner) = rows_of(shape);
    let last = shape.len().checked_sub(1);
    let (sa, sb) = last.map_or((0, 0), |d| (a.strides[d], b.strides[d]));
    let (pa, pb) = (a.ptr.0 as usize, b.ptr.0 as usize);
    intra_op::for_ranges(rows, inner, |r| {
        let y = dst_at(out, r.start * inner, r.len() * inner);
        let first = r.start;
        for_rows(shape, [&a.strides, &b.strides], r, |row, [oa, ob]| {
            let (ra, rb) = ((pa as *const f32).add(oa), (pb as *const f32).add(ob));
            let y = &mut y[(row - first) * inner..][..inner];
            if sa == 1 && sb == 1 {
                let (ra, rb) = (
                    src(DevicePtr(ra as u64), inner),
                    src(DevicePtr(rb as u64), inner),
                );
                y.iter_mut()
                    .zip(ra)
                    .zip(rb)
                    .for_each(|((y, &a), &b)| *y = f(a, b));
            } else {
                for (i, y) in y.iter_mut().enumerate() {
                    *y = f(*ra.add(i * sa), *rb.add(i * sb));
                }
            }
        })
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
    intra_op::for_ranges(n_ids, row_len, |r| {
        let y = dst_at(out, r.start * row_len, r.len() * row_len);
        for (yr, &id) in y.chunks_exact_mut(row_len).zip(&ids[r]) {
            if id < 0 || id as usize >= table_rows {
                yr.fill(0.0);
            } else {
                let id = id as usize;
                yr.copy_from_slice(&table[id * row_len..(id + 1) * row_len]);
            }
        }
    });
}
