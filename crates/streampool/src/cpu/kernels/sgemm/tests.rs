//! Each `f32` microkernel the host has against an `f64` product: odd shapes (row and panel
//! tails), strided and transposed activations, every activation, with the weight packed per
//! call and through a slot (packed by the first call, reused by the second).

use rand::{Rng, SeedableRng};

use super::*;

fn paths() -> Vec<SgemmIsa> {
    [SgemmIsa::Avx512, SgemmIsa::Avx2]
        .into_iter()
        .filter(|p| p.available())
        .collect()
}

/// One case: `batch x [m, k] @ w (+ bias, act)`, `a` rows `lda` apart (or transposed: `a` is
/// `[k, m]` columns `lda` apart), `w` `[k, n]` rows `ldw` apart shared by the batch.
#[derive(Clone, Copy)]
struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldw: usize,
    a_transposed: bool,
    act: Activation,
    bias: bool,
}

/// Runs `case` through `isa` (`slot`: the weight's slot, or packed per call) and checks
/// every element against `f64`.
fn check(isa: SgemmIsa, c: Case, slot: Option<&PackSlot>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rand =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let a_len = if c.a_transposed {
        c.k * c.lda
    } else {
        c.m * c.lda
    };
    let a = rand(c.batch * a_len);
    let w = rand(c.k * c.ldw);
    let bias = rand(c.n);
    // Poisoned output: every element must be written.
    let mut out = vec![f32::NAN; c.batch * c.m * c.n];
    let (rs, cs) = if c.a_transposed {
        (1, c.lda)
    } else {
        (c.lda, 1)
    };
    let ao = MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride: a_len,
        rs,
        cs,
    };
    let bo = MatOperand {
        ptr: DevicePtr(w.as_ptr() as u64),
        batch_stride: 0,
        rs: c.ldw,
        cs: 1,
    };
    let bias_ptr = c.bias.then_some(DevicePtr(bias.as_ptr() as u64));
    // SAFETY: the buffers above hold exactly the extents the operands describe.
    let ran = unsafe {
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
    assert!(ran, "{isa:?} refused {}x{}x{}x{}", c.batch, c.m, c.n, c.k);
    for bi in 0..c.batch {
        for i in 0..c.m {
            for j in 0..c.n {
                let (mut r, mut mag) = (0.0f64, 0.0f64);
                for p in 0..c.k {
                    let x = f64::from(a[bi * a_len + i * rs + p * cs]);
                    let y = f64::from(w[p * c.ldw + j]);
                    r += x * y;
                    mag += (x * y).abs();
                }
                if c.bias {
                    r += f64::from(bias[j]);
                    mag += f64::from(bias[j]).abs();
                }
                let r = f64::from(super::super::epilogue::activate(c.act, r as f32));
                let o = f64::from(out[bi * c.m * c.n + i * c.n + j]);
                // f32 accumulation: a few units of f32 rounding of the magnitudes summed.
                let tol = 1e-6 * (mag + 1.0) * (c.k as f64).sqrt().max(1.0);
                assert!(
                    (o - r).abs() <= tol,
                    "{isa:?} {}x{}x{}x{} [{bi},{i},{j}]: {o} vs {r} (tol {tol})",
                    c.batch,
                    c.m,
                    c.n,
                    c.k
                );
            }
        }
    }
}

#[test]
fn every_available_path_matches_f64_across_shapes() {
    use Activation::*;
    let shapes = [
        // (batch, m, n, k): edges of the 6- and 8-row tiles and the 16- and 48-column panels.
        (1, 1, 1, 1),
        (1, 5, 13, 3),
        (1, 9, 47, 17),
        (2, 8, 48, 32),
        (1, 17, 97, 65),
        (1, 33, 100, 96),
        (3, 13, 50, 7),
        (1, 70, 384, 384),
    ];
    for isa in paths() {
        for (s, &(batch, m, n, k)) in shapes.iter().enumerate() {
            let s = s as u64;
            let base = Case {
                batch,
                m,
                n,
                k,
                lda: k,
                ldw: n,
                a_transposed: false,
                act: Identity,
                bias: false,
            };
            check(isa, base, None, s);
            let strided = Case {
                lda: k + 5,
                ldw: n + 3,
                act: Gelu,
                bias: true,
                ..base
            };
            check(isa, strided, None, 100 + s);
            let transposed = Case {
                lda: m + 2,
                a_transposed: true,
                act: GeluTanh,
                bias: true,
                ..base
            };
            check(isa, transposed, None, 200 + s);
            // Through a slot: the first call packs, the second reuses.
            let slot = PackSlot::default();
            let relu = Case {
                act: Relu,
                bias: true,
                ..base
            };
            check(isa, relu, Some(&slot), 300 + s);
            assert!(slot.get().is_some(), "{isa:?}: the slot was not filled");
            check(isa, relu, Some(&slot), 300 + s);
        }
    }
}

