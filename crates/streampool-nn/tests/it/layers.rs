//! Each layer against a float64 reference computed here (relative error < 1e-5).

use crate::util::rel_err;
use rand::{rngs::StdRng, Rng, SeedableRng};
use streampool::{Device, Tensor};
use streampool_nn::layers::activation;
use streampool_nn::{
    Activation, AttentionMask, Embedding, HostTensor, LayerNorm, Linear, LinearParams, Mlp,
    MultiheadAttention, TransformerEncoderLayer,
};

const TOL: f64 = 1e-5;

fn random(shape: &[usize], scale: f32, rng: &mut StdRng) -> HostTensor {
    let n = shape.iter().product();
    let data = (0..n).map(|_| rng.gen_range(-scale..scale)).collect();
    HostTensor::new(data, shape).unwrap()
}

fn f64s(t: &HostTensor) -> Vec<f64> {
    t.data().iter().map(|&x| x as f64).collect()
}

fn linear_params(out: usize, inp: usize, bias: bool, rng: &mut StdRng) -> LinearParams {
    let s = 1.0 / (inp as f32).sqrt();
    let b = bias.then(|| random(&[out], 0.5, rng));
    LinearParams::new(random(&[out, inp], 2.0 * s, rng), b).unwrap()
}

// ---- float64 references (row-major, last axis is the feature axis) ----

