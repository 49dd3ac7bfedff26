//! Correctness of every public `Tensor` op against a float64 reference computed in this file
//! from the same random inputs (see `util` for the reference and the tolerance: element-wise
//! `|got - want| <= 1e-5 * max(1, |want|)`, norm-relative `1e-5` for matmul), plus the error
//! each bad input must give.
//!
//! A shared suite: it runs on the CPU backend and again under `wgpu` on a wgpu device; the
//! parent module supplies the device (`super::device_under_test`, `super::device_with`).

use crate::util::{assert_close, assert_norm_close, erf, gelu, rel_err, Nd, Rng};
use half::{bf16, f16};
use streampool::{Activation, DType, Device, DeviceConfig, Error, Tensor};

/// Asserts `$res` is `Err` matching `$pat` (a panic or `Ok` fails the test).
macro_rules! assert_err {
    ($res:expr, $pat:pat) => {
        match $res {
            Err($pat) => {}
            other => panic!(
                "{}: expected {}, got {:?}",
                stringify!($res),
                stringify!($pat),
                other
            ),
        }
    };
}

fn dev() -> Device {
    super::device_under_test()
}

/// A second, distinct CPU device (own pool and allocator), shared by the tests that need one.
fn other_dev() -> Device {
    static OTHER: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    OTHER
        .get_or_init(|| {
            Device::cpu_with(DeviceConfig {
                pool_size: 2,
                ..DeviceConfig::default()
            })
            .unwrap()
        })
        .clone()
}

/// A random standard-normal tensor and its float64 reference.
fn randn(rng: &mut Rng, shape: &[usize]) -> (Tensor, Nd<f64>) {
    let data = rng.normals(shape.iter().product());
    pair(data, shape)
}

/// A random uniform tensor in `[lo, hi)` and its float64 reference.
fn randu(rng: &mut Rng, shape: &[usize], lo: f32, hi: f32) -> (Tensor, Nd<f64>) {
    let data = rng.uniforms(shape.iter().product(), lo, hi);
    pair(data, shape)
}

fn pair(data: Vec<f32>, shape: &[usize]) -> (Tensor, Nd<f64>) {
    let r = Nd::from_f32(shape, &data);
    (Tensor::from_vec(data, shape, &dev()).unwrap(), r)
}

fn check(what: &str, got: &Tensor, want: &Nd<f64>) {
    assert_close(what, got.dims(), &got.to_vec::<f32>().unwrap(), want);
}

fn check_mm(what: &str, got: &Tensor, want: &Nd<f64>) {
    assert_norm_close(what, got.dims(), &got.to_vec::<f32>().unwrap(), want);
}

fn i64_tensor(data: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &dev()).unwrap()
}

// ---------------------------------------------------------------- creation and transfer

#[test]
fn from_vec_and_from_slice_round_trip_every_dtype() {
    let d = dev();
    let f: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let t = Tensor::from_vec(f.clone(), &[2, 3, 4], &d).unwrap();
    assert_eq!(
        (t.dims(), t.dtype(), t.rank()),
        (&[2, 3, 4][..], DType::F32, 3)
    );
    assert_eq!(t.elem_count(), 24);
    assert!(t.is_contiguous());
    assert_eq!(t.to_vec::<f32>().unwrap(), f);

    let i: Vec<i64> = (0..6).map(|i| i * 1_000_000_007 - 9).collect();
    let t = Tensor::from_slice(&i, &[6], &d).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_vec::<i64>().unwrap(), i);

    let h: Vec<f16> = f.iter().map(|&x| f16::from_f32(x)).collect();
    let t = Tensor::from_slice(&h, &[4, 6], &d).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_vec::<f16>().unwrap(), h);

    let b: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
    let t = Tensor::from_slice(&b, &[24], &d).unwrap();
    assert_eq!(t.dtype(), DType::BF16);
    assert_eq!(t.to_vec::<bf16>().unwrap(), b);

    // Rank 0 holds one element; zero-sized shapes hold none.
    let s = Tensor::from_vec(vec![2.5f32], &[], &d).unwrap();
    assert_eq!((s.rank(), s.elem_count()), (0, 1));
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![2.5]);
    let e = Tensor::from_vec(Vec::<f32>::new(), &[3, 0, 2], &d).unwrap();
    assert_eq!(e.elem_count(), 0);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn from_vec_with_wrong_length_is_a_shape_error() {
    let d = dev();
    assert_err!(
        Tensor::from_vec(vec![1.0f32; 5], &[2, 3], &d),
        Error::Shape { op: "from_vec", .. }
    );
    assert_err!(Tensor::from_slice(&[1i64; 2], &[], &d), Error::Shape { .. });
    assert_err!(
        Tensor::from_vec(vec![1.0f32], &[0], &d),
        Error::Shape { .. }
    );
}

#[test]
fn zeros_ones_full() {
    let d = dev();
    for shape in [&[][..], &[1], &[5], &[2, 3], &[2, 1, 4], &[3, 0]] {
        let n: usize = shape.iter().product();
        let z = Tensor::zeros(shape, &d).unwrap();
        assert_eq!((z.dims(), z.dtype()), (shape, DType::F32));
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.0; n]);
        assert_eq!(
            Tensor::ones(shape, &d).unwrap().to_vec::<f32>().unwrap(),
            vec![1.0; n]
        );
        assert_eq!(
            Tensor::full(-7.25, shape, &d)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![-7.25; n]
        );
    }
    let inf = Tensor::full(f32::NEG_INFINITY, &[3], &d).unwrap();
    assert_eq!(inf.to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY; 3]);
}

