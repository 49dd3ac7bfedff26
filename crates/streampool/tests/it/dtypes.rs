//! Every floating-point op in `F32`, `F16` and `BF16` against a float64 reference computed
//! from the same (rounded) inputs, plus the fused attention and pooling ops and `to_dtype`.
//!
//! Tolerance: ‖got − want‖ / ‖want‖ at most 1e-5 (`F32`), 1e-3 (`F16`) and 1e-2 (`BF16`):
//! the output is rounded once to the storage type (2^-11 and 2^-8 relative), and for the
//! fused ops intermediate results are rounded as they would be on the GPU.
//!
//! A shared suite: it runs on the CPU backend (every dtype) and again under `wgpu`, on a wgpu
//! device with the dtypes that device computes in; the parent module supplies the device
//! (`super::device_under_test`) and the dtypes (`super::dtypes_under_test`).

use crate::util::{erf, f32s, rel_err, Rng};
use half::{bf16, f16};
use streampool::{Activation, DType, Device, MatmulMath, Tensor};

type F64Fn = fn(f64) -> f64;

fn dev() -> Device {
    super::device_under_test()
}

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

/// The value `x` takes when stored as `dt`.
fn round(x: f32, dt: DType) -> f64 {
    match dt {
        DType::F16 => f16::from_f32(x).to_f64(),
        DType::BF16 => bf16::from_f32(x).to_f64(),
        _ => x as f64,
    }
}

/// A `dt` tensor of `data` (converted on the device by `to_dtype`) and its exact values.
fn upload(data: &[f32], shape: &[usize], dt: DType) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_slice(data, shape, &dev())
        .unwrap()
        .to_dtype(dt)
        .unwrap();
    assert_eq!(t.dtype(), dt);
    (t, data.iter().map(|&x| round(x, dt)).collect())
}

fn normals(rng: &mut Rng, shape: &[usize], dt: DType) -> (Tensor, Vec<f64>) {
    upload(&rng.normals(shape.iter().product()), shape, dt)
}

