//! The fused and packed ops on the CPU backend (what CI runs): the matmul with a bias and activation
//! epilogue against a float64 reference, and packed (varlen) attention and pooling against
//! the padded ops on the same sequences, in every dtype.

use half::{bf16, f16};
use streampool::{Activation, DType, Device, Error, MatmulMath, Tensor};

use crate::util::{f32s, rel_err};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 2e-2,
        _ => 1e-5,
    }
}

/// The value `x` takes when stored as `dt`.
fn round(x: f32, dt: DType) -> f32 {
    match dt {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn act_ref(act: Activation, v: f64) -> f64 {
    match act {
        Activation::Identity => v,
        Activation::Relu => v.max(0.0),
        Activation::Gelu => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
        Activation::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3));
            0.5 * v * (1.0 + inner.tanh())
        }
    }
}

#[test]
fn matmul_bias_act_matches_float64() {
    let dev = Device::cpu();
    let (m, k, n) = (7, 33, 20);
    let (a, b, bias) = (values(m * k, 1), values(k * n, 2), values(n, 3));
    for dt in DTYPES {
        let up = |v: &[f32], shape: &[usize]| {
            Tensor::from_slice(v, shape, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
        };
        let (ta, tb, tbias) = (up(&a, &[m, k]), up(&b, &[k, n]), up(&bias, &[n]));
        for act in [
            Activation::Identity,
            Activation::Relu,
            Activation::Gelu,
            Activation::GeluTanh,
        ] {
            let got = ta
                .matmul_bias_act(&tb, &tbias, act, MatmulMath::Exact)
                .unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[m, n][..], dt));
            // The reference from the rounded inputs; the product is rounded to `dt` before
            // the activation, as the unfused path does (and as a GEMM epilogue may).
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    let dot: f64 = (0..k)
                        .map(|j| {
                            f64::from(round(a[r * k + j], dt)) * f64::from(round(b[j * n + c], dt))
                        })
                        .sum();
                    act_ref(act, dot + f64::from(round(bias[c], dt)))
                })
                .collect();
            let e = rel_err(&f32s(&got), &want);
            assert!(e < tol(dt), "{act:?} {dt:?}: rel err {e:.2e}");
        }
    }
    // The bias must match the product's columns.
    let x = Tensor::from_slice(&a, &[m, k], &dev).unwrap();
    let w = Tensor::from_slice(&b, &[k, n], &dev).unwrap();
    assert!(x
        .matmul_bias_act(&w, &x, Activation::Relu, MatmulMath::Exact)
        .is_err());
}

/// Sequences of these lengths, `heads` heads of width `d`: the packed QKV rows and the same
/// rows padded to the longest, `[batch, longest, 3 * hidden]`, with their 0/1 mask.
struct Batch {
    lens: Vec<usize>,
    packed: Vec<f32>,
    padded: Vec<f32>,
    mask: Vec<f32>,
    longest: usize,
    offsets: Vec<i64>,
}

fn batch(lens: &[usize], width: usize, seed: u64) -> Batch {
    let longest = lens.iter().copied().max().unwrap_or(0);
    let tokens: usize = lens.iter().sum();
    let packed = values(tokens * width, seed);
    let mut padded = vec![0.0f32; lens.len() * longest * width];
    let mut mask = vec![0.0f32; lens.len() * longest];
    let mut offsets = vec![0i64];
    let mut at = 0;
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..len {
            let src = &packed[(at + i) * width..(at + i + 1) * width];
            padded[(b * longest + i) * width..][..width].copy_from_slice(src);
            mask[b * longest + i] = 1.0;
        }
        at += len;
        offsets.push(at as i64);
    }
    Batch {
        lens: lens.to_vec(),
        packed,
        padded,
        mask,
        longest,
        offsets,
    }
}

impl Batch {
    /// The padded `[batch, longest, cols]` result's rows at real tokens, packed.
    fn unpad(&self, padded: &[f32], cols: usize) -> Vec<f32> {
        let mut out = Vec::new();
        for (b, &len) in self.lens.iter().enumerate() {
            out.extend_from_slice(&padded[b * self.longest * cols..][..len * cols]);
        }
        out
    }
}