#[test]
fn randn_is_seeded_and_standard_normal() {
    let d = dev();
    let a = Tensor::randn(&[100, 100], 42, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = Tensor::randn(&[100, 100], 42, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let c = Tensor::randn(&[100, 100], 43, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b, "same seed, same values");
    assert_ne!(a, c, "different seed, different values");
    // The same seed on another device gives the same values too.
    let e = Tensor::randn(&[100, 100], 42, &other_dev())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, e);
    // 10k samples: the sample mean's standard error is 0.01, the variance's about 0.014.
    let n = a.len() as f64;
    let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((var - 1.0).abs() < 0.07, "variance {var}");
    assert!(a.iter().all(|x| x.is_finite()));
}

#[test]
fn rand_uniform_is_seeded_and_in_range() {
    let d = dev();
    let a = Tensor::rand_uniform(&[50, 40], -2.0, 3.0, 7, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = Tensor::rand_uniform(&[50, 40], -2.0, 3.0, 7, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    assert!(a.iter().all(|&x| (-2.0..3.0).contains(&x)));
    let mean = a.iter().map(|&x| x as f64).sum::<f64>() / a.len() as f64;
    // Uniform(-2, 3) has mean 0.5 and sd 1.44; the sample mean of 2000 has sd 0.032.
    assert!((mean - 0.5).abs() < 0.15, "mean {mean}");
    for (lo, hi) in [
        (1.0, 1.0),
        (2.0, 1.0),
        (f32::NAN, 1.0),
        (0.0, f32::NAN),
        (f32::NEG_INFINITY, 0.0),
        (0.0, f32::INFINITY),
        (-f32::MAX, f32::MAX),
    ] {
        assert_err!(
            Tensor::rand_uniform(&[3], lo, hi, 0, &d),
            Error::InvalidArgument(_)
        );
    }
}

#[test]
fn to_vec_checks_the_dtype() {
    let d = dev();
    let f = Tensor::zeros(&[2], &d).unwrap();
    match f.to_vec::<i64>() {
        Err(Error::DType {
            op: "to_vec",
            expected: DType::F32,
            got: DType::I64,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_err!(f.to_vec::<f16>(), Error::DType { .. });
    let i = i64_tensor(&[1, 2], &[2]);
    assert_err!(i.to_vec::<f32>(), Error::DType { .. });
    assert_err!(i.to_vec::<bf16>(), Error::DType { .. });
}

#[test]
fn to_scalar() {
    let d = dev();
    for shape in [&[][..], &[1], &[1, 1, 1]] {
        let t = Tensor::full(3.5, shape, &d).unwrap();
        assert_eq!(t.to_scalar().unwrap(), 3.5);
    }
    assert_err!(
        Tensor::zeros(&[2], &d).unwrap().to_scalar(),
        Error::Shape {
            op: "to_scalar",
            ..
        }
    );
    assert_err!(
        Tensor::zeros(&[0], &d).unwrap().to_scalar(),
        Error::Shape { .. }
    );
    assert_err!(i64_tensor(&[4], &[1]).to_scalar(), Error::DType { .. });
}

#[test]
fn to_device_copies_every_dtype_and_keeps_views_correct() {
    let (d, o) = (dev(), other_dev());
    let mut rng = Rng::new(1);
    let (x, xr) = randn(&mut rng, &[3, 4]);
    let same = x.to_device(&d).unwrap();
    assert!(same.shares_storage(&x));
    // A transposed view moves as its logical (row-major) elements.
    let moved = x.t().unwrap().to_device(&o).unwrap();
    assert!(moved.device().same(&o));
    assert!(!moved.device().same(&d));
    check("to_device", &moved, &xr.transpose(0, 1));
    let back = moved.to_device(&d).unwrap();
    check("to_device back", &back, &xr.transpose(0, 1));

    let ids = i64_tensor(&[5, -1, i64::MAX], &[3]);
    assert_eq!(
        ids.to_device(&o).unwrap().to_vec::<i64>().unwrap(),
        vec![5, -1, i64::MAX]
    );
    let h: Vec<f16> = [0.5f32, -2.0].iter().map(|&v| f16::from_f32(v)).collect();
    let ht = Tensor::from_slice(&h, &[2], &d).unwrap();
    assert_eq!(ht.to_device(&o).unwrap().to_vec::<f16>().unwrap(), h);
    let b: Vec<bf16> = [0.5f32, -2.0].iter().map(|&v| bf16::from_f32(v)).collect();
    let bt = Tensor::from_slice(&b, &[1, 2], &d).unwrap();
    let bo = bt.to_device(&o).unwrap();
    assert_eq!((bo.dims(), bo.to_vec::<bf16>().unwrap()), (&[1, 2][..], b));
}

// ---------------------------------------------------------------- matmul

#[test]
fn matmul_2d_odd_sizes() {
    let mut rng = Rng::new(10);
    for (m, k, n) in [
        (1, 1, 1),
        (1, 5, 1),
        (7, 13, 5),
        (33, 65, 17),
        (64, 64, 64),
        (2, 1, 3),
    ] {
        let (a, ar) = randn(&mut rng, &[m, k]);
        let (b, br) = randn(&mut rng, &[k, n]);
        check_mm(
            &format!("{m}x{k}x{n}"),
            &a.matmul(&b).unwrap(),
            &ar.matmul(&br),
        );
    }
}

#[test]
fn matmul_batched_3d_and_4d_and_shared_rhs() {
    let mut rng = Rng::new(11);
    let (a, ar) = randn(&mut rng, &[3, 7, 13]);
    let (b, br) = randn(&mut rng, &[3, 13, 5]);
    check_mm("3d", &a.matmul(&b).unwrap(), &ar.matmul(&br));

    let (a, ar) = randn(&mut rng, &[2, 3, 7, 13]);
    let (b, br) = randn(&mut rng, &[2, 3, 13, 5]);
    check_mm("4d", &a.matmul(&b).unwrap(), &ar.matmul(&br));

    let (w, wr) = randn(&mut rng, &[13, 5]);
    check_mm("4d @ shared 2d", &a.matmul(&w).unwrap(), &ar.matmul(&wr));
    let (a3, a3r) = randn(&mut rng, &[4, 33, 13]);
    check_mm("3d @ shared 2d", &a3.matmul(&w).unwrap(), &a3r.matmul(&wr));

    // Size-1 batch dims anywhere.
    let (a, ar) = randn(&mut rng, &[1, 4, 1, 6, 3]);
    let (b, br) = randn(&mut rng, &[1, 4, 1, 3, 2]);
    check_mm(
        "5d with unit batch dims",
        &a.matmul(&b).unwrap(),
        &ar.matmul(&br),
    );
}

#[test]
fn matmul_bias_adds_the_bias_to_every_row() {
    use streampool::MatmulMath;
    let mut rng = Rng::new(12);
    let (w, wr) = randn(&mut rng, &[13, 5]);
    let (bias, biasr) = randn(&mut rng, &[5]);
    let plus_bias = |m: &Nd<f64>| {
        let cols = *m.shape.last().unwrap();
        let data = m
            .data
            .iter()
            .enumerate()
            .map(|(i, v)| v + biasr.data[i % cols]);
        Nd::new(&m.shape, data.collect())
    };
    // 2-d, a contiguous 3-d batch (folded into one product), a transposed weight view and a
    // non-contiguous input (a batched product).
    let (a, ar) = randn(&mut rng, &[7, 13]);
    let got = a.matmul_bias(&w, &bias, MatmulMath::Exact).unwrap();
    check_mm("2d + bias", &got, &plus_bias(&ar.matmul(&wr)));
    let (a3, a3r) = randn(&mut rng, &[4, 33, 13]);
    let got = a3.matmul_bias(&w, &bias, MatmulMath::Exact).unwrap();
    check_mm("3d + bias", &got, &plus_bias(&a3r.matmul(&wr)));
    let (wt, wtr) = randn(&mut rng, &[5, 13]);
    let got = a3
        .matmul_bias(&wt.t().unwrap(), &bias, MatmulMath::Exact)
        .unwrap();
    check_mm(
        "3d @ w^T + bias",
        &got,
        &plus_bias(&a3r.matmul(&wtr.transpose(0, 1))),
    );
    let (at, atr) = randn(&mut rng, &[13, 4, 6]);
    let view = at.transpose(0, 2).unwrap(); // [6, 4, 13], strided
    let got = view.matmul_bias(&w, &bias, MatmulMath::Exact).unwrap();
    check_mm(
        "strided 3d + bias",
        &got,
        &plus_bias(&atr.transpose(0, 2).matmul(&wr)),
    );
    // Bias shape, dtype and device are checked.
    assert!(a.matmul_bias(&w, &w, MatmulMath::Exact).is_err());
    let b16 = bias.to_dtype(DType::F16).unwrap();
    assert!(a.matmul_bias(&w, &b16, MatmulMath::Exact).is_err());
}

/// `MatmulMath::Int8` on the CPU: close to the exact product (its own arithmetic is checked
/// exactly by the kernel's unit tests), through the plain, bias and bias + activation forms,
/// a folded 3-d batch, a strided input, and the weight's quantized form reused across calls.
/// Half operands are refused, and so is every backend other than the CPU.
#[test]
fn int8_matmul_is_close_to_the_exact_product_on_the_cpu_only() {
    use streampool::{DeviceKind, MatmulMath};
    let mut rng = Rng::new(37);
    let (w, wr) = randn(&mut rng, &[96, 50]);
    let (bias, biasr) = randn(&mut rng, &[50]);
    let (a, ar) = randn(&mut rng, &[37, 96]);
    let int8 = MatmulMath::Int8;
    if dev().kind() != DeviceKind::Cpu {
        assert_err!(a.matmul_with(&w, int8), Error::Unavailable(_));
        return;
    }
    // Relative to the output's norm: 8-bit rounding of both operands over 96 inputs.
    let close = |what: &str, got: &Tensor, want: &Nd<f64>| {
        assert_eq!(got.dims(), want.shape.as_slice(), "{what}");
        let rel = rel_err(&got.to_vec::<f32>().unwrap(), &want.data);
        assert!(rel < 1.5e-2, "{what}: relative error {rel}");
        assert!(rel > 0.0, "{what}: int8 cannot be exact on normal inputs");
    };
    let plain = a.matmul_with(&w, int8).unwrap();
    close("int8", &plain, &ar.matmul(&wr));
    // The second call reuses the weight's quantized form: the same bits.
    let again = a.matmul_with(&w, int8).unwrap();
    assert_eq!(
        plain.to_vec::<f32>().unwrap(),
        again.to_vec::<f32>().unwrap()
    );
    let plus_bias = |m: &Nd<f64>, act: fn(f64) -> f64| {
        let cols = *m.shape.last().unwrap();
        let data = m.data.iter().enumerate();
        Nd::new(
            &m.shape,
            data.map(|(i, v)| act(v + biasr.data[i % cols])).collect(),
        )
    };
    let got = a.matmul_bias(&w, &bias, int8).unwrap();
    close("int8 + bias", &got, &plus_bias(&ar.matmul(&wr), |v| v));
    let got = a
        .matmul_bias_act(&w, &bias, Activation::Relu, int8)
        .unwrap();
    close(
        "relu(int8 + bias)",
        &got,
        &plus_bias(&ar.matmul(&wr), |v| v.max(0.0)),
    );
    let (a3, a3r) = randn(&mut rng, &[3, 11, 96]);
    let got = a3.matmul_bias(&w, &bias, int8).unwrap();
    close("3d int8 + bias", &got, &plus_bias(&a3r.matmul(&wr), |v| v));
    let (at, atr) = randn(&mut rng, &[96, 9]);
    let got = at.t().unwrap().matmul_with(&w, int8).unwrap();
    close("strided int8", &got, &atr.transpose(0, 1).matmul(&wr));
    let (a16, w16) = (
        a.to_dtype(DType::F16).unwrap(),
        w.to_dtype(DType::F16).unwrap(),
    );
    assert_err!(a16.matmul_with(&w16, int8), Error::DType { .. });
}

#[test]
fn matmul_transposed_operands() {
    let mut rng = Rng::new(12);
    for (m, k, n) in [(1, 1, 1), (7, 13, 5), (33, 65, 17)] {
        let (at, atr) = randn(&mut rng, &[k, m]);
        let (bt, btr) = randn(&mut rng, &[n, k]);
        let (a, ar) = randn(&mut rng, &[m, k]);
        let (b, br) = randn(&mut rng, &[k, n]);
        let (a_t, b_t) = (at.t().unwrap(), bt.t().unwrap());
        assert!(!a_t.is_contiguous() || m == 1 || k == 1);
        let (art, brt) = (atr.transpose(0, 1), btr.transpose(0, 1));
        check_mm("A^T B", &a_t.matmul(&b).unwrap(), &art.matmul(&br));
        check_mm("A B^T", &a.matmul(&b_t).unwrap(), &ar.matmul(&brt));
        check_mm("A^T B^T", &a_t.matmul(&b_t).unwrap(), &art.matmul(&brt));
    }
    // Batched: attention-style q @ k^T.
    let (q, qr) = randn(&mut rng, &[2, 3, 7, 8]);
    let (k, kr) = randn(&mut rng, &[2, 3, 9, 8]);
    check_mm(
        "q k^T",
        &q.matmul(&k.t().unwrap()).unwrap(),
        &qr.matmul(&kr.transpose(2, 3)),
    );
    // A transposed shared right-hand side (as `x @ W^T` of a linear layer).
    let (w, wr) = randn(&mut rng, &[5, 8]);
    check_mm(
        "x W^T",
        &q.matmul(&w.t().unwrap()).unwrap(),
        &qr.matmul(&wr.transpose(0, 1)),
    );
}

#[test]
fn matmul_narrowed_and_permuted_operands() {
    let mut rng = Rng::new(13);
    // Row stride larger than the column count (a column slice).
    let (big, bigr) = randn(&mut rng, &[70, 70]);
    let a = big.narrow(0, 3, 33).unwrap().narrow(1, 2, 65).unwrap();
    let ar = bigr.narrow(0, 3, 33).narrow(1, 2, 65);
    assert!(!a.is_contiguous());
    let (b, br) = randn(&mut rng, &[65, 17]);
    check_mm("narrowed lhs", &a.matmul(&b).unwrap(), &ar.matmul(&br));
    // Narrowed right operand, plain and transposed (row stride 70, then column stride 70).
    let bn = big.narrow(1, 5, 17).unwrap().narrow(0, 4, 65).unwrap();
    let bnr = bigr.narrow(1, 5, 17).narrow(0, 4, 65);
    check_mm("narrowed rhs", &a.matmul(&bn).unwrap(), &ar.matmul(&bnr));
    let bt = big
        .narrow(0, 2, 17)
        .unwrap()
        .narrow(1, 1, 65)
        .unwrap()
        .t()
        .unwrap();
    let btr = bigr.narrow(0, 2, 17).narrow(1, 1, 65).transpose(0, 1);
    check_mm(
        "narrowed, transposed rhs",
        &a.matmul(&bt).unwrap(),
        &ar.matmul(&btr),
    );
    let at = big
        .narrow(0, 1, 65)
        .unwrap()
        .narrow(1, 0, 33)
        .unwrap()
        .t()
        .unwrap();
    let atr = bigr.narrow(0, 1, 65).narrow(1, 0, 33).transpose(0, 1);
    check_mm(
        "narrowed, transposed lhs",
        &at.matmul(&b).unwrap(),
        &atr.matmul(&br),
    );
    // Narrowed inner dims of a batch: the batch stride is not rows * cols.
    let (x, xr) = randn(&mut rng, &[4, 10, 12]);
    let xa = x.narrow(1, 1, 7).unwrap().narrow(2, 3, 6).unwrap();
    let xar = xr.narrow(1, 1, 7).narrow(2, 3, 6);
    let (y, yr) = randn(&mut rng, &[4, 6, 5]);
    check_mm("narrowed batch", &xa.matmul(&y).unwrap(), &xar.matmul(&yr));
    // Narrowed batch dim (offset into storage).
    let xb = x.narrow(0, 1, 2).unwrap();
    let (z, zr) = randn(&mut rng, &[2, 12, 3]);
    check_mm(
        "narrowed batch dim",
        &xb.matmul(&z).unwrap(),
        &xr.narrow(0, 1, 2).matmul(&zr),
    );
    // Batch dims swapped: they do not collapse to one stride, so the operand is copied.
    let (p, pr) = randn(&mut rng, &[3, 2, 5, 4]);
    let pt = p.transpose(0, 1).unwrap();
    let (q, qr) = randn(&mut rng, &[2, 3, 4, 6]);
    check_mm(
        "permuted batch",
        &pt.matmul(&q).unwrap(),
        &pr.transpose(0, 1).matmul(&qr),
    );
    // Batch dim moved inside the matrix: [m, batch, k] viewed as [batch, m, k].
    let (s, sr) = randn(&mut rng, &[5, 3, 4]);
    let st = s.transpose(0, 1).unwrap();
    let (u, ur) = randn(&mut rng, &[3, 4, 2]);
    check_mm(
        "interleaved batch",
        &st.matmul(&u).unwrap(),
        &sr.transpose(0, 1).matmul(&ur),
    );
    // 1x1 matrices whose strides are both not 1: contiguous (extent-1 dims may have any
    // stride), so they are not copied, and still valid operands.
    let (o, or) = randn(&mut rng, &[2, 3, 2]);
    let ov = o
        .transpose(0, 2)
        .unwrap()
        .narrow(1, 1, 1)
        .unwrap()
        .narrow(2, 1, 1)
        .unwrap();
    let ovr = or.transpose(0, 2).narrow(1, 1, 1).narrow(2, 1, 1); // [2, 1, 1]
    assert!(ov.is_contiguous());
    let (p1, p1r) = randn(&mut rng, &[2, 1, 3]);
    check_mm(
        "1x1 odd strides lhs",
        &ov.matmul(&p1).unwrap(),
        &ovr.matmul(&p1r),
    );
    let (p2, p2r) = randn(&mut rng, &[2, 4, 1]);
    check_mm(
        "1x1 odd strides rhs",
        &p2.matmul(&ov).unwrap(),
        &p2r.matmul(&ovr),
    );
    // Neither matrix stride is 1 (both swapped away from the last axis).
    let (v, vr) = randn(&mut rng, &[4, 3, 5]);
    let vt = v.transpose(0, 2).unwrap(); // [5, 3, 4], strides [1, 5, 15]
    let (w, wr) = randn(&mut rng, &[5, 4, 2]);
    check_mm(
        "no unit stride",
        &vt.matmul(&w).unwrap(),
        &vr.transpose(0, 2).matmul(&wr),
    );
}

#[test]
fn matmul_zero_sized() {
    let d = dev();
    let a = Tensor::zeros(&[0, 3], &d).unwrap();
    let b = Tensor::ones(&[3, 4], &d).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.dims(), &[0, 4]);
    assert!(c.to_vec::<f32>().unwrap().is_empty());
    // An empty inner dimension is a sum of nothing: zeros, even in recycled memory.
    for _ in 0..3 {
        let _dirty = Tensor::full(9.0, &[2, 3], &d).unwrap();
    }
    let a = Tensor::ones(&[2, 0], &d).unwrap();
    let b = Tensor::ones(&[0, 3], &d).unwrap();
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let a = Tensor::ones(&[0, 2, 3], &d).unwrap();
    let b = Tensor::ones(&[0, 3, 4], &d).unwrap();
    assert_eq!(a.matmul(&b).unwrap().dims(), &[0, 2, 4]);
    // Empty views whose matrix strides are not unit (an empty tensor counts as contiguous,
    // so it is not copied into unit strides either).
    let odd = Tensor::zeros(&[4, 0, 3], &d)
        .unwrap()
        .transpose(0, 2)
        .unwrap(); // [3, 0, 4]
    let w = Tensor::ones(&[3, 4, 2], &d).unwrap();
    assert_eq!(odd.matmul(&w).unwrap().dims(), &[3, 0, 2]);
    let odd_k = Tensor::zeros(&[0, 2, 3], &d)
        .unwrap()
        .transpose(0, 2)
        .unwrap(); // [3, 2, 0]
    let b = Tensor::ones(&[3, 0, 4], &d).unwrap();
    let c = odd_k.matmul(&b).unwrap();
    assert_eq!(c.dims(), &[3, 2, 4]);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0; 24]);
    let c = Tensor::ones(&[3, 4, 0], &d)
        .unwrap()
        .matmul(&odd_k.t().unwrap())
        .unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0; 24]);
}

#[test]
fn matmul_errors() {
    let d = dev();
    let z = |s: &[usize]| Tensor::zeros(s, &d).unwrap();
    assert_err!(
        z(&[2, 3]).matmul(&z(&[4, 2])),
        Error::Shape { op: "matmul", .. }
    );
    assert_err!(z(&[2, 2, 3]).matmul(&z(&[3, 3, 2])), Error::Shape { .. });
    assert_err!(z(&[2, 3]).matmul(&z(&[2, 3, 2])), Error::Shape { .. });
    assert_err!(z(&[3]).matmul(&z(&[3, 2])), Error::Shape { .. });
    assert_err!(z(&[2, 3]).matmul(&z(&[3])), Error::Shape { .. });
    assert_err!(z(&[]).matmul(&z(&[])), Error::Shape { .. });
    let ids = i64_tensor(&[0; 6], &[2, 3]);
    assert_err!(ids.matmul(&z(&[3, 2])), Error::DType { op: "matmul", .. });
    assert_err!(z(&[2, 3]).matmul(&ids.t().unwrap()), Error::DType { .. });
    let far = Tensor::zeros(&[3, 2], &other_dev()).unwrap();
    assert_err!(z(&[2, 3]).matmul(&far), Error::Device { op: "matmul", .. });
}

// ---------------------------------------------------------------- element-wise binary

type BinOp = (
    &'static str,
    fn(&Tensor, &Tensor) -> streampool::Result<Tensor>,
    fn(f64, f64) -> f64,
);

const BINARY: [BinOp; 5] = [
    ("add", Tensor::add, |a, b| a + b),
    ("sub", Tensor::sub, |a, b| a - b),
    ("mul", Tensor::mul, |a, b| a * b),
    ("div", Tensor::div, |a, b| a / b),
    ("maximum", Tensor::maximum, f64::max),
];

/// Random values with magnitude in [0.5, 2] and random sign, so `div` is well conditioned.
fn rand_away_from_zero(rng: &mut Rng, shape: &[usize]) -> (Tensor, Nd<f64>) {
    let data = (0..shape.iter().product::<usize>())
        .map(|_| {
            let v = rng.uniform(0.5, 2.0);
            if rng.below(2) == 0 {
                v
            } else {
                -v
            }
        })
        .collect();
    pair(data, shape)
}

#[test]
fn binary_ops_with_broadcasting() {
    let mut rng = Rng::new(20);
    let cases: &[(&[usize], &[usize])] = &[
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[4]),
        (&[4], &[2, 3, 4]),
        (&[2, 1, 4], &[3, 1]),
        (&[5, 1], &[1, 6]),
        (&[], &[3, 4]),
        (&[3, 4], &[]),
        (&[], &[]),
        (&[1], &[7]),
        (&[2, 3, 1, 5], &[3, 4, 1]),
        (&[1, 1, 1], &[2, 1, 3]),
        (&[9, 33], &[9, 1]),
    ];
    for &(sa, sb) in cases {
        let (a, ar) = rand_away_from_zero(&mut rng, sa);
        let (b, br) = rand_away_from_zero(&mut rng, sb);
        for (name, f, r) in BINARY {
            check(
                &format!("{name} {sa:?} {sb:?}"),
                &f(&a, &b).unwrap(),
                &ar.zip(&br, r),
            );
        }
    }
}

