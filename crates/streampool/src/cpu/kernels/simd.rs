//! Vector code on stable Rust: loops written so LLVM vectorizes them, compiled for the best
//! instruction set the host has (chosen at run time), and branch-free `exp`/`erf` that
//! vectorize (the `libm` calls do not).
//!
//! `std::simd` is nightly-only. Instead [`multiversion!`] compiles a kernel's body for AVX-512,
//! for AVX2+FMA and for the baseline, and picks one at run time; its loops are vectorized
//! for that instruction set. On other architectures the baseline (NEON on aarch64) is used.

/// Defines `unsafe fn $name(args)` whose body is compiled three times, for AVX-512, for
/// AVX2+FMA and for the baseline, and picks the widest the CPU has on each call (a cached
/// feature check). The body is an `#[inline(always)]` function called from
/// `#[target_feature]` wrappers, so LLVM inlines it into them and vectorizes its loops (and
/// the `#[inline(always)]` helpers of this module they call) for that instruction set. A
/// closure handed to such a wrapper is not reliably inlined (its loops then stay SSE2: the
/// first version of these kernels measured so), hence the macro.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis unsafe fn $name($($arg: $ty),*) {
            #[inline(always)]
            unsafe fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
                unsafe fn v4($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn v3($($arg: $ty),*) {
                    body($($arg),*)
                }
                if $crate::cpu::kernels::simd::has_avx512() {
                    // SAFETY: the features `v4` is compiled for were detected.
                    return v4($($arg),*);
                }
                if $crate::cpu::kernels::simd::has_avx2() {
                    // SAFETY: as above, for AVX2 and FMA.
                    return v3($($arg),*);
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// The CPU has the AVX-512 subsets the `v4` versions use (std caches the check).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CPU has AVX2 and FMA.
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `e^x` for `f32`, branch-free (Cephes' `expf`: range reduction to `[-ln2/2, ln2/2]` and a
/// degree-6 polynomial; within 2 ulp). Inputs below -87.3 give 0 (so does `-inf`); inputs
/// above 88.3 give `e^88.3` (the kernels that call it pass `x - max <= 0`).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n * C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a `round`
    // call (which SSE2 cannot vectorize); Rust never reassociates float arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let underflow = x < -87.3;
    let x = x.clamp(-87.3, 88.3);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n from its exponent bits (n is in [-126, 128) after the clamp). n is read from t's
    // low mantissa bits (t = 1.5 * 2^23 + n, whose bits are ROUND's plus n), not by an `as
    // i32` cast: that saturating conversion kept the loops calling `exp` scalar (seen in
    // attention's softmax on the dev VM, `vcvttss2si` per element).
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    if underflow {
        0.0
    } else {
        e * scale
    }
}

/// `erf(x)` for `f32`, branch-free: a rational approximation on `[-4, 4]` (the one of Eigen
/// and XLA: 6.5e-8 from the true value in exact arithmetic, under 4e-7 (7 ulp of values
/// near 1) evaluated in `f32`), and exactly +-1 beyond, where `f32` cannot tell `erf` from 1.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let saturated = x.abs() >= 4.0;
    let sign = 1.0f32.copysign(x);
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.9546e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329_2e-3;
    q = q * x2 - 1.426_473_9e-2;
    // Exactly +-1 past 4 (the polynomial is an ulp short there), so GELU is exactly x or 0.
    if saturated {
        sign
    } else {
        x * p / q
    }
}

/// Softmax of `row` in place, over the entries whose `keep` is 1 (the others, padding keys,
/// get exactly 0; `keep`, if given, has at least one 1): the one loop of `Kernel::Softmax`
/// and of attention's masked softmax. The sum is taken in `f64` (an `f32` running sum
/// drifts past 1e-5 on long rows).
#[inline(always)]
pub(crate) fn softmax_in_place(row: &mut [f32], keep: Option<&[f32]>) {
    match keep {
        None => {
            let max = max(row);
            row.iter_mut().for_each(|s| *s = exp(*s - max));
        }
        Some(keep) => {
            let mut max = f32::NEG_INFINITY;
            for (&s, &k) in row.iter().zip(keep) {
                max = max.max(if k != 0.0 { s } else { f32::NEG_INFINITY });
            }
            // exp is finite for any input, so padding keys are exactly 0 after the product.
            row.iter_mut()
                .zip(keep)
                .for_each(|(s, &k)| *s = exp(*s - max) * k);
        }
    }
    let inv = (1.0 / sum_f64(row)) as f32;
    row.iter_mut().for_each(|s| *s *= inv);
}

/// `tanh(x)` for `f32`, branch-free: Eigen's rational approximation on `[-7.9, 7.9]` (a
/// few ulp; 2.6e-7 from the true value), and exactly +-1 beyond (so GELU is exactly 0 far
/// below 0). One division and no `exp`, like [`erf`].
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let saturated = x.abs() >= 7.905_311;
    let sign = 1.0f32.copysign(x);
    let x = x.clamp(-7.905_311, 7.905_311);
    let x2 = x * x;
    let mut p = -2.760_768_5e-16f32;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 - 8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    let mut q = 1.198_258_4e-6f32;
    q = q * x2 + 1.185_347_1e-4;
    q = q * x2 + 2.268_434_6e-3;
    q = q * x2 + 4.893_525e-3;
    if saturated {
        sign
    } else {
        x * p / q
    }
}

