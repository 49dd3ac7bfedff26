//! Each int8 path the host has against an `f64` evaluation of the quantized arithmetic the
//! module docs define: the quantized weights themselves, then the products (integer sums
//! per group exact, the dequantized values within `f32` rounding) over odd shapes (row and panel tails,
//! odd `k`), strided activations, a shared weight over a batch, every activation, with the
//! weight quantized per call and through a slot.

use rand::{Rng, SeedableRng};

use super::*;
use crate::cpu::kernels::epilogue::activate;

fn paths() -> Vec<QgemmIsa> {
    [QgemmIsa::Avx2, QgemmIsa::Scalar]
        .into_iter()
        .filter(|p| p.available())
        .collect()
}

/// The documented quantization of one row or column, evaluated on its own: the scale, and
/// the integers.
fn reference_quantize(x: &[f32]) -> (f32, Vec<i64>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return (0.0, vec![0; x.len()]);
    }
    let inv = 127.0f32 / amax;
    let q = x
        .iter()
        .map(|&v| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i64)
        .collect();
    (amax / 127.0, q)
}

struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    /// Distance between rows of `a` (>= k); columns are `cs` apart.
    lda: usize,
    cs: usize,
    act: Activation,
    bias: bool,
}

/// Runs `c` through `isa` and checks every output against `f64`; returns the largest error
/// relative to the magnitude of the terms.
fn check(isa: QgemmIsa, c: &Case, slot: Option<&PackSlot>, seed: u64) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let a_len = c.m * c.lda * c.cs.max(1);
    let a: Vec<f32> = (0..c.batch * a_len)
        .map(|_| rng.gen_range(-3.0..3.0))
        .collect();
    let w: Vec<f32> = (0..c.k * c.n).map(|_| rng.gen_range(-0.2..0.2)).collect();
    let bias: Vec<f32> = (0..c.n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut out = vec![f32::NAN; c.batch * c.m * c.n];
    let ao = MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride: a_len,
        rs: c.lda * c.cs,
        cs: c.cs,
    };
    let bo = MatOperand {
        ptr: DevicePtr(w.as_ptr() as u64),
        batch_stride: 0,
        rs: c.n,
        cs: 1,
    };
    let bias_ptr = c.bias.then_some(DevicePtr(bias.as_ptr() as u64));
    // SAFETY: the buffers hold exactly the extents the operands describe.
    unsafe {
        matmul_on(
            isa,
            &ao,
            &bo,
            slot,
            bias_ptr,
            c.act,
            DevicePtr(out.as_mut_ptr() as u64),
            c.batch,
            c.m,
            c.n,
            c.k,
        )
    };
    let cols: Vec<(f32, Vec<i64>)> = (0..c.n)
        .map(|j| {
            let col: Vec<f32> = (0..c.k).map(|p| w[p * c.n + j]).collect();
            reference_quantize(&col)
        })
        .collect();
    let mut worst = 0.0f64;
    for bi in 0..c.batch {
        for i in 0..c.m {
            let row: Vec<f32> = (0..c.k)
                .map(|p| a[bi * a_len + i * c.lda * c.cs + p * c.cs])
                .collect();
            let groups: Vec<(f32, Vec<i64>)> = row.chunks(GROUP).map(reference_quantize).collect();
            for (j, (sw, qw)) in cols.iter().enumerate() {
                // Exact integer sums per group, scaled and summed in f64.
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for (g, (sa, qa)) in groups.iter().enumerate() {
                    let acc: i64 = qa.iter().zip(&qw[g * GROUP..]).map(|(x, y)| x * y).sum();
                    sum += acc as f64 * f64::from(*sa);
                    mag += (acc as f64 * f64::from(*sa)).abs();
                }
                let b = if c.bias { f64::from(bias[j]) } else { 0.0 };
                let pre = sum * f64::from(*sw) + b;
                let want = f64::from(activate(c.act, pre as f32));
                let got = f64::from(out[(bi * c.m + i) * c.n + j]);
                // One f32 rounding per group (the convert, the product, the add) and the
                // epilogue's two, on terms at most this large; and the activation's own
                // error on a value that close.
                let mag = mag * f64::from(*sw) + b.abs() + 1e-6;
                let err = (got - want).abs() / mag;
                let bound = (3 * groups.len() + 4) as f64 * f64::from(f32::EPSILON);
                assert!(
                    err < bound,
                    "{isa:?} ({bi}, {i}, {j}) of {}x{}x{}x{}: {got} vs {want}",
                    c.batch,
                    c.m,
                    c.n,
                    c.k
                );
                worst = worst.max(err);
            }
        }
    }
    worst
}

#[test]
fn every_path_computes_the_quantized_product_it_claims() {
    let acts = [
        Activation::Identity,
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
    ];
    let mut seed = 0;
    for isa in paths() {
        for &(batch, m, n, k) in &[
            (1, 1, 1, 1),
            (1, 7, 17, 3),
            (1, 13, 33, 64),
            (2, 6, 16, 31),
            (3, 19, 48, 100),
            (1, 64, 40, 257),
        ] {
            for (ai, &act) in acts.iter().enumerate() {
                seed += 1;
                let bias = act != Activation::Identity || ai % 2 == 0 || m % 2 == 1;
                let c = Case {
                    batch,
                    m,
                    n,
                    k,
                    lda: k + ai,
                    cs: 1,
                    act,
                    bias,
                };
                check(isa, &c, None, seed);
                // Through a slot: quantized by the first call, reused by the second.
                let slot = PackSlot::default();
                check(isa, &c, Some(&slot), seed);
                assert!(slot.get().is_some_and(|p| p.is::<QuantizedB>()));
                check(isa, &c, Some(&slot), seed);
            }
        }
        // Strided activations (columns apart: a transposed view) take the portable
        // quantization; the product is the same.
        let c = Case {
            batch: 1,
            m: 9,
            n: 20,
            k: 15,
            lda: 15,
            cs: 3,
            act: Activation::Identity,
            bias: true,
        };
        check(isa, &c, None, 99);
    }
}

