//! Both attention paths against an `f64` reference: sequence lengths around the tiles' edges
//! (8 queries, 16 and 32 keys), head widths of one, two and more column groups, masks with
//! padding and with every key padded, and a poisoned output (every element must be written).

use rand::{Rng, SeedableRng};

use super::*;

/// `[batch, seq, 3 * heads * d]` QKV, `[batch, seq]` mask (1 keep, 0 padding): `f64` out.
fn reference(
    qkv: &[f32],
    mask: &[f32],
    (batch, seq, heads, d): (usize, usize, usize, usize),
) -> Vec<f64> {
    let hidden = heads * d;
    let at = |b: usize, i: usize, part: usize, h: usize, c: usize| {
        f64::from(qkv[(b * seq + i) * 3 * hidden + part * hidden + h * d + c])
    };
    let mut out = vec![0.0; batch * seq * hidden];
    for b in 0..batch {
        let m = &mask[b * seq..(b + 1) * seq];
        let any = m.iter().any(|&v| v != 0.0);
        for h in 0..heads {
            for i in 0..seq {
                let p: Vec<f64> = if any {
                    let s: Vec<f64> = (0..seq)
                        .map(|j| (0..d).map(|c| at(b, i, 0, h, c) * at(b, j, 1, h, c)).sum())
                        .collect();
                    let mx = (0..seq)
                        .filter(|&j| m[j] != 0.0)
                        .map(|j| s[j])
                        .fold(f64::MIN, f64::max);
                    let e: Vec<f64> = (0..seq)
                        .map(|j| if m[j] != 0.0 { (s[j] - mx).exp() } else { 0.0 })
                        .collect();
                    let z: f64 = e.iter().sum();
                    e.iter().map(|v| v / z).collect()
                } else {
                    vec![1.0 / seq as f64; seq]
                };
                for c in 0..d {
                    out[(b * seq + i) * hidden + h * d + c] =
                        (0..seq).map(|j| p[j] * at(b, j, 2, h, c)).sum();
                }
            }
        }
    }
    out
}

/// Runs one shape through `run` (which computes every pair into `out`) and checks it.
fn check(
    shape: (usize, usize, usize, usize),
    mask_kind: usize,
    seed: u64,
    run: impl Fn(&[f32], Option<&[f32]>, &mut [f32]),
) {
    let (batch, seq, heads, d) = shape;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let qkv: Vec<f32> = (0..batch * seq * 3 * heads * d)
        .map(|_| rng.gen_range(-1.5..1.5))
        .collect();
    // 0: no mask; 1: the second sequence half padded; 2: also the first sequence all padding.
    let mut mask = vec![1.0f32; batch * seq];
    if mask_kind >= 1 && batch > 1 {
        for j in seq.div_ceil(2)..seq {
            mask[seq + j] = 0.0;
        }
    }
    if mask_kind == 2 {
        mask[..seq].fill(0.0);
    }
    let mut out = vec![f32::NAN; batch * seq * heads * d];
    run(&qkv, (mask_kind > 0).then_some(&mask[..]), &mut out);
    let want = reference(&qkv, &mask, shape);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&y, &r)) in out.iter().zip(&want).enumerate() {
        assert!(
            y.is_finite(),
            "{shape:?} mask {mask_kind}: element {i} is {y}"
        );
        num += (f64::from(y) - r).powi(2);
        den += r * r;
        assert!(
            (f64::from(y) - r).abs() <= 1e-4 * (1.0 + r.abs()),
            "{shape:?} mask {mask_kind}: element {i} {y} vs {r}"
        );
    }
    let rel = (num / den.max(1e-30)).sqrt();
    assert!(
        rel < 1e-5,
        "{shape:?} mask {mask_kind}: relative error {rel:e}"
    );
}

const SHAPES: [(usize, usize, usize, usize); 9] = [
    (2, 32, 3, 32),
    (2, 1, 2, 32),
    (3, 7, 2, 16),
    (2, 37, 2, 32),
    (2, 16, 1, 48),
    (2, 33, 2, 64),
    (2, 128, 2, 32),
    (2, 130, 1, 80),
    (2, 9, 1, 24),
];

fn as_ptr(v: &[f32]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

#[test]
fn attention_matches_f64_on_the_path_the_process_takes() {
    for (n, &shape) in SHAPES.iter().enumerate() {
        for mask_kind in 0..3 {
            check(
                shape,
                mask_kind,
                10 * n as u64 + mask_kind as u64,
                |qkv, mask, out| {
                    let (batch, seq, heads, d) = shape;
                    // SAFETY: the buffers have the lengths `attention` reads and writes.
                    unsafe {
                        attention(
                            as_ptr(qkv),
                            mask.map(as_ptr),
                            DevicePtr(out.as_mut_ptr() as u64),
                            batch,
                            seq,
                            heads,
                            d,
                        )
                    }
                },
            );
        }
    }
}

#[test]
fn both_pair_paths_match_f64() {
    for (n, &shape) in SHAPES.iter().enumerate() {
        let (batch, seq, heads, d) = shape;
        for mask_kind in 0..3 {
            let seed = 100 + 10 * n as u64 + mask_kind as u64;
            check(shape, mask_kind, seed, |qkv, mask, out| {
                let (mut scores, mut keep) = (vec![0.0f32; seq * seq], vec![0.0f32; seq]);
                for b in 0..batch {
                    for h in 0..heads {
                        // SAFETY: as above, one pair at a time.
                        unsafe {
                            let o = DevicePtr(out.as_mut_ptr() as u64);
                            pair(
                                as_ptr(qkv),
                                mask,
                                o,
                                b,
                                h,
                                seq,
                                heads,
                                d,
                                &mut scores,
                                &mut keep,
                            )
                        }
                    }
                }
            });
            #[cfg(target_arch = "x86_64")]
            if avx512::applies(seq, d) {
                check(shape, mask_kind, seed, |qkv, mask, out| {
                    let hidden = heads * d;
                    let (kl, sl) = avx512::scratch_len(seq, d);
                    let (mut kt, mut s) = (vec![f32::NAN; kl], vec![f32::NAN; sl]);
                    for b in 0..batch {
                        for h in 0..heads {
                            let base = qkv[b * seq * 3 * hidden + h * d..].as_ptr();
                            // SAFETY: the pair's rows lie in `qkv` and `out`; the path applies.
                            unsafe {
                                let p = avx512::Pair {
                                    q: base,
                                    k: base.add(hidden),
                                    v: base.add(2 * hidden),
                                    width: 3 * hidden,
                                    out: out.as_mut_ptr().add(b * seq * hidden + h * d),
                                    ldo: hidden,
                                    seq,
                                    d,
                                    keep: mask.map(|m| &m[b * seq..(b + 1) * seq]),
                                };
                                avx512::pair(&p, &mut kt, &mut s);
                            }
                        }
                    }
                });
            }
        }
    }
}