/// `got` within the dtype's tolerance of `want` (norm-relative, see the module docs).
fn close(what: &str, dt: DType, got: &Tensor, want: &[f64]) {
    let e = rel_err(&f32s(got), want);
    assert!(
        e <= tol(dt),
        "{what} {dt:?}: relative error {e:.3e} over {:.0e}",
        tol(dt)
    );
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

#[test]
fn matmul_in_every_dtype_and_math_mode() {
    let mut rng = Rng::new(1);
    let (b, m, k, n) = (3, 17, 40, 9);
    for dt in super::dtypes_under_test() {
        let (x, xv) = normals(&mut rng, &[b, m, k], dt);
        // The right operand is read through a transposed view.
        let (w, wv) = normals(&mut rng, &[n, k], dt);
        let mut want = vec![0.0; b * m * n];
        for bi in 0..b {
            for i in 0..m {
                for j in 0..n {
                    want[(bi * m + i) * n + j] = (0..k)
                        .map(|l| xv[(bi * m + i) * k + l] * wv[j * k + l])
                        .sum();
                }
            }
        }
        for math in [MatmulMath::Exact, MatmulMath::Tf32] {
            let y = x.matmul_with(&w.t().unwrap(), math).unwrap();
            assert_eq!((y.dims(), y.dtype()), (&[b, m, n][..], dt));
            close("matmul", dt, &y, &want);
        }
    }
}

#[test]
fn elementwise_ops_in_every_dtype() {
    let mut rng = Rng::new(2);
    for dt in super::dtypes_under_test() {
        let (a, av) = normals(&mut rng, &[4, 5, 6], dt);
        let (r, rv) = normals(&mut rng, &[6], dt);
        let bc = |f: fn(f64, f64) -> f64| -> Vec<f64> {
            av.iter()
                .enumerate()
                .map(|(i, &x)| f(x, rv[i % 6]))
                .collect()
        };
        close("add", dt, &a.add(&r).unwrap(), &bc(|x, y| x + y));
        close("mul", dt, &a.mul(&r).unwrap(), &bc(|x, y| x * y));
        close("max", dt, &a.maximum(&r).unwrap(), &bc(f64::max));
        // A strided (transposed) operand.
        let at = a.transpose(0, 2).unwrap();
        let want: Vec<f64> = (0..6 * 5 * 4)
            .map(|i| {
                let (c, b, aa) = (i / 20, (i / 4) % 5, i % 4);
                2.0 * av[(aa * 5 + b) * 6 + c]
            })
            .collect();
        close("strided add", dt, &at.add(&at).unwrap(), &want);
        let un: Vec<(&str, Tensor, F64Fn)> = vec![
            ("gelu", a.gelu().unwrap(), gelu),
            ("exp", a.exp().unwrap(), f64::exp),
            ("tanh", a.tanh().unwrap(), f64::tanh),
            ("affine", a.affine(2.0, 0.5).unwrap(), |x| 2.0 * x + 0.5),
        ];
        for (name, y, f) in un {
            assert_eq!(y.dtype(), dt);
            close(name, dt, &y, &av.iter().map(|&x| f(x)).collect::<Vec<_>>());
        }
        let (bias, bv) = normals(&mut rng, &[6], dt);
        let want: Vec<f64> = av
            .iter()
            .enumerate()
            .map(|(i, &x)| gelu(x + bv[i % 6]))
            .collect();
        close(
            "bias_act",
            dt,
            &a.bias_act(&bias, Activation::Gelu).unwrap(),
            &want,
        );
    }
}

#[test]
fn rows_ops_in_every_dtype() {
    let mut rng = Rng::new(3);
    let (rows, cols) = (7, 300);
    for dt in super::dtypes_under_test() {
        let (x, xv) = normals(&mut rng, &[rows, cols], dt);
        let (res, resv) = normals(&mut rng, &[rows, cols], dt);
        let (g, gv) = normals(&mut rng, &[cols], dt);
        let (b, bv) = normals(&mut rng, &[cols], dt);
        let mut soft = Vec::new();
        let mut ln = Vec::new();
        let (mut sum, mut mean, mut max) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            let row = &xv[r * cols..(r + 1) * cols];
            let m = row.iter().copied().fold(f64::MIN, f64::max);
            let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
            soft.extend(row.iter().map(|v| (v - m).exp() / z));
            let h: Vec<f64> = row
                .iter()
                .zip(&resv[r * cols..])
                .map(|(a, b)| a + b)
                .collect();
            let mu = h.iter().sum::<f64>() / cols as f64;
            let var = h.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (var + 1e-12).sqrt();
            ln.extend((0..cols).map(|c| (h[c] - mu) * inv * gv[c] + bv[c]));
            sum.push(row.iter().sum::<f64>());
            mean.push(row.iter().sum::<f64>() / cols as f64);
            max.push(m);
        }
        close("softmax", dt, &x.softmax().unwrap(), &soft);
        let y = x.add_layer_norm(&res, &g, &b, 1e-12).unwrap();
        close("add_layer_norm", dt, &y, &ln);
        close("sum", dt, &x.sum(1, false).unwrap(), &sum);
        close("mean", dt, &x.mean(1, false).unwrap(), &mean);
        close("max", dt, &x.max(1, false).unwrap(), &max);
        // The middle axis of a 3-d tensor.
        let x3 = x.reshape(&[rows, 30, 10]).unwrap();
        let want: Vec<f64> = (0..rows * 10)
            .map(|i| (0..30).map(|a| xv[(i / 10) * cols + a * 10 + i % 10]).sum())
            .collect();
        close("sum axis 1", dt, &x3.sum(1, false).unwrap(), &want);
        let ids = Tensor::from_vec(vec![3i64, 0, 6, 3], &[2, 2], &dev()).unwrap();
        let want: Vec<f64> = [3, 0, 6, 3]
            .iter()
            .flat_map(|&r| xv[r * cols..(r + 1) * cols].to_vec())
            .collect();
        close("index_select", dt, &x.index_select(&ids).unwrap(), &want);
    }
}

/// Float64 multi-head attention over `qkv: [batch, seq, 3, heads, d]` (the ops' layout).
fn attention_ref(
    qkv: &[f64],
    mask: &[f32],
    batch: usize,
    seq: usize,
    heads: usize,
    d: usize,
) -> Vec<f64> {
    let hid = heads * d;
    let at = |b: usize, t: usize, part: usize, h: usize, c: usize| {
        qkv[(b * seq + t) * 3 * hid + part * hid + h * d + c]
    };
    let mut out = vec![0.0; batch * seq * hid];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                let s: Vec<f64> = (0..seq)
                    .map(|j| match mask[b * seq + j] {
                        0.0 => f32::MIN as f64,
                        _ => (0..d).map(|c| at(b, i, 0, h, c) * at(b, j, 1, h, c)).sum(),
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for c in 0..d {
                    out[(b * seq + i) * hid + h * d + c] = (0..seq)
                        .map(|j| (s[j] - m).exp() / z * at(b, j, 2, h, c))
                        .sum();
                }
            }
        }
    }
    out
}