#[test]
fn binary_ops_on_non_contiguous_operands() {
    let mut rng = Rng::new(21);
    let (a, ar) = rand_away_from_zero(&mut rng, &[4, 3]);
    let (b, br) = rand_away_from_zero(&mut rng, &[3, 4]);
    let (c, cr) = rand_away_from_zero(&mut rng, &[2, 5, 6]);
    let (row, rowr) = rand_away_from_zero(&mut rng, &[1, 8]);
    let at = a.t().unwrap();
    let atr = ar.transpose(0, 1);
    let cn = c.narrow(2, 1, 4).unwrap().transpose(0, 1).unwrap(); // [5, 2, 4]
    let cnr = cr.narrow(2, 1, 4).transpose(0, 1);
    let rn = row.narrow(1, 2, 4).unwrap(); // [1, 4], offset 2
    let rnr = rowr.narrow(1, 2, 4);
    for (name, f, r) in BINARY {
        check(&format!("{name} t"), &f(&at, &b).unwrap(), &atr.zip(&br, r));
        check(
            &format!("{name} t t"),
            &f(&at, &at).unwrap(),
            &atr.zip(&atr, r),
        );
        check(
            &format!("{name} b t"),
            &f(&b, &at).unwrap(),
            &br.zip(&atr, r),
        );
        check(
            &format!("{name} narrow"),
            &f(&cn, &rn).unwrap(),
            &cnr.zip(&rnr, r),
        );
        check(
            &format!("{name} bcast t"),
            &f(&rn, &at).unwrap(),
            &rnr.zip(&atr, r),
        );
    }
}

