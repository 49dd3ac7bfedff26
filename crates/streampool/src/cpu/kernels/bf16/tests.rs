//! Each `bf16` path the host has against a `f64` product of the same `bf16` inputs; CI's x86
//! hosts with AVX512_BF16 run the vector kernel, hosts with AMX the tile kernel, and every
//! host the portable refusal (the caller's widened `f32` product is tested with the other
//! half kernels).

use half::bf16;
use rand::{Rng, SeedableRng};

use super::*;
use crate::kernel::{Activation, MatOperand, PackSlot};

fn paths() -> Vec<Bf16Path> {
    [Bf16Path::Amx, Bf16Path::Avx512Bf16]
        .into_iter()
        .filter(|p| p.available())
        .collect()
}

fn rand_bf16(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<bf16> {
    (0..len)
        .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
        .collect()
}

/// Runs `batch x [m, k] @ b (+ bias, act)` through `path`, `a` rows `lda` apart, `b` either
/// `W^T` for `W` as `[n, k]` rows `ldw` apart (`kn` false: rs 1, cs `ldw`) or `[k, n]` rows
/// `ldw` apart (`kn` true, how a `Linear` keeps it: rs `ldw`, cs 1), and checks every element
/// against `f64`.
#[allow(clippy::too_many_arguments)]
fn check(
    path: Bf16Path,
    batch: usize,
    (m, n, k): (usize, usize, usize),
    lda: usize,
    ldw: usize,
    kn: bool,
    act: Activation,
    with_bias: bool,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let a = rand_bf16(&mut rng, batch * m * lda);
    let wlen = if kn { k * ldw } else { n * ldw };
    let w = rand_bf16(&mut rng, batch * wlen);
    let bias = rand_bf16(&mut rng, n);
    // Poisoned output: every element must be written.
    let mut out = vec![bf16::NAN; batch * m * n];
    let ao = MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride: m * lda,
        rs: lda,
        cs: 1,
    };
    let (rs, cs) = if kn { (ldw, 1) } else { (1, ldw) };
    let bo = MatOperand {
        ptr: DevicePtr(w.as_ptr() as u64),
        batch_stride: wlen,
        rs,
        cs,
    };
    let bias_ptr = with_bias.then_some(DevicePtr(bias.as_ptr() as u64));
    // SAFETY: the buffers above hold exactly the extents the operands describe.
    let ran = unsafe {
        matmul_on(
            path,
            &ao,
            &bo,
            None,
            bias_ptr,
            act,
            DevicePtr(out.as_mut_ptr() as u64),
            batch,
            m,
            n,
            k,
        )
    };
    assert!(ran, "{path:?} refused {batch}x{m}x{n}x{k}");
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut r, mut mag) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let x = f64::from(a[bi * m * lda + i * lda + kk].to_f32());
                    let y = f64::from(w[bi * wlen + kk * rs + j * cs].to_f32());
                    r += x * y;
                    mag += (x * y).abs();
                }
                if with_bias {
                    r += f64::from(bias[j].to_f32());
                    mag += f64::from(bias[j].to_f32()).abs();
                }
                let r = f64::from(super::super::epilogue::activate(act, r as f32));
                let o = f64::from(out[bi * m * n + i * n + j].to_f32());
                // f32 accumulation, then one rounding to bf16 (8 bits of mantissa).
                let tol = r.abs() / 256.0 + 1e-5 * mag + 1e-6;
                assert!(
                    (o - r).abs() <= tol,
                    "{path:?} {batch}x{m}x{n}x{k} [{bi},{i},{j}]: {o} vs {r} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn every_available_path_matches_f64_across_shapes() {
    let shapes = [
        // (batch, m, n, k): edges of the 32-row, 12- and 32-column and 32-deep blocks.
        (1, 1, 12, 2),
        (1, 5, 13, 34),
        (1, 17, 32, 32),
        (1, 32, 64, 64),
        (1, 33, 100, 96),
        (2, 70, 96, 128),
        (1, 64, 384, 384),
    ];
    for path in paths() {
        for (s, &(batch, m, n, k)) in shapes.iter().enumerate() {
            let (shape, s) = ((m, n, k), s as u64);
            use Activation::*;
            check(path, batch, shape, k, k, false, Identity, false, s);
            check(
                path,
                batch,
                shape,
                k + 6,
                k + 2,
                false,
                GeluTanh,
                true,
                100 + s,
            );
            check(path, batch, shape, k, n, true, Gelu, true, 200 + s);
            check(path, batch, shape, k + 2, n + 3, true, Relu, false, 300 + s);
        }
    }
}