#[test]
fn fused_attention_in_every_dtype() {
    let mut rng = Rng::new(4);
    // Head widths 32 (MiniLM), 24 (padded inside the CUDA kernel) and 64 (BERT-base: the
    // wgpu query-tile kernel's second column group); one row all padding.
    for (batch, seq, heads, d) in [(3, 37, 2, 32), (2, 70, 3, 24), (2, 33, 1, 64)] {
        let mut mask = vec![1.0f32; batch * seq];
        for (j, m) in mask[seq..2 * seq].iter_mut().enumerate() {
            *m = (j < seq / 2) as u8 as f32;
        }
        if batch > 2 {
            mask[2 * seq..].fill(0.0);
        }
        for dt in super::dtypes_under_test() {
            let (qkv, qv) = normals(&mut rng, &[batch, seq, 3 * heads * d], dt);
            let m = Tensor::from_slice(&mask, &[batch, seq], &dev()).unwrap();
            let y = qkv.attention(Some(&m), heads).unwrap();
            assert_eq!((y.dims(), y.dtype()), (&[batch, seq, heads * d][..], dt));
            close(
                "attention",
                dt,
                &y,
                &attention_ref(&qv, &mask, batch, seq, heads, d),
            );
            let ones = vec![1.0; batch * seq];
            let y = qkv.attention(None, heads).unwrap();
            close(
                "attention, no mask",
                dt,
                &y,
                &attention_ref(&qv, &ones, batch, seq, heads, d),
            );
        }
    }
}

#[test]
fn mean_pool_normalize_in_every_dtype() {
    let mut rng = Rng::new(5);
    let (batch, seq, dim) = (3, 9, 50);
    let mask: Vec<f32> = (0..batch * seq)
        .map(|i| (i % seq < 2 + 3 * (i / seq)) as u8 as f32)
        .collect();
    for dt in super::dtypes_under_test() {
        let (x, xv) = normals(&mut rng, &[batch, seq, dim], dt);
        let m = Tensor::from_slice(&mask, &[batch, seq], &dev()).unwrap();
        let y = x.mean_pool_normalize(&m).unwrap();
        assert_eq!((y.dims(), y.dtype()), (&[batch, dim][..], DType::F32));
        let mut want = Vec::new();
        for b in 0..batch {
            let count: f64 = mask[b * seq..(b + 1) * seq].iter().map(|&v| v as f64).sum();
            let mean: Vec<f64> = (0..dim)
                .map(|c| {
                    (0..seq)
                        .map(|s| mask[b * seq + s] as f64 * xv[(b * seq + s) * dim + c])
                        .sum::<f64>()
                        / count
                })
                .collect();
            let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
            want.extend(mean.iter().map(|v| v / norm));
        }
        // Half inputs, but the pooling itself runs in f32: only the inputs were rounded.
        close("mean_pool_normalize", DType::F32, &y, &want);
    }
}

#[test]
fn to_dtype_rounds_to_nearest_and_overflows_f16_to_inf() {
    let dev = Device::cpu();
    let data = [1.0f32, 0.1, -3.3e-5, 65504.0, 1e6, -1e6, f32::NAN];
    let x = Tensor::from_slice(&data, &[7], &dev).unwrap();
    let h = x.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap();
    let want: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(h[..6], want[..6]);
    assert!(h[4].is_infinite() && h[5].is_infinite() && h[6].is_nan());
    let b = x.to_dtype(DType::BF16).unwrap();
    let bw: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(b.to_vec::<bf16>().unwrap()[..6], bw[..6]);
    // Half to half, and the same dtype is the same tensor.
    let hb = b.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap();
    assert_eq!(hb[0], f16::from_f32(bw[0].to_f32()));
    assert!(x.to_dtype(DType::F32).unwrap().shares_storage(&x));
    // Indices are not a float type, and mixed dtypes are an error, not a silent promotion.
    let ids = Tensor::from_vec(vec![1i64], &[1], &dev).unwrap();
    assert!(ids.to_dtype(DType::F16).is_err());
    assert!(x.to_dtype(DType::I64).is_err());
    assert!(x.add(&x.to_dtype(DType::F16).unwrap()).is_err());
}