#[test]
fn binary_special_values() {
    let d = dev();
    let a = Tensor::from_vec(vec![1.0f32, -1.0, 0.0, f32::INFINITY], &[4], &d).unwrap();
    let z = Tensor::zeros(&[4], &d).unwrap();
    let q = a.div(&z).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&q[..2], &[f32::INFINITY, f32::NEG_INFINITY]);
    assert!(q[2].is_nan());
    assert_eq!(q[3], f32::INFINITY);
}

#[test]
fn binary_errors() {
    let d = dev();
    let z = |s: &[usize]| Tensor::zeros(s, &d).unwrap();
    let far = Tensor::zeros(&[3], &other_dev()).unwrap();
    let ids = i64_tensor(&[1, 2, 3], &[3]);
    let h = Tensor::from_slice(&[f16::ONE; 3], &[3], &d).unwrap();
    for (name, f, _) in BINARY {
        match f(&z(&[2, 3]), &z(&[4, 3])) {
            Err(Error::Shape { op, .. }) => assert_eq!(op, name),
            other => panic!("{name}: {other:?}"),
        }
        assert_err!(f(&z(&[2, 3]), &z(&[2])), Error::Shape { .. });
        assert_err!(f(&z(&[0]), &z(&[2])), Error::Shape { .. });
        assert_err!(f(&z(&[3]), &ids), Error::DType { .. });
        assert_err!(f(&ids, &z(&[3])), Error::DType { .. });
        assert_err!(f(&h, &z(&[3])), Error::DType { .. });
        assert_err!(f(&z(&[3]), &far), Error::Device { .. });
        assert_err!(f(&far, &z(&[3])), Error::Device { .. });
        // Zero-sized operands broadcast like any other size.
        let e = f(&z(&[0, 3]), &z(&[1, 3])).unwrap();
        assert_eq!(e.dims(), &[0, 3]);
        assert!(e.to_vec::<f32>().unwrap().is_empty());
    }
}

