//! Each int8 path the host has against an `f64` evaluation of the quantized arithmetic the
//! module docs define: the quantized weights themselves, then the products (integer sums
//! per group exact, the dequantized values within `f32` rounding) over odd shapes (row and panel tails,
//! odd `k`), strided activations, a shared weight over a batch, every activation, with the
//! weight quantized per call and through a slot.

use rand::{Rng, SeedableRng};

use super::pack::quantize_b;
use super::*;
use crate::cpu::kernels::epilogue::activate;

fn paths() -> Vec<QgemmIsa> {
    let paths: Vec<QgemmIsa> = QgemmIsa::ALL
        .into_iter()
        .filter(|p| p.available())
        .collect();
    // Which paths this host checks (the others are checked where their hardware is).
    println!("int8 paths on this host: {paths:?}");
    paths
}

/// The documented quantization of one group or column to `[-max, max]`, evaluated on its
/// own: the scale, and the integers.
fn reference_quantize(x: &[f32], max: f32) -> (f32, Vec<i64>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return (0.0, vec![0; x.len()]);
    }
    let inv = max / amax;
    let q = x
        .iter()
        .map(|&v| (v * inv).round_ties_even().clamp(-max, max) as i64)
        .collect();
    (amax / max, q)
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
    // Per column, per group: the weight's scale and integers.
    let cols: Vec<Vec<(f32, Vec<i64>)>> = (0..c.n)
        .map(|j| {
            let col: Vec<f32> = (0..c.k).map(|p| w[p * c.n + j]).collect();
            col.chunks(GROUP)
                .map(|g| reference_quantize(g, W_MAX))
                .collect()
        })
        .collect();
    let mut worst = 0.0f64;
    for bi in 0..c.batch {
        for i in 0..c.m {
            let row: Vec<f32> = (0..c.k)
                .map(|p| a[bi * a_len + i * c.lda * c.cs + p * c.cs])
                .collect();
            let groups: Vec<(f32, Vec<i64>)> = row
                .chunks(GROUP)
                .map(|g| reference_quantize(g, A_MAX))
                .collect();
            for (j, wg) in cols.iter().enumerate() {
                // Exact integer sums per group, scaled and summed in f64.
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for ((sa, qa), (sw, qw)) in groups.iter().zip(wg) {
                    let acc: i64 = qa.iter().zip(qw).map(|(x, y)| x * y).sum();
                    let term = acc as f64 * f64::from(*sa) * f64::from(*sw);
                    sum += term;
                    mag += term.abs();
                }
                let b = if c.bias { f64::from(bias[j]) } else { 0.0 };
                let pre = sum + b;
                let want = f64::from(activate(c.act, pre as f32));
                let got = f64::from(out[(bi * c.m + i) * c.n + j]);
                // One f32 rounding per group (the scales' product, the convert, the
                // product, the add) and the bias's, on terms at most this large; and the
                // activation's own error on a value that close.
                let mag = mag + b.abs() + 1e-6;
                let err = (got - want).abs() / mag;
                let bound = (4 * groups.len() + 4) as f64 * f64::from(f32::EPSILON);
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

/// Integer operands whose quantization is the identity (each group of a row holds
/// `A_MAX`, each group of a column `-W_MAX`): the output is the integer product itself, exactly (every
/// partial sum stays under 2^24). Rows 0-1 are all `A_MAX` and columns 0-1 all `W_MAX` /
/// `-W_MAX`: the largest pairs `vpmaddubsw` ever adds (2 x 255 x 64), which must not
/// saturate.
#[test]
fn integer_sums_are_exact() {
    let (m, n, k) = (11, 35, 1001);
    let (am, wm) = (A_MAX as i32, W_MAX as i32);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-am..=am) as f32).collect();
    let mut w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-wm..=wm) as f32).collect();
    for i in 0..m {
        for g in (0..k).step_by(GROUP) {
            let len = (k - g).min(GROUP);
            a[i * k + g + i % len] = A_MAX;
        }
    }
    a[..2 * k].fill(A_MAX);
    for j in 0..n {
        for g in (0..k).step_by(GROUP) {
            let len = (k - g).min(GROUP);
            w[(g + j % len) * n + j] = -W_MAX;
        }
    }
    for p in 0..k {
        w[p * n] = W_MAX;
        w[p * n + 1] = -W_MAX;
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

/// Every path computes the same integers and sums them in the same order, so their outputs
/// are the same bits (a model quantized on one host means the same on another).
#[test]
fn every_path_gives_the_same_bits() {
    let (m, n, k) = (29, 50, 200);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-4.0..4.0)).collect();
    let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-0.3..0.3)).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let outs: Vec<(QgemmIsa, Vec<u32>)> = paths()
        .into_iter()
        .map(|isa| {
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
                    Some(DevicePtr(bias.as_ptr() as u64)),
                    Activation::Gelu,
                    DevicePtr(out.as_mut_ptr() as u64),
                    1,
                    m,
                    n,
                    k,
                )
            };
            (isa, out.iter().map(|v| v.to_bits()).collect())
        })
        .collect();
    let (first, want) = &outs[0];
    for (isa, got) in &outs[1..] {
        assert_eq!(got, want, "{isa:?} against {first:?}");
    }
}

/// The weight's integers, scales and corrections are the documented ones: the largest
/// magnitude of each column's group quantizes to `W_MAX`, a zero column to zeros with scale
/// 0.
#[test]
fn weights_quantize_per_column_and_group() {
    let (k, n) = (77, 21);
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
    let groups = k.div_ceil(GROUP);
    for j in 0..n {
        for g in 0..groups {
            let ps = g * GROUP..k.min((g + 1) * GROUP);
            let part: Vec<f32> = ps.clone().map(|p| w[p * n + j]).collect();
            let (scale, q) = reference_quantize(&part, W_MAX);
            assert_eq!(qb.scale(g, j), scale, "group {g}, column {j}");
            for (p, q) in ps.clone().zip(q) {
                assert_eq!(i64::from(qb.q(p, j)), q, "({p}, {j})");
                // Within half a step of the value it stands for.
                let back = f64::from(qb.q(p, j)) * f64::from(scale);
                let x = f64::from(w[p * n + j]);
                assert!((back - x).abs() <= 0.5 * f64::from(scale) * 1.0001);
            }
            let top = ps.clone().map(|p| qb.q(p, j).abs()).max().unwrap();
            assert_eq!(f32::from(top), if j == 5 { 0.0 } else { W_MAX });
            let sum: i32 = ps.map(|p| i32::from(qb.q(p, j))).sum();
            assert_eq!(qb.correction(g, j), -A_ZERO * sum, "group {g}, column {j}");
        }
    }
    // Past n and past k the packing holds zeros.
    let cols = n.next_multiple_of(NR);
    assert!((n..cols).all(|j| (0..groups).all(|g| qb.scale(g, j) == 0.0)));
    assert!((n..cols).all(|j| (0..k).all(|p| qb.q(p, j) == 0)));
    assert!((0..n).all(|j| (k..k.next_multiple_of(4)).all(|p| qb.q(p, j) == 0)));
    // the last step's tail
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

/// The arithmetic's description names the constants the kernels use (a cache of verdicts
/// keyed by it must miss when they change).
#[test]
fn the_arithmetic_description_names_the_constants() {
    let want = format!(
        "int8/2: activations per {GROUP} inputs to +-{A_MAX} stored +{A_ZERO}, weights per column and {GROUP} inputs to +-{W_MAX}"
    );
    assert_eq!(ARITHMETIC, want);
}