/// GELU in its tanh form, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, through the
/// vectorizable [`tanh`]: within 1e-6 (absolute, near 0) or a few `f32` ulp of the `f64` form
/// of `epilogue::gelu_tanh`, for the `bf16` products' epilogue (whose result is rounded to 8
/// bits).
#[inline(always)]
pub(crate) fn gelu_tanh_fast(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + tanh(K * (x + 0.044_715 * x * x * x)))
}

/// GELU in its exact (erf) form, as BERT uses it, with the vectorizable [`erf`].
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The sum of `x` in `f64`, in 8 lanes (vectorizes; `f64` keeps wide rows' statistics exact
/// to well below the `f32` result's rounding).
#[inline(always)]
pub(crate) fn sum_f64(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        let x = &x[c * 8..c * 8 + 8];
        for l in 0..8 {
            acc[l] += x[l] as f64;
        }
    }
    let tail: f64 = x[chunks * 8..].iter().map(|&v| v as f64).sum();
    acc.iter().sum::<f64>() + tail
}

/// `sum((x - mean)^2)` in `f64`, in 8 lanes.
#[inline(always)]
pub(crate) fn sq_dev_f64(x: &[f32], mean: f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        let x = &x[c * 8..c * 8 + 8];
        for l in 0..8 {
            let d = x[l] as f64 - mean;
            acc[l] += d * d;
        }
    }
    let tail: f64 = x[chunks * 8..]
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum();
    acc.iter().sum::<f64>() + tail
}

/// The largest element (`-inf` for an empty slice), in 16 lanes.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = x.len() / 16;
    for c in 0..chunks {
        let x = &x[c * 16..c * 16 + 16];
        for l in 0..16 {
            acc[l] = acc[l].max(x[l]);
        }
    }
    let tail = x[chunks * 16..]
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    acc.iter().copied().fold(tail, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_fast_is_close_to_the_f64_form() {
        let worst = (-1000..1000)
            .map(|i| i as f32 / 100.0)
            .map(|x| {
                let (f, r) = (
                    gelu_tanh_fast(x),
                    crate::cpu::kernels::epilogue::gelu_tanh(x),
                );
                (f - r).abs() - 1e-5 * r.abs()
            })
            .fold(0.0f32, f32::max);
        // 1e-5 relative, plus 1e-6 absolute where 1 + tanh cancels (x near -3).
        assert!(worst < 1e-6, "worst gap {worst}");
        assert_eq!(gelu_tanh_fast(0.0), 0.0);
        assert_eq!(gelu_tanh_fast(-100.0), 0.0);
        assert_eq!(gelu_tanh_fast(100.0), 100.0);
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_f64() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(-90.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn erf_and_gelu_match_f64() {
        let mut worst_erf = 0.0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let want = libm::erf(x as f64);
            worst_erf = worst_erf.max((erf(x) as f64 - want).abs());
            let g = gelu(x) as f64;
            let gw = 0.5 * x as f64 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2));
            // 0.5 * |x| * (a few ulp of erf near -1): the negative tail, where GELU is tiny.
            assert!(
                (g - gw).abs() <= 1e-6 + 2e-6 * gw.abs(),
                "gelu({x}) = {g}, want {gw}"
            );
            x += 0.001;
        }
        assert!(worst_erf < 4e-7, "worst erf error {worst_erf}");
    }

    #[test]
    fn reductions_match_plain_loops() {
        let x: Vec<f32> = (0..1003).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let s: f64 = x.iter().map(|&v| v as f64).sum();
        assert_eq!(sum_f64(&x), s);
        assert_eq!(max(&x), 50.0);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let mean = s / x.len() as f64;
        let want: f64 = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum();
        assert!((sq_dev_f64(&x, mean) - want).abs() < 1e-6 * want);
    }
}