#[test]
fn a_slot_packed_from_another_operand_is_not_used() {
    let (m, n, k) = (9, 50, 20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    // Two weights alive at once (distinct addresses), the second also viewed narrower.
    let w1: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let w2: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let op = |p: &[f32], rs| MatOperand {
        ptr: DevicePtr(p.as_ptr() as u64),
        batch_stride: 0,
        rs,
        cs: 1,
    };
    for isa in paths() {
        let run = |w: &[f32], cols: usize, slot: Option<&PackSlot>| {
            let mut out = vec![f32::NAN; m * cols];
            // SAFETY: the buffers hold the extents the operands describe.
            let ran = unsafe {
                let o = DevicePtr(out.as_mut_ptr() as u64);
                let act = Activation::Identity;
                matmul_on(
                    isa,
                    &op(&a, k),
                    &op(w, n),
                    slot,
                    None,
                    act,
                    o,
                    1,
                    m,
                    cols,
                    k,
                )
            };
            assert!(ran);
            out
        };
        let slot = PackSlot::default();
        assert_eq!(run(&w1, n, Some(&slot)), run(&w1, n, None), "{isa:?}: w1");
        // The slot holds w1: products of w2, or of a narrower view of w1, pack their own.
        assert_eq!(run(&w2, n, Some(&slot)), run(&w2, n, None), "{isa:?}: w2");
        assert_eq!(
            run(&w1, 40, Some(&slot)),
            run(&w1, 40, None),
            "{isa:?}: w1 narrower"
        );
        assert_eq!(
            run(&w1, n, Some(&slot)),
            run(&w1, n, None),
            "{isa:?}: w1 again"
        );
    }
}

#[test]
fn batches_of_distinct_weights_and_empty_sums_are_left_to_gemm() {
    let a = [1.0f32; 4];
    let mut out = [f32::NAN; 4];
    let op = |batch_stride| MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride,
        rs: 2,
        cs: 1,
    };
    let o = DevicePtr(out.as_mut_ptr() as u64);
    for isa in paths() {
        // SAFETY: both calls are refused before reading or writing anything.
        unsafe {
            let act = Activation::Identity;
            assert!(!matmul_on(
                isa,
                &op(2),
                &op(2),
                None,
                None,
                act,
                o,
                2,
                1,
                1,
                2
            ));
            assert!(!matmul_on(
                isa,
                &op(0),
                &op(0),
                None,
                None,
                act,
                o,
                1,
                2,
                2,
                0
            ));
        }
    }
    assert!(out.iter().all(|v| v.is_nan()), "a refused product wrote");
}

#[test]
fn the_process_path_is_one_the_host_has() {
    match cpu_sgemm_isa() {
        Some(p) => assert!(p.available(), "{p:?}"),
        None => assert!(
            paths().is_empty()
                || crate::config::tuning().cpu.sgemm == Some(crate::config::SgemmPath::Gemm),
            "the host has {:?} but the process uses the gemm crate",
            paths()
        ),
    }
}

#[test]
fn steps_along_k_give_the_one_pass_result() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for isa in paths() {
        // (m, n, k): row and panel tails, k a multiple of the step and not.
        for (m, n, k) in [(9, 50, 20), (17, 96, 64), (3, 13, 7)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
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
            let bias_ptr = Some(DevicePtr(bias.as_ptr() as u64));
            // SAFETY: the buffers hold the extents the operands describe.
            let packed = unsafe { pack(&bo, k, n, isa) };
            let run_kc = |kc: usize| {
                let mut out = vec![f32::NAN; m * n];
                let o = DevicePtr(out.as_mut_ptr() as u64);
                // SAFETY: as above; kc > 0.
                unsafe {
                    run(
                        isa,
                        &ao,
                        &packed,
                        bias_ptr,
                        Activation::Gelu,
                        o,
                        1,
                        m,
                        n,
                        k,
                        kc,
                    )
                };
                out
            };
            // The same sums in the same order: the same bits.
            let whole = run_kc(k);
            for kc in [1, 5, 16] {
                assert_eq!(run_kc(kc), whole, "{isa:?} {m}x{n}x{k} in steps of {kc}");
            }
        }
    }
}