#[test]
fn packed_attention_equals_padded_attention() {
    let dev = Device::cpu();
    // Lengths from 1 to past a 64-key tile, one empty sequence, 3 heads of width 8.
    let (heads, d) = (3, 8);
    let width = 3 * heads * d;
    let bt = batch(&[5, 1, 70, 0, 33], width, 11);
    let tokens = bt.packed.len() / width;
    for dt in DTYPES {
        let up = |v: &[f32], shape: &[usize]| {
            Tensor::from_slice(v, shape, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
        };
        let offsets = Tensor::from_slice(&bt.offsets, &[bt.offsets.len()], &dev).unwrap();
        let got = up(&bt.packed, &[tokens, width])
            .attention_packed(&offsets, bt.longest, heads)
            .unwrap();
        assert_eq!((got.dims(), got.dtype()), (&[tokens, heads * d][..], dt));
        let mask = Tensor::from_slice(&bt.mask, &[bt.lens.len(), bt.longest], &dev).unwrap();
        let want = up(&bt.padded, &[bt.lens.len(), bt.longest, width])
            .attention(Some(&mask), heads)
            .unwrap();
        let want: Vec<f64> = bt
            .unpad(&f32s(&want), heads * d)
            .into_iter()
            .map(f64::from)
            .collect();
        let e = rel_err(&f32s(&got), &want);
        assert!(
            e <= tol(dt) / 10.0,
            "{dt:?}: packed vs padded rel err {e:.2e}"
        );
    }
}

#[test]
fn packed_pooling_equals_padded_pooling() {
    let dev = Device::cpu();
    let dim = 24;
    let bt = batch(&[3, 17, 1, 0, 9], dim, 5);
    let tokens = bt.packed.len() / dim;
    for dt in DTYPES {
        let up = |v: &[f32], shape: &[usize]| {
            Tensor::from_slice(v, shape, &dev)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
        };
        let offsets = Tensor::from_slice(&bt.offsets, &[bt.offsets.len()], &dev).unwrap();
        let got = up(&bt.packed, &[tokens, dim])
            .mean_pool_normalize_packed(&offsets)
            .unwrap();
        assert_eq!((got.dims(), got.dtype()), (&[5, dim][..], DType::F32));
        let mask = Tensor::from_slice(&bt.mask, &[5, bt.longest], &dev).unwrap();
        let want = up(&bt.padded, &[5, bt.longest, dim])
            .mean_pool_normalize(&mask)
            .unwrap();
        let (g, w) = (f32s(&got), f32s(&want));
        // The empty sequence gives zeros, as an all-padding row does.
        assert!(g[3 * dim..4 * dim].iter().all(|&v| v == 0.0));
        let w64: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        assert!(rel_err(&g, &w64) < 1e-6, "{dt:?}");
    }
}

/// Offsets live on the device and are not checked; offsets that break the rules give
/// unspecified rows but never an out-of-bounds access (the kernels clamp them), and the
/// shapes and dtypes that can be checked are errors.
#[test]
fn bad_offsets_are_clamped_and_bad_shapes_are_errors() {
    let dev = Device::cpu();
    let qkv = Tensor::from_vec(values(10 * 6, 7), &[10, 6], &dev).unwrap();
    let bad = Tensor::from_vec(vec![0i64, 5, 2, 100, -3], &[5], &dev).unwrap();
    let y = qkv.attention_packed(&bad, 16, 1).unwrap();
    assert_eq!(y.dims(), &[10, 2]);
    let h = Tensor::from_vec(values(10 * 4, 8), &[10, 4], &dev).unwrap();
    let e = h.mean_pool_normalize_packed(&bad).unwrap();
    assert!(e.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    let f32_offsets = Tensor::from_vec(vec![0.0f32, 10.0], &[2], &dev).unwrap();
    assert!(matches!(
        qkv.attention_packed(&f32_offsets, 16, 1),
        Err(Error::DType { .. })
    ));
    let ok = Tensor::from_vec(vec![0i64, 10], &[2], &dev).unwrap();
    assert!(qkv.attention_packed(&ok, 16, 4).is_err()); // 6 is not 3 x 4 heads x width
    assert!(qkv
        .reshape(&[2, 5, 6])
        .unwrap()
        .attention_packed(&ok, 16, 1)
        .is_err());
    let empty = Tensor::from_vec(Vec::<i64>::new(), &[0], &dev).unwrap();
    assert!(h.mean_pool_normalize_packed(&empty).is_err());
}
