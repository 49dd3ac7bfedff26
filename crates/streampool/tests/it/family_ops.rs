//! The ops of the model families past BERT on the CPU backend against float64 references
//! written here: RMSNorm, rotary positions, gated activations (GeGLU erf/tanh, SwiGLU) and
//! broadcasting; in f32 (relative error < 1e-5) and in f16/bf16 (storage rounding).

use streampool::{DType, Device, GateActivation, Tensor};

use crate::util::max_rel_err;

fn data(n: usize, seed: u64) -> Vec<f32> {
    Tensor::randn(&[n], seed, &Device::cpu())
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn rms_ref(x: &[f32], g: &[f32], cols: usize, eps: f64) -> Vec<f64> {
    x.chunks_exact(cols)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            r.iter()
                .zip(g)
                .map(move |(&v, &g)| v as f64 * inv * g as f64)
        })
        .collect()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gate_ref(act: GateActivation, x: f64) -> f64 {
    match act {
        GateActivation::Gelu => gelu(x),
        GateActivation::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        GateActivation::Silu => x / (1.0 + (-x).exp()),
    }
}

#[test]
fn rms_norm_matches_f64() {
    let dev = Device::cpu();
    for cols in [1, 16, 300, 1030] {
        let (x, g) = (data(4 * cols, 1), data(cols, 2));
        let want = rms_ref(&x, &g, cols, 1e-6);
        let xt = Tensor::from_vec(x.clone(), &[4, cols], &dev).unwrap();
        let gt = Tensor::from_vec(g.clone(), &[cols], &dev).unwrap();
        let got = xt.rms_norm(&gt, 1e-6).unwrap().to_vec::<f32>().unwrap();
        assert!(max_rel_err(&got, &want) < 1e-5, "cols {cols}");
        for (dt, tol) in [(DType::F16, 2e-3), (DType::BF16, 2e-2)] {
            let got = xt
                .to_dtype(dt)
                .unwrap()
                .rms_norm(&gt.to_dtype(dt).unwrap(), 1e-6)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            assert!(max_rel_err(&got, &want) < tol, "cols {cols} {dt:?}");
        }
    }
    let x = Tensor::zeros(&[2, 4], &dev).unwrap();
    assert!(x
        .rms_norm(&Tensor::zeros(&[3], &dev).unwrap(), 1e-6)
        .is_err());
    assert!(x
        .rms_norm(&Tensor::zeros(&[4], &dev).unwrap(), -1.0)
        .is_err());
}

#[test]
fn rope_matches_f64_rotations() {
    let dev = Device::cpu();
    let (b, s, h, d) = (2, 5, 3, 8);
    let half = d / 2;
    let x = data(b * s * h * d, 3);
    // Tables for 7 positions (more than the sequence), base 100.
    let angle = |p: usize, i: usize| p as f64 / 100f64.powf(2.0 * i as f64 / d as f64);
    let (cos, sin): (Vec<f32>, Vec<f32>) = (0..7)
        .flat_map(|p| (0..half).map(move |i| (angle(p, i).cos() as f32, angle(p, i).sin() as f32)))
        .unzip();
    let mut want = vec![0.0f64; x.len()];
    for row in 0..b * s * h {
        let p = (row / h) % s;
        for i in 0..half {
            let (c, sn) = (angle(p, i).cos(), angle(p, i).sin());
            let (x1, x2) = (x[row * d + i] as f64, x[row * d + i + half] as f64);
            want[row * d + i] = x1 * c - x2 * sn;
            want[row * d + i + half] = x2 * c + x1 * sn;
        }
    }
    let xt = Tensor::from_vec(x, &[b, s, h, d], &dev).unwrap();
    let ct = Tensor::from_vec(cos, &[7, half], &dev).unwrap();
    let st = Tensor::from_vec(sin, &[7, half], &dev).unwrap();
    let got = xt.rope(&ct, &st).unwrap().to_vec::<f32>().unwrap();
    assert!(max_rel_err(&got, &want) < 1e-6);
    // A strided view (the query heads of a fused projection) gives the same.
    let wide = Tensor::from_vec(data(b * s * 2 * h * d, 4), &[b, s, 2 * h, d], &dev).unwrap();
    let view = wide.narrow(2, h, h).unwrap();
    let a = view.rope(&ct, &st).unwrap().to_vec::<f32>().unwrap();
    let c = view
        .contiguous()
        .unwrap()
        .rope(&ct, &st)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, c);
    // Only the first heads rotated (the queries and keys of a fused projection), the rest
    // copied: the same as rotating those heads alone.
    let qkv = Tensor::from_vec(data(b * s * 3 * h * d, 8), &[b, s, 3 * h, d], &dev).unwrap();
    let part = qkv.rope_heads(&ct, &st, 2 * h).unwrap();
    let rotated = qkv.narrow(2, 0, 2 * h).unwrap().rope(&ct, &st).unwrap();
    assert_eq!(
        part.narrow(2, 0, 2 * h)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        rotated.to_vec::<f32>().unwrap()
    );
    assert_eq!(
        part.narrow(2, 2 * h, h)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        qkv.narrow(2, 2 * h, h)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    assert!(qkv.rope_heads(&ct, &st, 3 * h + 1).is_err());
    let short = Tensor::zeros(&[4, half], &dev).unwrap();
    assert!(
        xt.rope(&short, &short).is_err(),
        "tables shorter than the sequence"
    );
    assert!(xt.rope(&ct.to_dtype(DType::F16).unwrap(), &st).is_err());
}

#[test]
fn gated_activations_match_f64() {
    let dev = Device::cpu();
    let (rows, cols) = (6, 37);
    let x = data(rows * 2 * cols, 5)
        .iter()
        .map(|v| v * 3.0)
        .collect::<Vec<_>>();
    let xt = Tensor::from_vec(x.clone(), &[rows, 2 * cols], &dev).unwrap();
    for act in [
        GateActivation::Gelu,
        GateActivation::GeluTanh,
        GateActivation::Silu,
    ] {
        let want: Vec<f64> = x
            .chunks_exact(2 * cols)
            .flat_map(|r| (0..cols).map(move |c| gate_ref(act, r[c] as f64) * r[cols + c] as f64))
            .collect();
        let got = xt.gated_act(act).unwrap();
        assert_eq!(got.dims(), &[rows, cols]);
        assert!(
            max_rel_err(&got.to_vec::<f32>().unwrap(), &want) < 1e-5,
            "{act:?}"
        );
    }
    assert!(Tensor::zeros(&[2, 3], &dev)
        .unwrap()
        .gated_act(GateActivation::Silu)
        .is_err());
}

#[test]
fn broadcast_as_repeats_size_one_dims() {
    let dev = Device::cpu();
    // Grouped-query attention's use: [b, kv, 1, s, d] -> [b, kv, g, s, d].
    let x = Tensor::from_vec(data(2 * 2 * 3 * 4, 6), &[2, 2, 1, 3, 4], &dev).unwrap();
    let y = x
        .broadcast_as(&[2, 2, 5, 3, 4])
        .unwrap()
        .contiguous()
        .unwrap();
    let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    for (i, chunk) in yv.chunks_exact(12).enumerate() {
        let src = (i / 5) * 12;
        assert_eq!(chunk, &xv[src..src + 12]);
    }
    assert!(x.broadcast_as(&[2, 3, 1, 3, 4]).is_err());
}