// ---------------------------------------------------------------- element-wise unary

type UnOp = (
    &'static str,
    Box<dyn Fn(&Tensor) -> streampool::Result<Tensor>>,
    fn(f64) -> f64,
    f32,
    f32,
);

fn unary_cases() -> Vec<UnOp> {
    vec![
        ("relu", Box::new(Tensor::relu), |x| x.max(0.0), -3.0, 3.0),
        ("gelu", Box::new(Tensor::gelu), gelu, -6.0, 6.0),
        ("tanh", Box::new(Tensor::tanh), f64::tanh, -10.0, 10.0),
        ("exp", Box::new(Tensor::exp), f64::exp, -10.0, 10.0),
        ("sqrt", Box::new(Tensor::sqrt), f64::sqrt, 0.0, 100.0),
        ("sqr", Box::new(Tensor::sqr), |x| x * x, -30.0, 30.0),
        ("neg", Box::new(Tensor::neg), |x| -x, -5.0, 5.0),
        ("recip", Box::new(Tensor::recip), |x| 1.0 / x, 0.1, 10.0),
        (
            "affine",
            Box::new(|t: &Tensor| t.affine(-1.5, 0.25)),
            |x| x * -1.5f32 as f64 + 0.25,
            -5.0,
            5.0,
        ),
        (
            "scale",
            Box::new(|t: &Tensor| t.scale(0.125)),
            |x| x * 0.125,
            -5.0,
            5.0,
        ),
    ]
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(30);
    for (name, f, r, lo, hi) in unary_cases() {
        for shape in [&[][..], &[1], &[7], &[3, 33], &[2, 3, 4]] {
            let (x, xr) = randu(&mut rng, shape, lo, hi);
            check(&format!("{name} {shape:?}"), &f(&x).unwrap(), &xr.map(r));
        }
        // A transposed, narrowed view is read in logical order.
        let (x, xr) = randu(&mut rng, &[6, 9], lo, hi);
        let v = x.narrow(1, 2, 5).unwrap().t().unwrap();
        check(
            &format!("{name} view"),
            &f(&v).unwrap(),
            &xr.narrow(1, 2, 5).transpose(0, 1).map(r),
        );
        // Zero-sized input, zero-sized output.
        let e = f(&Tensor::zeros(&[2, 0], &dev()).unwrap()).unwrap();
        assert_eq!(e.dims(), &[2, 0]);
        // Non-f32 input is a dtype error.
        assert_err!(f(&i64_tensor(&[1], &[1])), Error::DType { .. });
    }
}

#[test]
fn unary_special_values() {
    let d = dev();
    let x = Tensor::from_vec(vec![0.0f32, -0.0, 100.0, -100.0], &[4], &d).unwrap();
    assert_eq!(x.exp().unwrap().to_vec::<f32>().unwrap()[2], f32::INFINITY);
    // e^-100 is an f32 subnormal (about 3.7e-44), not zero.
    assert!(x.exp().unwrap().to_vec::<f32>().unwrap()[3] < 1e-40);
    assert_eq!(x.tanh().unwrap().to_vec::<f32>().unwrap()[2..], [1.0, -1.0]);
    let g = x.gelu().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(g, vec![0.0, 0.0, 100.0, 0.0]);
    let r = x.recip().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&r[..2], &[f32::INFINITY, f32::NEG_INFINITY]);
    assert!(x.neg().unwrap().sqrt().unwrap().to_vec::<f32>().unwrap()[2].is_nan());
}

#[test]
fn erf_reference_matches_known_values() {
    // Values of erf from Abramowitz and Stegun, table 7.1 (and erf(0) = 0, odd symmetry).
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (2.5, 0.999_593_047_982_555),
        (3.0, 0.999_977_909_503_001_4),
    ] {
        assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
        assert!((erf(-x) + want).abs() < 1e-13);
    }
}

// ---------------------------------------------------------------- softmax and norms