/// The portable path (every host without bf16 arithmetic): the same product as a
/// `Kernel::Matmul` in `bf16`, widened to `f32`, against the vector kernel where there is one
/// and the `f64` product of the same inputs.
#[test]
fn the_portable_path_matches_f64_and_the_fast_paths() {
    use crate::kernel::{Kernel, Matmul, MatmulMath};
    use crate::DType;
    let (m, n, k) = (33, 100, 96);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let a = rand_bf16(&mut rng, m * k);
    let w = rand_bf16(&mut rng, n * k);
    let bias = rand_bf16(&mut rng, n);
    let ao = MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride: 0,
        rs: k,
        cs: 1,
    };
    let bo = MatOperand {
        ptr: DevicePtr(w.as_ptr() as u64),
        batch_stride: 0,
        rs: 1,
        cs: k,
    };
    let act = Activation::GeluTanh;
    let mut portable = vec![bf16::NAN; m * n];
    let kernel = Kernel::Matmul(Matmul {
        a: ao,
        b: bo,
        b_pack: None,
        bias: Some(DevicePtr(bias.as_ptr() as u64)),
        residual: None,
        act,
        out: DevicePtr(portable.as_mut_ptr() as u64),
        batch: 1,
        m,
        n,
        k,
        dtype: DType::BF16,
        math: MatmulMath::Exact,
    });
    // SAFETY: the buffers hold the extents the kernel describes.
    unsafe { crate::cpu::half::run_widened(&kernel, DType::BF16) };
    for i in 0..m {
        for j in 0..n {
            let mut r = f64::from(bias[j].to_f32());
            for kk in 0..k {
                r += f64::from(a[i * k + kk].to_f32()) * f64::from(w[j * k + kk].to_f32());
            }
            let r = f64::from(super::super::epilogue::activate(act, r as f32));
            let o = f64::from(portable[i * n + j].to_f32());
            assert!(
                (o - r).abs() <= r.abs() / 256.0 + 1e-4,
                "[{i},{j}]: {o} vs {r}"
            );
        }
    }
    for path in paths() {
        let mut fast = vec![bf16::NAN; m * n];
        // SAFETY: as above.
        assert!(unsafe {
            matmul_on(
                path,
                &ao,
                &bo,
                None,
                kernel_bias(&bias),
                act,
                DevicePtr(fast.as_mut_ptr() as u64),
                1,
                m,
                n,
                k,
            )
        });
        // Both round one f32 result to bf16: at most one bf16 step apart.
        for (f, p) in fast.iter().zip(&portable) {
            let (f, p) = (f.to_f32(), p.to_f32());
            assert!(
                (f - p).abs() <= p.abs() / 128.0 + 1e-4,
                "{path:?}: {f} vs portable {p}"
            );
        }
    }
}

fn kernel_bias(bias: &[bf16]) -> Option<DevicePtr> {
    Some(DevicePtr(bias.as_ptr() as u64))
}

#[test]
fn layouts_the_kernels_cannot_read_are_left_to_the_portable_product() {
    let a = [bf16::ONE; 12];
    let mut out = [bf16::NAN; 4];
    let op = |cs, rs| MatOperand {
        ptr: DevicePtr(a.as_ptr() as u64),
        batch_stride: 0,
        rs,
        cs,
    };
    let o = DevicePtr(out.as_mut_ptr() as u64);
    for path in paths().into_iter().chain([Bf16Path::Portable]) {
        // SAFETY: every call below is refused before reading or writing anything.
        unsafe {
            // Odd k; activations not unit-strided along k.
            assert!(!matmul_on(
                path,
                &op(1, 3),
                &op(2, 1),
                None,
                None,
                Activation::Identity,
                o,
                1,
                2,
                2,
                3
            ));
            assert!(!matmul_on(
                path,
                &op(2, 1),
                &op(2, 1),
                None,
                None,
                Activation::Identity,
                o,
                1,
                2,
                2,
                2
            ));
        }
    }
    assert!(
        out.iter().all(|v| v.is_nan()),
        "a refused product wrote its output"
    );
    // SAFETY: as above.
    assert!(!unsafe {
        matmul_on(
            Bf16Path::Portable,
            &op(1, 2),
            &op(2, 1),
            None,
            None,
            Activation::Identity,
            o,
            1,
            2,
            2,
            2,
        )
    });
}

#[test]
fn the_process_path_is_one_the_host_has() {
    let p = cpu_bf16_path();
    assert!(p.available(), "{p:?}");
    if crate::config::tuning().cpu.bf16.is_none() {
        // Unforced, it is the best the host has.
        let best = paths().first().copied().unwrap_or(Bf16Path::Portable);
        assert_eq!(p, best);
    }
}

#[test]
fn a_weight_packed_once_in_its_slot_gives_the_per_call_result() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for path in paths() {
        // (m, n, k): the vector kernel's column blocks, and AMX's 32-multiples.
        for (m, n, k) in [(5, 13, 34), (33, 64, 64), (32, 384, 384)] {
            let a = rand_bf16(&mut rng, m * k);
            let w = rand_bf16(&mut rng, k * n);
            let bias = rand_bf16(&mut rng, n);
            let ao = MatOperand {
                ptr: DevicePtr(a.as_ptr() as u64),
                batch_stride: 0,
                rs: k,
                cs: 1,
            };
            // [k, n] rows n apart: how a Linear keeps its weight.
            let bo = MatOperand {
                ptr: DevicePtr(w.as_ptr() as u64),
                batch_stride: 0,
                rs: n,
                cs: 1,
            };
            let run = |slot: Option<&PackSlot>| {
                let mut out = vec![bf16::NAN; m * n];
                // SAFETY: the buffers hold the extents the operands describe.
                let ran = unsafe {
                    matmul_on(
                        path,
                        &ao,
                        &bo,
                        slot,
                        kernel_bias(&bias),
                        Activation::Gelu,
                        DevicePtr(out.as_mut_ptr() as u64),
                        1,
                        m,
                        n,
                        k,
                    )
                };
                assert!(ran);
                out
            };
            let per_call = run(None);
            let slot = PackSlot::default();
            assert_eq!(run(Some(&slot)), per_call, "{path:?} {m}x{n}x{k}: packing");
            assert!(slot.get().is_some());
            assert_eq!(run(Some(&slot)), per_call, "{path:?} {m}x{n}x{k}: reuse");
        }
    }
}