/// Integer operands whose quantization is the identity (each group of a row and each
/// column holds 127): the output is the integer product itself, exactly (every partial sum
/// stays under 2^24).
#[test]
fn integer_sums_are_exact() {
    let (m, n, k) = (11, 35, 1001);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut a: Vec<f32> = (0..m * k)
        .map(|_| rng.gen_range(-127..=127) as f32)
        .collect();
    let mut w: Vec<f32> = (0..k * n)
        .map(|_| rng.gen_range(-127..=127) as f32)
        .collect();
    for i in 0..m {
        for g in (0..k).step_by(GROUP) {
            let len = (k - g).min(GROUP);
            a[i * k + g + i % len] = 127.0;
        }
    }
    for j in 0..n {
        w[j * n + j] = -127.0;
    }
    for isa in paths() {
        let mut out = vec![f32::NAN; m * n];
        let ao = MatOperand {
            ptr: DevicePtr(a.as_ptr() as u64),
            batch_stride: 0,
            rs: k,
            cs: 1,
        };
        let bo = MatOperand {
            ptr: DevicePtr(w.as_ptr() as u64),
            batch_stride: 0,
            rs: n,
            cs: 1,
        };
        // SAFETY: the buffers hold exactly the extents the operands describe.
        unsafe {
            matmul_on(
                isa,
                &ao,
                &bo,
                None,
                None,
                Activation::Identity,
                DevicePtr(out.as_mut_ptr() as u64),
                1,
                m,
                n,
                k,
            )
        };
        for i in 0..m {
            for j in 0..n {
                let want: i64 = (0..k)
                    .map(|p| a[i * k + p] as i64 * w[p * n + j] as i64)
                    .sum();
                assert!(want.unsigned_abs() < 1 << 24);
                assert_eq!(out[i * n + j], want as f32, "{isa:?} ({i}, {j})");
            }
        }
    }
}

/// The weight's integers and scales are the documented ones; the largest magnitude of each
/// column quantizes to 127 and a zero column to zeros with scale 0.
#[test]
fn weights_quantize_per_column() {
    let (k, n) = (37, 21);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
    for p in 0..k {
        w[p * n + 5] = 0.0;
    }
    let bo = MatOperand {
        ptr: DevicePtr(w.as_ptr() as u64),
        batch_stride: 0,
        rs: n,
        cs: 1,
    };
    // SAFETY: `w` holds [k, n].
    let qb = unsafe { quantize_b(&bo, k, n) };
    for j in 0..n {
        let col: Vec<f32> = (0..k).map(|p| w[p * n + j]).collect();
        let (scale, q) = reference_quantize(&col);
        assert_eq!(qb.scales[j], scale);
        for p in 0..k {
            assert_eq!(i64::from(qb.q(p, j)), q[p], "({p}, {j})");
            // Within half a step of the value it stands for.
            let back = f64::from(qb.q(p, j)) * f64::from(scale);
            assert!((back - f64::from(col[p])).abs() <= 0.5 * f64::from(scale) * 1.0001);
        }
        let top = (0..k).map(|p| qb.q(p, j).abs()).max().unwrap();
        assert_eq!(top, if j == 5 { 0 } else { 127 });
    }
    // Past n and past k the packing holds zeros.
    assert!(qb.scales[n..].iter().all(|&s| s == 0.0));
    assert!((n..qb.scales.len()).all(|j| (0..k).all(|p| qb.q(p, j) == 0)));
    assert!((0..n).all(|j| qb.q(k, j) == 0)); // k is odd: the last step's second half
}

/// A row holding a NaN or an infinity gives NaN outputs (as the `f32` product would),
/// and the other rows are untouched by it.
#[test]
fn non_finite_rows_stay_non_finite() {
    let (m, n, k) = (3, 16, 24);
    let mut a = vec![0.5f32; m * k];
    a[k + 3] = f32::NAN;
    a[2 * k + 20] = f32::INFINITY;
    let w = vec![0.25f32; k * n];
    for isa in paths() {
        let mut out = vec![0.0f32; m * n];
        let ao = MatOperand {
            ptr: DevicePtr(a.as_ptr() as u64),
            batch_stride: 0,
            rs: k,
            cs: 1,
        };
        let bo = MatOperand {
            ptr: DevicePtr(w.as_ptr() as u64),
            batch_stride: 0,
            rs: n,
            cs: 1,
        };
        // SAFETY: the buffers hold exactly the extents the operands describe.
        unsafe {
            matmul_on(
                isa,
                &ao,
                &bo,
                None,
                None,
                Activation::Identity,
                DevicePtr(out.as_mut_ptr() as u64),
                1,
                m,
                n,
                k,
            )
        };
        assert!(out[..n].iter().all(|&v| (v - 3.0).abs() < 1e-6), "{isa:?}");
        assert!(out[n..].iter().all(|v| v.is_nan()), "{isa:?}");
    }
}