fn softmax_ref(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = row.iter().map(|&x| (x - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn softmax_matches_reference_even_for_large_magnitudes() {
    let mut rng = Rng::new(40);
    for (shape, scale, shift) in [
        (&[7][..], 1.0, 0.0),
        (&[5, 33], 3.0, 0.0),
        (&[2, 3, 16], 1.0, 0.0),
        (&[4, 1], 1.0, 0.0),
        (&[6, 50], 40.0, 1.0e4), // exp(x) overflows f32 without the max shift
        (&[6, 50], 40.0, -1.0e4), // and underflows to 0 / 0
        (&[3, 64], 1.0e3, 0.0),  // mostly one-hot rows
    ] {
        let data: Vec<f32> = rng
            .normals(shape.iter().product())
            .iter()
            .map(|&v| v * scale + shift)
            .collect();
        let (x, xr) = pair(data, shape);
        let y = x.softmax().unwrap();
        let got = y.to_vec::<f32>().unwrap();
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{shape:?} {scale} {shift}"
        );
        check(&format!("softmax {shape:?}"), &y, &xr.map_rows(softmax_ref));
    }
    // Non-contiguous input: softmax over the logical last axis.
    let (x, xr) = randn(&mut rng, &[9, 4]);
    check(
        "softmax t",
        &x.t().unwrap().softmax().unwrap(),
        &xr.transpose(0, 1).map_rows(softmax_ref),
    );
    let e = Tensor::zeros(&[3, 0], &dev()).unwrap().softmax().unwrap();
    assert_eq!(e.dims(), &[3, 0]);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
    assert_err!(
        Tensor::zeros(&[], &dev()).unwrap().softmax(),
        Error::Shape { op: "softmax", .. }
    );
    assert_err!(i64_tensor(&[1, 2], &[2]).softmax(), Error::DType { .. });
}

fn layer_norm_ref(row: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    row.iter()
        .zip(gamma.iter().zip(beta))
        .map(|(v, (g, b))| (v - mean) * inv * g + b)
        .collect()
}

#[test]
fn layer_norm_and_add_layer_norm() {
    let mut rng = Rng::new(50);
    for (shape, shift, eps) in [
        (&[5, 33][..], 0.0, 1e-5f32),
        (&[2, 3, 64], 100.0, 1e-12),
        (&[8], -3.0, 1e-5),
        (&[4, 1], 0.0, 1e-5),
        (&[3, 17], 0.0, 0.0),
        (&[3, 17], 0.0, 10.0),
    ] {
        let cols = *shape.last().unwrap();
        let n: usize = shape.iter().product();
        let data: Vec<f32> = rng.normals(n).iter().map(|v| v * 2.0 + shift).collect();
        let (x, xr) = pair(data, shape);
        let (g, gr) = randn(&mut rng, &[cols]);
        let (b, br) = randn(&mut rng, &[cols]);
        let (res, resr) = randn(&mut rng, shape);
        let lref =
            |x: &Nd<f64>| x.map_rows(|row| layer_norm_ref(row, &gr.data, &br.data, eps as f64));
        check(
            &format!("layer_norm {shape:?} eps {eps}"),
            &x.layer_norm(&g, &b, eps).unwrap(),
            &lref(&xr),
        );
        check(
            &format!("add_layer_norm {shape:?}"),
            &x.add_layer_norm(&res, &g, &b, eps).unwrap(),
            &lref(&xr.zip(&resr, |a, b| a + b)),
        );
    }
    // Non-contiguous input, residual and parameters.
    let (x, xr) = randn(&mut rng, &[6, 5]);
    let (r, rr) = randn(&mut rng, &[6, 5]);
    let (p, pr) = randn(&mut rng, &[2, 6]);
    let (g, b) = (
        p.narrow(0, 0, 1).unwrap().reshape(&[6]).unwrap(),
        p.narrow(0, 1, 1).unwrap().reshape(&[6]).unwrap(),
    );
    let (gr, br) = (&pr.data[..6], &pr.data[6..]);
    let want = xr
        .transpose(0, 1)
        .zip(&rr.transpose(0, 1), |a, b| a + b)
        .map_rows(|row| layer_norm_ref(row, gr, br, 1e-5));
    let got = x
        .t()
        .unwrap()
        .add_layer_norm(&r.t().unwrap(), &g, &b, 1e-5)
        .unwrap();
    check("add_layer_norm views", &got, &want);
}

#[test]
fn layer_norm_errors() {
    let d = dev();
    let z = |s: &[usize]| Tensor::zeros(s, &d).unwrap();
    let (x, g, b) = (z(&[2, 4]), z(&[4]), z(&[4]));
    assert_err!(
        x.layer_norm(&z(&[3]), &b, 1e-5),
        Error::Shape {
            op: "layer_norm",
            ..
        }
    );
    assert_err!(x.layer_norm(&g, &z(&[1, 4]), 1e-5), Error::Shape { .. });
    assert_err!(
        z(&[]).layer_norm(&z(&[]), &z(&[]), 1e-5),
        Error::Shape { .. }
    );
    for eps in [f32::NAN, -1e-5] {
        assert_err!(x.layer_norm(&g, &b, eps), Error::InvalidArgument(_));
        assert_err!(x.add_layer_norm(&x, &g, &b, eps), Error::InvalidArgument(_));
    }
    assert_err!(
        x.add_layer_norm(&z(&[4]), &g, &b, 1e-5),
        Error::Shape {
            op: "add_layer_norm",
            ..
        }
    );
    let ids = i64_tensor(&[0; 4], &[4]);
    assert_err!(x.layer_norm(&ids, &b, 1e-5), Error::DType { .. });
    let ids8 = i64_tensor(&[0; 8], &[2, 4]);
    assert_err!(x.add_layer_norm(&ids8, &g, &b, 1e-5), Error::DType { .. });
    let far = Tensor::zeros(&[4], &other_dev()).unwrap();
    assert_err!(
        x.layer_norm(&far, &b, 1e-5),
        Error::Device {
            op: "layer_norm",
            ..
        }
    );
    assert_err!(x.layer_norm(&g, &far, 1e-5), Error::Device { .. });
    let far_x = Tensor::zeros(&[2, 4], &other_dev()).unwrap();
    assert_err!(
        x.add_layer_norm(&far_x, &g, &b, 1e-5),
        Error::Device {
            op: "add_layer_norm",
            ..
        }
    );
    // Zero rows and zero columns.
    assert_eq!(z(&[0, 4]).layer_norm(&g, &b, 1e-5).unwrap().dims(), &[0, 4]);
    let e = z(&[3, 0]).layer_norm(&z(&[0]), &z(&[0]), 1e-5).unwrap();
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn bias_act_all_activations() {
    let mut rng = Rng::new(60);
    type Act = (Activation, fn(f64) -> f64);
    let acts: [Act; 3] = [
        (Activation::Identity, |x| x),
        (Activation::Relu, |x| x.max(0.0)),
        (Activation::Gelu, gelu),
    ];
    for shape in [&[7][..], &[5, 33], &[2, 3, 4], &[3, 1]] {
        let cols = *shape.last().unwrap();
        let (x, xr) = randn(&mut rng, shape);
        let (b, br) = randn(&mut rng, &[cols]);
        for (act, f) in acts {
            let want = xr.zip(&br, |x, b| f(x + b));
            check(
                &format!("bias_act {act:?} {shape:?}"),
                &x.bias_act(&b, act).unwrap(),
                &want,
            );
        }
    }
    // Views of input and bias.
    let (x, xr) = randn(&mut rng, &[4, 6]);
    let (b, br) = randn(&mut rng, &[10]);
    let want = xr
        .transpose(0, 1)
        .zip(&br.narrow(0, 3, 4), |x, b| gelu(x + b));
    check(
        "bias_act views",
        &x.t()
            .unwrap()
            .bias_act(&b.narrow(0, 3, 4).unwrap(), Activation::Gelu)
            .unwrap(),
        &want,
    );
    let d = dev();
    let z = |s: &[usize]| Tensor::zeros(s, &d).unwrap();
    assert_err!(
        z(&[2, 3]).bias_act(&z(&[2]), Activation::Relu),
        Error::Shape { op: "bias_act", .. }
    );
    assert_err!(
        z(&[2, 3]).bias_act(&z(&[1, 3]), Activation::Relu),
        Error::Shape { .. }
    );
    assert_err!(
        z(&[]).bias_act(&z(&[]), Activation::Relu),
        Error::Shape { .. }
    );
    assert_err!(
        z(&[2, 3]).bias_act(&i64_tensor(&[0; 3], &[3]), Activation::Gelu),
        Error::DType { .. }
    );
    assert_err!(
        z(&[2, 3]).bias_act(
            &Tensor::zeros(&[3], &other_dev()).unwrap(),
            Activation::Identity
        ),
        Error::Device { op: "bias_act", .. }
    );
    assert_eq!(
        z(&[0, 3])
            .bias_act(&z(&[3]), Activation::Gelu)
            .unwrap()
            .dims(),
        &[0, 3]
    );
    let e = z(&[2, 0]).bias_act(&z(&[0]), Activation::Gelu).unwrap();
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

// ---------------------------------------------------------------- gathers

#[test]
fn index_select_gathers_rows_and_zeroes_out_of_range_ids() {
    let mut rng = Rng::new(70);
    let (table, tr) = randn(&mut rng, &[10, 6]);
    let ids = [3i64, 0, 9, -1, 10, i64::MAX, i64::MIN, 3];
    for shape in [&[8][..], &[2, 4], &[2, 2, 2]] {
        let idt = i64_tensor(&ids, shape);
        let mut out_shape = shape.to_vec();
        out_shape.push(6);
        // Row-major flattening of the id index (shape-agnostic).
        let want = Nd::from_fn(&out_shape, |i| {
            let flat = i[..i.len() - 1]
                .iter()
                .zip(shape)
                .fold(0, |acc, (&x, &d)| acc * d + x);
            let id = ids[flat];
            if (0..10).contains(&id) {
                tr.at(&[id as usize, i[i.len() - 1]])
            } else {
                0.0
            }
        });
        check(
            &format!("index_select {shape:?}"),
            &table.index_select(&idt).unwrap(),
            &want,
        );
    }
    // A rank-0 id gives one row; a view of the table and of the ids is read logically.
    let one = table.index_select(&i64_tensor(&[4], &[])).unwrap();
    check(
        "index_select scalar id",
        &one,
        &tr.narrow(0, 4, 1).reshape(&[6]),
    );
    let tv = table.t().unwrap(); // [6, 10]
    let idv = i64_tensor(&[5, 1, 2, 0], &[2, 2]).t().unwrap(); // [[5, 2], [1, 0]]
    let got = tv.index_select(&idv).unwrap();
    let tvr = tr.transpose(0, 1);
    let want = Nd::from_fn(&[2, 2, 10], |i| {
        let id = [[5, 2], [1, 0]][i[0]][i[1]];
        tvr.at(&[id, i[2]])
    });
    check("index_select views", &got, &want);
    // Empty id lists.
    assert_eq!(
        table.index_select(&i64_tensor(&[], &[0])).unwrap().dims(),
        &[0, 6]
    );
}

#[test]
fn index_select_errors() {
    let d = dev();
    let table = Tensor::zeros(&[4, 3], &d).unwrap();
    let ids = i64_tensor(&[0, 1], &[2]);
    assert_err!(
        table.index_select(&Tensor::zeros(&[2], &d).unwrap()),
        Error::DType {
            op: "index_select",
            expected: DType::I64,
            ..
        }
    );
    assert_err!(ids.index_select(&ids), Error::DType { .. });
    assert_err!(
        Tensor::zeros(&[2, 2, 3], &d).unwrap().index_select(&ids),
        Error::Shape { .. }
    );
    assert_err!(
        Tensor::zeros(&[4], &d).unwrap().index_select(&ids),
        Error::Shape { .. }
    );
    let far = Tensor::from_slice(&[0i64], &[1], &other_dev()).unwrap();
    assert_err!(
        table.index_select(&far),
        Error::Device {
            op: "index_select",
            ..
        }
    );
    // A table with empty rows.
    let thin = Tensor::zeros(&[4, 0], &d).unwrap();
    let e = thin.index_select(&ids).unwrap();
    assert_eq!(e.dims(), &[2, 0]);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn embedding_checks_ids() {
    let mut rng = Rng::new(71);
    let (table, tr) = randn(&mut rng, &[7, 5]);
    let ids = [6i64, 0, 2, 2, 5, 1];
    let got = table.embedding(&ids, &[2, 3]).unwrap();
    let want = Nd::from_fn(&[2, 3, 5], |i| {
        tr.at(&[ids[i[0] * 3 + i[1]] as usize, i[2]])
    });
    check("embedding", &got, &want);
    for bad in [7i64, -1, i64::MAX, i64::MIN] {
        assert_err!(table.embedding(&[0, bad], &[2]), Error::InvalidArgument(_));
    }
    assert_err!(table.embedding(&[0, 1, 2], &[2]), Error::Shape { .. });
    assert_err!(
        Tensor::zeros(&[3], &dev()).unwrap().embedding(&[0], &[1]),
        Error::Shape { .. }
    );
    assert_err!(
        i64_tensor(&[0; 4], &[2, 2]).embedding(&[0], &[1]),
        Error::DType { .. }
    );
    assert_eq!(table.embedding(&[], &[0]).unwrap().dims(), &[0, 5]);
}

// ---------------------------------------------------------------- reductions

#[test]
fn sum_mean_max_over_every_axis() {
    let mut rng = Rng::new(80);
    type Reduction = (
        &'static str,
        fn(&Tensor, usize, bool) -> streampool::Result<Tensor>,
        fn(&[f64]) -> f64,
    );
    let reductions: [Reduction; 3] = [
        ("sum", Tensor::sum, |v| v.iter().sum()),
        ("mean", Tensor::mean, |v| {
            v.iter().sum::<f64>() / v.len() as f64
        }),
        ("max", Tensor::max, |v| {
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        }),
    ];
    for shape in [&[7][..], &[3, 4], &[3, 4, 5], &[2, 1, 3, 33]] {
        let (x, xr) = randn(&mut rng, shape);
        // The same data seen through a transpose (non-contiguous input).
        let r = shape.len();
        let xt = x.transpose(0, r - 1).unwrap();
        let xtr = xr.transpose(0, r - 1);
        for axis in 0..r {
            for keepdim in [false, true] {
                for (name, f, rf) in reductions {
                    let what = format!("{name} {shape:?} axis {axis} keepdim {keepdim}");
                    check(
                        &what,
                        &f(&x, axis, keepdim).unwrap(),
                        &xr.reduce(axis, keepdim, rf),
                    );
                    check(
                        &format!("{what} (t)"),
                        &f(&xt, axis, keepdim).unwrap(),
                        &xtr.reduce(axis, keepdim, rf),
                    );
                }
            }
        }
    }
    // Zero-sized: sums of nothing are 0, and a zero-sized kept dim stays.
    let e = Tensor::zeros(&[2, 0, 3], &dev()).unwrap();
    assert_eq!(
        e.sum(1, false).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 6]
    );
    // The mean of nothing is NaN (0 / 0), as in NumPy.
    let m = e.mean(1, true).unwrap();
    assert_eq!(m.dims(), &[2, 1, 3]);
    assert!(m.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
    assert_eq!(e.sum(2, true).unwrap().dims(), &[2, 0, 1]);
    assert_eq!(e.max(0, false).unwrap().dims(), &[0, 3]);
}

#[test]
fn long_axes_keep_the_tolerance() {
    // Positive values make a plain f32 running sum drift: each of the 2^20 additions rounds
    // at the scale of the partial sum (ulp(5e5) = 3e-2), beyond 1e-5 of the total.
    let mut rng = Rng::new(81);
    let n = 1 << 20;
    let (x, xr) = randu(&mut rng, &[2, n], 0.0, 1.0);
    check(
        "sum long axis",
        &x.sum(1, false).unwrap(),
        &xr.reduce(1, false, |v| v.iter().sum()),
    );
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    check(
        "mean long axis",
        &x.mean(1, true).unwrap(),
        &xr.reduce(1, true, mean),
    );
    let xt = x.t().unwrap(); // [n, 2]: the long axis is the outer one
    let xtr = xr.transpose(0, 1);
    check(
        "sum long outer axis",
        &xt.sum(0, false).unwrap(),
        &xtr.reduce(0, false, |v| v.iter().sum()),
    );
    // Softmax values here are ~1/n, far below the absolute floor of the check, so compare
    // them scaled by n (a relative check of each probability).
    let scaled = x.softmax().unwrap().scale(n as f32).unwrap();
    check(
        "softmax long row (x n)",
        &scaled,
        &xr.map_rows(softmax_ref).map(|p| p * n as f64),
    );
    let (g, b) = (
        Tensor::ones(&[n], &dev()).unwrap(),
        Tensor::zeros(&[n], &dev()).unwrap(),
    );
    let ones = vec![1.0; n];
    let zeros = vec![0.0; n];
    check(
        "layer_norm long row",
        &x.layer_norm(&g, &b, 1e-5).unwrap(),
        &xr.map_rows(|r| layer_norm_ref(r, &ones, &zeros, 1e-5)),
    );
    // A long inner dimension of matmul (norm-relative, as above).
    let (a, ar) = randu(&mut rng, &[3, 1 << 15], 0.0, 1.0);
    let (w, wr) = randu(&mut rng, &[1 << 15, 2], 0.0, 1.0);
    check_mm("matmul long k", &a.matmul(&w).unwrap(), &ar.matmul(&wr));
}

#[test]
fn reduction_errors() {
    let d = dev();
    let x = Tensor::zeros(&[2, 3], &d).unwrap();
    for f in [Tensor::sum, Tensor::mean, Tensor::max] {
        assert_err!(f(&x, 2, false), Error::Shape { .. });
        assert_err!(f(&x, usize::MAX, true), Error::Shape { .. });
        assert_err!(
            f(&Tensor::zeros(&[], &d).unwrap(), 0, false),
            Error::Shape { .. }
        );
        assert_err!(f(&i64_tensor(&[1, 2], &[2]), 0, false), Error::DType { .. });
    }
    assert_err!(
        Tensor::zeros(&[2, 0], &d).unwrap().max(1, false),
        Error::Shape { op: "max", .. }
    );
}

// ---------------------------------------------------------------- views and copies

/// Transpose, t, narrow, reshape and contiguous on a tensor of any dtype, against the
/// reference index arithmetic.
fn check_views<T: streampool::Element + PartialEq + std::fmt::Debug>(data: Vec<T>) {
    let shape = [2, 3, 4];
    let x = Tensor::from_slice(&data, &shape, &dev()).unwrap();
    let xr = Nd::new(&shape, data);
    let read = |t: &Tensor| Nd::new(t.dims(), t.to_vec::<T>().unwrap());

    let t01 = x.transpose(0, 1).unwrap();
    assert!(t01.shares_storage(&x) && !t01.is_contiguous());
    assert_eq!(read(&t01), xr.transpose(0, 1));
    assert_eq!(read(&x.transpose(2, 0).unwrap()), xr.transpose(2, 0));
    assert_eq!(read(&x.transpose(1, 1).unwrap()), xr);
    let tt = x.t().unwrap();
    assert_eq!(read(&tt), xr.transpose(1, 2));
    assert_eq!(read(&tt.t().unwrap()), xr);

    let n = x.narrow(2, 1, 2).unwrap();
    assert!(n.shares_storage(&x));
    assert_eq!(read(&n), xr.narrow(2, 1, 2));
    assert_eq!(read(&x.narrow(0, 1, 1).unwrap()), xr.narrow(0, 1, 1));
    let nn = x.narrow(1, 1, 2).unwrap().narrow(1, 1, 1).unwrap();
    assert_eq!(read(&nn), xr.narrow(1, 2, 1));
    assert_eq!(read(&x.narrow(1, 3, 0).unwrap()).data, vec![]);

    // Reshape of a contiguous tensor is a view; of a non-contiguous one, a copy.
    let r = x.reshape(&[6, 4]).unwrap();
    assert!(r.shares_storage(&x));
    assert_eq!(read(&r), xr.reshape(&[6, 4]));
    let rt = t01.reshape(&[24]).unwrap();
    assert!(!rt.shares_storage(&x) && rt.is_contiguous());
    assert_eq!(read(&rt), xr.transpose(0, 1).reshape(&[24]));
    // A contiguous narrow (leading axis) reshapes as a view that keeps its offset.
    let lead = x.narrow(0, 1, 1).unwrap().reshape(&[3, 4]).unwrap();
    assert!(lead.shares_storage(&x));
    assert_eq!(read(&lead), xr.narrow(0, 1, 1).reshape(&[3, 4]));
    assert_eq!(
        read(&x.reshape(&[1, 24, 1]).unwrap()),
        xr.reshape(&[1, 24, 1])
    );

    let c = t01.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.shares_storage(&x));
    assert_eq!(read(&c), xr.transpose(0, 1));
    assert!(x.contiguous().unwrap().shares_storage(&x));
    let nc = x
        .transpose(0, 2)
        .unwrap()
        .narrow(0, 1, 3)
        .unwrap()
        .contiguous()
        .unwrap();
    assert_eq!(read(&nc), xr.transpose(0, 2).narrow(0, 1, 3));
}

#[test]
fn views_on_f32_i64_f16_bf16() {
    check_views((0..24).map(|i| i as f32 * 1.5 - 7.0).collect());
    check_views(
        (0..24)
            .map(|i| i * 1_000_000_000_000 - 5)
            .collect::<Vec<i64>>(),
    );
    check_views((0..24).map(|i| f16::from_f32(i as f32 - 11.5)).collect());
    check_views((0..24).map(|i| bf16::from_f32(i as f32 * 3.0)).collect());
}

#[test]
fn view_errors() {
    let d = dev();
    let x = Tensor::zeros(&[2, 3], &d).unwrap();
    assert_err!(x.reshape(&[4, 2]), Error::Shape { op: "reshape", .. });
    assert_err!(x.reshape(&[]), Error::Shape { .. });
    assert_err!(x.reshape(&[usize::MAX, 2]), Error::Shape { .. });
    assert_err!(x.reshape(&[usize::MAX, 2, 0, 3]), Error::Shape { .. });
    assert_err!(
        x.transpose(0, 2),
        Error::Shape {
            op: "transpose",
            ..
        }
    );
    assert_err!(x.transpose(5, 0), Error::Shape { .. });
    assert_err!(
        Tensor::zeros(&[3], &d).unwrap().t(),
        Error::Shape { op: "t", .. }
    );
    assert_err!(Tensor::zeros(&[], &d).unwrap().t(), Error::Shape { .. });
    assert_err!(x.narrow(1, 2, 2), Error::Shape { op: "narrow", .. });
    assert_err!(x.narrow(2, 0, 1), Error::Shape { .. });
    assert_err!(x.narrow(1, usize::MAX, 2), Error::Shape { .. });
    assert_err!(x.narrow(1, 1, usize::MAX), Error::Shape { .. });
    assert_err!(
        Tensor::zeros(&[], &d).unwrap().narrow(0, 0, 1),
        Error::Shape { .. }
    );
    // Rank 0 reshapes to and from one-element shapes.
    let s = Tensor::full(4.0, &[], &d).unwrap();
    assert_eq!(
        s.reshape(&[1, 1])
            .unwrap()
            .reshape(&[])
            .unwrap()
            .to_scalar()
            .unwrap(),
        4.0
    );
    assert!(s.contiguous().unwrap().shares_storage(&s));
}

#[test]
fn huge_shapes_are_errors_not_panics() {
    let d = dev();
    let huge = [usize::MAX / 2, 4];
    assert_err!(
        Tensor::zeros(&huge, &d),
        Error::Shape { .. } | Error::OutOfMemory { .. }
    );
    assert_err!(
        Tensor::from_vec(vec![1.0f32], &huge, &d),
        Error::Shape { .. }
    );
    assert_err!(
        Tensor::full(1.0, &[1 << 62], &d),
        Error::Shape { .. } | Error::OutOfMemory { .. }
    );
    assert_err!(Tensor::randn(&huge, 0, &d), Error::Shape { .. });
    assert_err!(
        Tensor::rand_uniform(&[1 << 62], 0.0, 1.0, 0, &d),
        Error::Shape { .. }
    );
    // 2^61 f32 fit a usize but not the host: an error, not an allocation abort.
    assert_err!(
        Tensor::randn(&[1 << 61], 0, &d),
        Error::Shape { .. } | Error::OutOfMemory { .. }
    );

    // Zero-sized shapes may have dims whose product overflows: they hold nothing and work.
    let big = 1usize << 40;
    let e = Tensor::zeros(&[big, big, 0], &d).unwrap();
    assert_eq!(e.elem_count(), 0);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
    assert_eq!(e.t().unwrap().contiguous().unwrap().dims(), &[big, 0, big]);
    assert_eq!(e.sum(1, false).unwrap().dims(), &[big, 0]);
    assert_eq!(
        e.reshape(&[0, big, big])
            .unwrap()
            .relu()
            .unwrap()
            .elem_count(),
        0
    );
    // ... unless an op's output would be that large.
    assert_err!(e.sum(2, false), Error::Shape { .. });
    let row = Tensor::zeros(&[big, 1, 0], &d).unwrap();
    let sum = row.add(&Tensor::zeros(&[7, 1], &d).unwrap()).unwrap();
    assert_eq!(sum.dims(), &[big, 7, 0]);
    let flat = Tensor::zeros(&[big, big, 0, 5], &d).unwrap();
    let w = Tensor::zeros(&[5, 3], &d).unwrap();
    assert_eq!(flat.matmul(&w).unwrap().dims(), &[big, big, 0, 3]);
}

// ---------------------------------------------------------------- devices

#[test]
fn every_binary_op_rejects_operands_on_two_devices() {
    let (a, b) = (
        Tensor::ones(&[2, 2], &dev()).unwrap(),
        Tensor::ones(&[2, 2], &other_dev()).unwrap(),
    );
    let bias = Tensor::ones(&[2], &other_dev()).unwrap();
    let ids = Tensor::from_slice(&[0i64, 1], &[2], &other_dev()).unwrap();
    let results = [
        a.add(&b),
        a.sub(&b),
        a.mul(&b),
        a.div(&b),
        a.maximum(&b),
        a.matmul(&b),
        b.matmul(&a),
        a.bias_act(&bias, Activation::Relu),
        a.layer_norm(&bias, &bias, 1e-5),
        a.add_layer_norm(
            &b,
            &Tensor::ones(&[2], &dev()).unwrap(),
            &Tensor::ones(&[2], &dev()).unwrap(),
            1e-5,
        ),
        a.index_select(&ids),
    ];
    for r in results {
        assert_err!(r, Error::Device { .. });
    }
    // Ops on one other device work there.
    let c = b.add(&b).unwrap().matmul(&b).unwrap();
    assert!(c.device().same(&other_dev()));
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![4.0; 4]);
}