fn linear_ref(x: &[f64], p: &LinearParams) -> Vec<f64> {
    let (out, inp) = (p.out_features(), p.in_features());
    let w = f64s(&p.weight);
    let b = p.bias.as_ref().map(f64s);
    x.chunks_exact(inp)
        .flat_map(|row| {
            (0..out)
                .map(|o| {
                    let dot: f64 = row.iter().zip(&w[o * inp..]).map(|(a, b)| a * b).sum();
                    dot + b.as_ref().map_or(0.0, |b| b[o])
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn act_ref(x: &[f64], act: Activation) -> Vec<f64> {
    x.iter()
        .map(|&v| match act {
            Activation::Identity => v,
            Activation::Relu => v.max(0.0),
            Activation::Gelu => gelu_ref(v),
            Activation::GeluTanh => {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
            }
        })
        .collect()
}

fn layer_norm_ref(x: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let c = gamma.len();
    x.chunks_exact(c)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / c as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .zip(gamma)
                .zip(beta)
                .map(|((v, g), b)| (v - mean) * inv * g + b)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

struct AttnParams {
    q: LinearParams,
    k: LinearParams,
    v: LinearParams,
    o: LinearParams,
    heads: usize,
}

/// Self-attention of `x: [batch, seq, hidden]` with `mask: [batch, seq]` (1 = attend).
fn attention_ref(x: &[f64], mask: Option<&[i64]>, p: &AttnParams, batch: usize) -> Vec<f64> {
    let hidden = p.q.out_features();
    let seq = x.len() / (batch * hidden);
    let d = hidden / p.heads;
    let (q, k, v) = (
        linear_ref(x, &p.q),
        linear_ref(x, &p.k),
        linear_ref(x, &p.v),
    );
    let mut ctx = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..p.heads {
            let at = |t: &[f64], s: usize, j: usize| t[(b * seq + s) * hidden + h * d + j];
            for i in 0..seq {
                let scores: Vec<f64> = (0..seq)
                    .map(|j| {
                        let dot: f64 = (0..d).map(|e| at(&q, i, e) * at(&k, j, e)).sum();
                        let masked = mask.is_some_and(|m| m[b * seq + j] == 0);
                        if masked {
                            f64::NEG_INFINITY
                        } else {
                            dot / (d as f64).sqrt()
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for e in 0..d {
                    ctx[(b * seq + i) * hidden + h * d + e] =
                        (0..seq).map(|j| exps[j] / sum * at(&v, j, e)).sum();
                }
            }
        }
    }
    linear_ref(&ctx, &p.o)
}

fn attn_params(hidden: usize, heads: usize, rng: &mut StdRng) -> AttnParams {
    AttnParams {
        q: linear_params(hidden, hidden, true, rng),
        k: linear_params(hidden, hidden, true, rng),
        v: linear_params(hidden, hidden, true, rng),
        o: linear_params(hidden, hidden, true, rng),
        heads,
    }
}

fn attention_layer(p: &AttnParams, dev: &Device) -> MultiheadAttention {
    MultiheadAttention::new(&p.q, &p.k, &p.v, &p.o, p.heads, dev).unwrap()
}

fn upload(t: &HostTensor, dev: &Device) -> Tensor {
    t.to_device(dev).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

// ---- tests ----

#[test]
fn linear_matches_reference() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(1));
    let x = random(&[2, 3, 20], 1.0, &mut rng);
    for bias in [true, false] {
        let p = linear_params(12, 20, bias, &mut rng);
        let lin = Linear::new(&p, &dev).unwrap();
        assert_eq!((lin.in_features(), lin.out_features()), (20, 12));
        let y = lin.forward(&upload(&x, &dev)).unwrap();
        assert_eq!(y.dims(), &[2, 3, 12]);
        let want = linear_ref(&f64s(&x), &p);
        let e = rel_err(&host(&y), &want);
        assert!(e < TOL, "bias {bias}: rel err {e}");
        for act in [Activation::Relu, Activation::Gelu] {
            let y = lin.forward_act(&upload(&x, &dev), act).unwrap();
            let e = rel_err(&host(&y), &act_ref(&want, act));
            assert!(e < TOL, "bias {bias}, {act:?}: rel err {e}");
        }
    }
}

#[test]
fn activations_match_reference() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(2));
    let x = random(&[4, 50], 4.0, &mut rng);
    for act in [
        Activation::Identity,
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
    ] {
        let y = activation::apply(&upload(&x, &dev), act).unwrap();
        let e = rel_err(&host(&y), &act_ref(&f64s(&x), act));
        assert!(e < TOL, "{act:?}: rel err {e}");
    }
    assert_eq!(activation::parse("gelu").unwrap(), Activation::Gelu);
    assert_eq!(
        activation::parse("gelu_pytorch_tanh").unwrap(),
        Activation::GeluTanh
    );
    assert!(activation::parse("swish").is_err());
}

#[test]
fn mlp_matches_reference() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(3));
    let x = random(&[5, 16], 1.0, &mut rng);
    for act in [Activation::Gelu, Activation::Relu, Activation::GeluTanh] {
        let (p1, p2) = (
            linear_params(40, 16, true, &mut rng),
            linear_params(8, 40, true, &mut rng),
        );
        let mlp = Mlp::new(
            Linear::new(&p1, &dev).unwrap(),
            act,
            Linear::new(&p2, &dev).unwrap(),
        )
        .unwrap();
        let y = mlp.forward(&upload(&x, &dev)).unwrap();
        let want = linear_ref(&act_ref(&linear_ref(&f64s(&x), &p1), act), &p2);
        let e = rel_err(&host(&y), &want);
        assert!(e < TOL, "{act:?}: rel err {e}");
    }
    let (a, b) = (
        Linear::new(&linear_params(4, 3, true, &mut rng), &dev).unwrap(),
        Linear::new(&linear_params(2, 5, true, &mut rng), &dev).unwrap(),
    );
    assert!(Mlp::new(a, Activation::Gelu, b).is_err());
}

#[test]
fn layer_norm_matches_reference() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(4));
    let x = random(&[3, 4, 24], 3.0, &mut rng);
    let r = random(&[3, 4, 24], 3.0, &mut rng);
    let gamma = random(&[24], 2.0, &mut rng);
    let beta = random(&[24], 1.0, &mut rng);
    for eps in [1e-12, 1e-5] {
        let ln = LayerNorm::new(&gamma, &beta, eps as f32, &dev).unwrap();
        let y = ln.forward(&upload(&x, &dev)).unwrap();
        let want = layer_norm_ref(&f64s(&x), &f64s(&gamma), &f64s(&beta), eps);
        let e = rel_err(&host(&y), &want);
        assert!(e < TOL, "eps {eps}: rel err {e}");
        let y = ln
            .forward_residual(&upload(&x, &dev), &upload(&r, &dev))
            .unwrap();
        let sum = add(&f64s(&x), &f64s(&r));
        let want = layer_norm_ref(&sum, &f64s(&gamma), &f64s(&beta), eps);
        let e = rel_err(&host(&y), &want);
        assert!(e < TOL, "eps {eps}, residual: rel err {e}");
    }
}

#[test]
fn embedding_picks_rows() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(5));
    let table = random(&[10, 6], 1.0, &mut rng);
    let emb = Embedding::new(&table, &dev).unwrap();
    assert_eq!((emb.rows(), emb.dim()), (10, 6));
    let ids = [3i64, 0, 9, 3];
    let y = host(&emb.forward(&ids, &[2, 2]).unwrap());
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table.data()[i as usize * 6..(i as usize + 1) * 6].to_vec())
        .collect();
    assert_eq!(y, want);
    assert!(emb.forward(&[10], &[1]).is_err());
    assert!(emb.forward(&[-1], &[1]).is_err());
}

#[test]
fn attention_matches_reference_with_and_without_mask() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(6));
    let (batch, seq, hidden, heads) = (3, 7, 24, 4);
    let p = attn_params(hidden, heads, &mut rng);
    let attn = attention_layer(&p, &dev);
    let x = random(&[batch, seq, hidden], 1.5, &mut rng);
    // Row 0 full, row 1 with 4 tokens, row 2 with 1 token.
    let valid = [7usize, 4, 1];
    let mask: Vec<i64> = valid
        .iter()
        .flat_map(|&v| (0..seq).map(move |j| i64::from(j < v)))
        .collect();
    let m = AttentionMask::new(&mask, batch, seq, &dev).unwrap();
    let y = attn.forward(&upload(&x, &dev), Some(&m)).unwrap();
    assert_eq!(y.dims(), &[batch, seq, hidden]);
    let e = rel_err(&host(&y), &attention_ref(&f64s(&x), Some(&mask), &p, batch));
    assert!(e < TOL, "masked: rel err {e}");
    // The fused CPU kernel (binary mask), which BertModel uses in f32 on the CPU.
    assert!(attn.is_fused());
    let b = AttentionMask::binary(&mask, batch, seq, &dev).unwrap();
    let y = attn.forward(&upload(&x, &dev), Some(&b)).unwrap();
    let e = rel_err(&host(&y), &attention_ref(&f64s(&x), Some(&mask), &p, batch));
    assert!(e < TOL, "masked, fused: rel err {e}");
    let y = attn.forward(&upload(&x, &dev), None).unwrap();
    let e = rel_err(&host(&y), &attention_ref(&f64s(&x), None, &p, batch));
    assert!(e < TOL, "unmasked: rel err {e}");
}

#[test]
fn attention_ignores_padded_keys() {
    // Changing the values at padded positions must not change any real token's output.
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(7));
    let (seq, hidden) = (6, 16);
    let p = attn_params(hidden, 2, &mut rng);
    let attn = attention_layer(&p, &dev);
    let mask = [1i64, 1, 1, 0, 0, 0];
    let m = AttentionMask::new(&mask, 1, seq, &dev).unwrap();
    let x = random(&[1, seq, hidden], 1.0, &mut rng);
    let mut other = x.data().to_vec();
    other[3 * hidden..].iter_mut().for_each(|v| *v = 5.0 - *v);
    let other = HostTensor::new(other, &[1, seq, hidden]).unwrap();
    let a = host(&attn.forward(&upload(&x, &dev), Some(&m)).unwrap());
    let b = host(&attn.forward(&upload(&other, &dev), Some(&m)).unwrap());
    assert_eq!(a[..3 * hidden], b[..3 * hidden]);
    assert_ne!(a[3 * hidden..], b[3 * hidden..]);
}

#[test]
fn encoder_layer_matches_reference() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(8));
    let (batch, seq, hidden, inter, heads) = (2, 5, 16, 48, 2);
    let p = attn_params(hidden, heads, &mut rng);
    let (f1, f2) = (
        linear_params(inter, hidden, true, &mut rng),
        linear_params(hidden, inter, true, &mut rng),
    );
    let ln = |rng: &mut StdRng| (random(&[hidden], 2.0, rng), random(&[hidden], 1.0, rng));
    let (g1, b1) = ln(&mut rng);
    let (g2, b2) = ln(&mut rng);
    let eps = 1e-12;
    let layer = TransformerEncoderLayer::new(
        attention_layer(&p, &dev),
        LayerNorm::new(&g1, &b1, eps as f32, &dev).unwrap(),
        Mlp::new(
            Linear::new(&f1, &dev).unwrap(),
            Activation::Gelu,
            Linear::new(&f2, &dev).unwrap(),
        )
        .unwrap(),
        LayerNorm::new(&g2, &b2, eps as f32, &dev).unwrap(),
    );
    let x = random(&[batch, seq, hidden], 1.0, &mut rng);
    let mask = [1i64, 1, 1, 1, 1, 1, 1, 0, 0, 0];
    let m = AttentionMask::new(&mask, batch, seq, &dev).unwrap();
    let y = layer.forward(&upload(&x, &dev), Some(&m)).unwrap();

    let xf = f64s(&x);
    let a = attention_ref(&xf, Some(&mask), &p, batch);
    let h = layer_norm_ref(&add(&a, &xf), &f64s(&g1), &f64s(&b1), eps);
    let f = linear_ref(&act_ref(&linear_ref(&h, &f1), Activation::Gelu), &f2);
    let want = layer_norm_ref(&add(&f, &h), &f64s(&g2), &f64s(&b2), eps);
    let e = rel_err(&host(&y), &want);
    assert!(e < TOL, "rel err {e}");
}

#[test]
fn layers_reject_bad_shapes() {
    let (dev, mut rng) = (Device::cpu(), StdRng::seed_from_u64(9));
    let lin = Linear::new(&linear_params(4, 3, true, &mut rng), &dev).unwrap();
    let err = lin
        .forward(&Tensor::zeros(&[2, 5], &dev).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("[..., 3]"), "{err}");
    let bad_bias = LinearParams::new(
        random(&[4, 3], 1.0, &mut rng),
        Some(random(&[3], 1.0, &mut rng)),
    );
    assert!(bad_bias.is_err());
    let p = attn_params(8, 2, &mut rng);
    assert!(MultiheadAttention::new(&p.q, &p.k, &p.v, &p.o, 3, &dev).is_err());
    let attn = attention_layer(&p, &dev);
    let m = AttentionMask::new(&[1, 1, 1], 1, 3, &dev).unwrap();
    let x = Tensor::zeros(&[1, 4, 8], &dev).unwrap();
    assert!(attn.forward(&x, Some(&m)).is_err());
    assert!(attn
        .forward(&Tensor::zeros(&[4, 8], &dev).unwrap(), None)
        .is_err());
    assert!(AttentionMask::new(&[1, 1], 1, 3, &dev).is_err());
}
