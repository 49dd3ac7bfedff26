//! The wgpu suite: the op suite (`ops.rs`, every op against float64), the dtype suite
//! (`dtypes.rs`: every float op in F32, and in F16 where the adapter has `SHADER_F16`,
//! against float64), the concurrency suite (`concurrency.rs`) and the allocator suite
//! (`allocator.rs`) run here again, unchanged, on a wgpu device (Mesa's lavapipe in CI,
//! NVIDIA's Vulkan driver on the H100), plus the tests of what only this backend has (the
//! quarantine lock, buffer-relative pointers, the matmul tiles, the dtype errors).
//!
//! The shared suites ask this module for their device (`device_under_test`, `device_with`).
//! Where no wgpu adapter exists at all, that says so loudly on stderr and the shared suites
//! fall back to the CPU backend (they have no early return of their own), while this
//! module's own tests print "no wgpu adapter, skipping" and return.

use std::sync::{Arc, OnceLock};

use streampool::{
    Activation, DType, Device, DeviceConfig, MatmulMath, Tensor, WgpuConfig, WgpuCoopMatrix,
    WgpuQuarantine,
};

use crate::util::{f32s, rel_err};

#[path = "allocator.rs"]
mod allocator;
#[path = "concurrency.rs"]
mod concurrency;
#[path = "dtypes.rs"]
mod dtypes;
#[path = "ops.rs"]
mod ops;

/// Whether an adapter exists (asked once per process).
fn have_adapter() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| match Device::wgpu() {
        Ok(d) => {
            eprintln!("wgpu suite on {}", d.name());
            true
        }
        Err(e) => {
            eprintln!("!!! NO WGPU ADAPTER ({e}): the wgpu tests are SKIPPED and the shared suites ran on the CPU instead !!!");
            false
        }
    })
}

/// The device of the shared suites: the process-wide wgpu device.
pub(crate) fn device_under_test() -> Device {
    if have_adapter() {
        Device::wgpu().expect("the wgpu device opened before")
    } else {
        Device::cpu()
    }
}

/// A new wgpu device with `config`, for the shared suites' tests that need their own.
pub(crate) fn device_with(config: DeviceConfig) -> streampool::Result<Device> {
    if have_adapter() {
        Device::wgpu_with(WgpuConfig {
            device: config,
            ..WgpuConfig::default()
        })
    } else {
        Device::cpu_with(config)
    }
}

/// Whether the device computes in F16 (its adapter has `SHADER_F16`), said loudly once.
fn half_supported() -> bool {
    static HALF: OnceLock<bool> = OnceLock::new();
    *HALF.get_or_init(|| {
        let half = have_adapter()
            && Tensor::zeros(&[2], &device_under_test())
                .and_then(|t| t.to_dtype(DType::F16))
                .is_ok();
        if !half {
            eprintln!("!!! NO SHADER_F16 on this adapter: the F16 tests run in F32 only !!!");
        }
        half
    })
}

/// The dtypes of the dtype suite: F32, and F16 where the adapter has `SHADER_F16` (BF16 is
/// never computed on wgpu: WGSL has no bf16 type).
pub(crate) fn dtypes_under_test() -> Vec<DType> {
    if !have_adapter() {
        return vec![DType::F32, DType::F16, DType::BF16]; // the CPU fallback runs them all
    }
    let mut v = vec![DType::F32];
    if half_supported() {
        v.push(DType::F16);
    }
    v
}

fn gpu() -> Option<Device> {
    if have_adapter() {
        Device::wgpu().ok()
    } else {
        eprintln!("no wgpu adapter, skipping");
        None
    }
}

fn ints(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((i * 5 + seed * 11) % 13) as f32 - 6.0)
        .collect()
}

/// 16 threads, each on its own stream, run matmul + bias + relu chains and check every
/// value; with the quarantine lock on and off.
#[test]
fn quarantine_lock_on_and_off_both_give_right_answers() {
    if gpu().is_none() {
        return;
    }
    for quarantine in [WgpuQuarantine::On, WgpuQuarantine::Off] {
        let dev = Device::wgpu_with(WgpuConfig {
            quarantine,
            ..WgpuConfig::default()
        })
        .unwrap();
        let (k, n) = (24, 16);
        let w_data = ints(k * n, 1);
        let w = Arc::new(Tensor::from_vec(w_data.clone(), &[k, n], &dev).unwrap());
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let (dev, w, w_data) = (&dev, w.clone(), &w_data);
                s.spawn(move || {
                    for i in 0..20 {
                        let m = 3 + (i % 4);
                        let x_data = ints(m * k, t * 100 + i as u64);
                        let x = Tensor::from_vec(x_data.clone(), &[m, k], dev).unwrap();
                        let y = x.matmul(&w).unwrap().relu().unwrap();
                        let got = y.to_vec::<f32>().unwrap();
                        for r in 0..m {
                            for c in 0..n {
                                let want: f32 =
                                    (0..k).map(|p| x_data[r * k + p] * w_data[p * n + c]).sum();
                                assert_eq!(got[r * n + c], want.max(0.0), "{quarantine:?}");
                            }
                        }
                    }
                });
            }
        });
        dev.synchronize().unwrap();
    }
}

/// Views at element offsets into one buffer (narrow, transpose, select) read the right
/// elements: the pointer's byte offset travels to the kernels as an element offset.
#[test]
fn views_at_offsets_inside_one_buffer() {
    let Some(dev) = gpu() else { return };
    let data: Vec<f32> = (0..60).map(|v| v as f32).collect();
    let x = Tensor::from_vec(data.clone(), &[6, 10], &dev).unwrap();
    let v = x.narrow(0, 2, 3).unwrap().narrow(1, 3, 4).unwrap();
    let want: Vec<f32> = (2..5)
        .flat_map(|r| (3..7).map(move |c| (r * 10 + c) as f32))
        .collect();
    assert_eq!(v.to_vec::<f32>().unwrap(), want);
    assert_eq!(v.relu().unwrap().to_vec::<f32>().unwrap(), want);
    let t = x.narrow(1, 1, 2).unwrap().t().unwrap();
    let want_t: Vec<f32> = (1..3)
        .flat_map(|c| (0..6).map(move |r| (r * 10 + c) as f32))
        .collect();
    assert_eq!(t.contiguous().unwrap().to_vec::<f32>().unwrap(), want_t);
}

/// A block larger than a kernel may bind is refused with an out-of-memory error, and the
/// device keeps working.
#[test]
fn blocks_over_the_binding_limit_are_errors() {
    let Some(dev) = gpu() else { return };
    let huge = 1usize << 40; // 4 TiB of f32
    assert!(Tensor::zeros(&[huge], &dev).is_err());
    let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2], &dev).unwrap();
    assert_eq!(x.relu().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
}

/// A host wait that cannot finish within the device's wait limit fails with an error naming
/// the limit instead of blocking its caller: a 1 ms limit, and a read-back behind a chain of
/// 1024^3 matmuls sized to keep this adapter busy for about 50 ms (one matmul timed on the
/// shared device first), ending in one 4096^3 matmul (137 GFLOP: milliseconds on any GPU).
/// The chain alone did not always decide (on the H100, in 1 of 3 parallel suites): the
/// stream submits its command buffers as they fill (after 4, 8, 16, then every 32
/// launches), so a host slower than the GPU (the parallel suite's other tests on its cores)
/// can leave only the last few launches unfinished when the wait begins; the big matmul is
/// the last launch, submitted at the earliest with the read-back, so the wait starts with
/// milliseconds of work ahead whatever the host's pace. If the work was done before the wait
/// began anyway (this thread held off the CPU meanwhile), the attempt decides nothing and
/// is run again with twice the chain.
///
/// Not on Mesa's software Vulkan (llvmpipe): there the chain was done before the wait began
/// in every attempt of a CI run (64 matmuls behind the read-back), so no wait can
/// be made to outlast a limit; the H100 through Vulkan runs it.
#[test]
fn a_wait_past_the_limit_is_an_error_not_a_hang() {
    let Some(shared) = gpu() else { return };
    if shared.name().contains("llvmpipe") {
        eprintln!(
            "skipped on {}: its submissions finish before a wait begins",
            shared.name()
        );
        return;
    }
    let n = 1024;
    let timed = |dev: &Device| {
        let a = Tensor::from_vec(ints(n * n, 1), &[n, n], dev).unwrap();
        let start = std::time::Instant::now();
        a.matmul(&a)
            .unwrap()
            .sum(0, false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        start.elapsed()
    };
    timed(&shared); // kernels built, buffers warm
    let one = timed(&shared).max(std::time::Duration::from_micros(10));
    let mut reps = (0.05 / one.as_secs_f64()).ceil().clamp(4.0, 1024.0) as usize;
    let dev = Device::wgpu_with(WgpuConfig {
        wait_limit: Some(std::time::Duration::from_millis(1)),
        ..WgpuConfig::default()
    })
    .unwrap();
    let w = Tensor::from_vec(ints(n * n, 3), &[n, n], &dev).unwrap();
    let big_n = 4096;
    let big = Tensor::from_vec(ints(big_n * big_n, 5), &[big_n, big_n], &dev).unwrap();
    for _ in 0..4 {
        let mut x = Tensor::from_vec(ints(n * n, 1), &[n, n], &dev).unwrap();
        for _ in 0..reps {
            x = x.matmul(&w).unwrap().affine(1.0 / 64.0, 0.0).unwrap();
        }
        // In stream order before the read-back of `x`, which therefore waits for it too.
        let last = big.matmul(&big).unwrap();
        let read = x.to_vec::<f32>();
        drop(last);
        match read {
            Err(e) => {
                assert!(
                    matches!(e, streampool::Error::Backend { .. })
                        && e.to_string().contains("wait limit"),
                    "{e}"
                );
                return;
            }
            Ok(_) => reps *= 2, // undecided: the chain had finished before the wait began
        }
    }
    panic!("a read-back behind {reps} matmuls never outlasted a 1 ms wait limit");
}

/// BF16 is an error naming WGSL; F16 works where the adapter has `SHADER_F16` and is an
/// error naming the feature where it does not. The device keeps working after either.
#[test]
fn bf16_is_a_clear_error_and_f16_follows_the_adapter() {
    let Some(dev) = gpu() else { return };
    let x = Tensor::from_vec(vec![1.5f32, -2.0, 0.25], &[3], &dev).unwrap();
    let e = x.to_dtype(DType::BF16).unwrap_err().to_string();
    assert!(e.contains("BF16") && e.contains("WGSL"), "{e}");
    match x.to_dtype(DType::F16) {
        Ok(h) => {
            assert!(half_supported());
            let y = h.relu().unwrap().to_dtype(DType::F32).unwrap();
            assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5, 0.0, 0.25]);
        }
        Err(e) => {
            assert!(!half_supported());
            assert!(e.to_string().contains("SHADER_F16"), "{e}");
        }
    }
    assert_eq!(
        x.relu().unwrap().to_vec::<f32>().unwrap(),
        vec![1.5, 0.0, 0.25]
    );
}

/// Every matmul kernel (the 16x16 tile and the register-blocked 64x64 and 128x128 ones,
/// forced through `WgpuConfig::matmul_tile`) against float64, at sizes that leave partial
/// tiles (1, 7, 65, 129, 130), batched, with a transposed right operand (the models' `W^T`
/// view), a row-major one, a transposed left one, a broadcast batch and views at offsets,
/// with K and N multiples of 4 (the blocked tiles' vec4 variants) and not; in F32 and, where the
/// adapter has it, F16 (tolerance 1e-5 and 1e-3, norm-relative).
#[test]
fn matmul_tiles_odd_shapes_layouts_and_dtypes() {
    if gpu().is_none() {
        return;
    }
    let mut seed = 0u64;
    let mut values = |len: usize| -> Vec<f32> {
        seed += 1;
        hashed(len, seed)
    };
    let shapes = [
        (1, 7, 65),
        (7, 65, 129),
        (65, 129, 1),
        (129, 65, 129),
        (65, 1, 7),
        (129, 129, 65),
        // K and N multiples of 4: the blocked tiles' vec4 variants (B along K and along N).
        (130, 68, 72),
        (66, 8, 68),
        // One row, narrow outputs: the GEMV kernel's 128 and 256 lanes per column.
        (1, 100, 9),
        (1, 300, 70),
    ];
    // `None`: the automatic choice, which takes the GEMV kernel for one-row outputs.
    for tile in [None, Some(16), Some(64), Some(128)] {
        let dev = Device::wgpu_with(WgpuConfig {
            matmul_tile: tile,
            ..WgpuConfig::default()
        })
        .unwrap();
        for dt in dtypes_under_test() {
            let tol = if dt == DType::F16 { 1e-3 } else { 1e-5 };
            // The value each input takes in `dt`.
            let exact = |v: &[f32]| -> Vec<f64> {
                v.iter()
                    .map(|&x| match dt {
                        DType::F16 => half::f16::from_f32(x).to_f64(),
                        _ => x as f64,
                    })
                    .collect()
            };
            for (m, k, n) in shapes {
                let batch = 3;
                let a = values(batch * m * k);
                // The right operand is stored [n, k] and used through its transpose; the
                // left one both as it is and through the transpose of a [k, m] copy.
                let w = values(n * k);
                let (av, wv) = (exact(&a), exact(&w));
                let mut want = vec![0.0f64; batch * m * n];
                for bi in 0..batch {
                    for i in 0..m {
                        for j in 0..n {
                            want[(bi * m + i) * n + j] = (0..k)
                                .map(|l| av[(bi * m + i) * k + l] * wv[j * k + l])
                                .sum();
                        }
                    }
                }
                let check_with = |what: &str, got: &Tensor, want: &[f64]| {
                    assert_eq!(got.dims(), &[batch, m, n], "{what}");
                    let e = rel_err(&f32s(got), want);
                    assert!(
                        e <= tol,
                        "tile {tile:?} {dt:?} {m}x{k}x{n} {what}: relative error {e:.2e}"
                    );
                };
                let check = |what: &str, got: &Tensor| check_with(what, got, &want);
                let up = |v: &[f32], shape: &[usize]| {
                    Tensor::from_slice(v, shape, &dev)
                        .unwrap()
                        .to_dtype(dt)
                        .unwrap()
                };
                let at = up(&a, &[batch, m, k]);
                let wt = up(&w, &[n, k]).t().unwrap();
                check("A W^T (shared right operand)", &at.matmul(&wt).unwrap());
                check(
                    "A W (row-major right operand)",
                    &at.matmul(&wt.contiguous().unwrap()).unwrap(),
                );
                // A stored as [batch, k, m] and read transposed; W^T made contiguous.
                let a_km: Vec<f32> = (0..batch * k * m)
                    .map(|e| {
                        let (bi, l, i) = (e / (k * m), (e / m) % k, e % m);
                        a[(bi * m + i) * k + l]
                    })
                    .collect();
                let a_t = up(&a_km, &[batch, k, m]).transpose(1, 2).unwrap();
                let w_kn = wt.contiguous().unwrap();
                check(
                    "A^T W (transposed left operand)",
                    &a_t.matmul(&w_kn).unwrap(),
                );
                // A view one row into a larger buffer: the offset travels as an element offset.
                let mut padded = values(k);
                padded.extend_from_slice(&a);
                let a_off = up(&padded, &[batch * m + 1, k])
                    .narrow(0, 1, batch * m)
                    .unwrap()
                    .reshape(&[batch, m, k])
                    .unwrap();
                check("A at an offset", &a_off.matmul(&wt).unwrap());
                // The bias and activation fused into the product's stores (the epilogue),
                // through W^T and through W.
                let bias_v = values(n);
                let bv = exact(&bias_v);
                let bias_t = up(&bias_v, &[n]);
                for act in [
                    Activation::Identity,
                    Activation::Relu,
                    Activation::Gelu,
                    Activation::GeluTanh,
                ] {
                    let want_act: Vec<f64> = want
                        .iter()
                        .enumerate()
                        .map(|(e, w)| act_f64(act, w + bv[e % n]))
                        .collect();
                    let math = MatmulMath::Exact;
                    check_with(
                        &format!("A W^T + bias, {act:?}"),
                        &at.matmul_bias_act(&wt, &bias_t, act, math).unwrap(),
                        &want_act,
                    );
                    check_with(
                        &format!("A W + bias, {act:?}"),
                        &at.matmul_bias_act(&wt.contiguous().unwrap(), &bias_t, act, math)
                            .unwrap(),
                        &want_act,
                    );
                }
            }
        }
    }
}

/// Values in [-1, 1] from a hash of the index and `seed`.
fn hashed(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| {
            let h = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
            ((h >> 40) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// The cooperative-matrix settings to test on this adapter: emulated everywhere (where the
/// adapter has `SHADER_F16`), on matrix units where it has them.
fn coop_modes() -> Vec<WgpuCoopMatrix> {
    if !half_supported() {
        eprintln!("no SHADER_F16: the cooperative-matrix kernels are f16 only, skipping");
        return Vec::new();
    }
    let mut modes = vec![WgpuCoopMatrix::Emulated];
    let dev = Device::wgpu_with(WgpuConfig {
        cooperative_matrix: WgpuCoopMatrix::On,
        ..WgpuConfig::default()
    })
    .unwrap();
    let state = dev.wgpu_cooperative_matrix_use().unwrap();
    eprintln!("cooperative matrices with the opt-in: {state}");
    if state.starts_with("on") {
        modes.push(WgpuCoopMatrix::On);
    }
    modes
}

/// `a @ w^T` (+ bias, activation) in float64 from the f16 values of the inputs.
fn reference_f16(
    a: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    act: Activation,
    (batch, m, k, n): (usize, usize, usize, usize),
) -> Vec<f64> {
    let h = |x: f32| half::f16::from_f32(x).to_f64();
    let mut want = vec![0.0f64; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut v: f64 = (0..k)
                    .map(|l| h(a[(bi * m + i) * k + l]) * h(w[j * k + l]))
                    .sum();
                if let Some(b) = bias {
                    v += h(b[j]);
                }
                want[(bi * m + i) * n + j] = act_f64(act, v);
            }
        }
    }
    want
}

/// `act` applied to `x` in float64 (GELU in its erf and its tanh form).
fn act_f64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Identity => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => 0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt())),
        Activation::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// Every cooperative-matrix tile (64 or 128 rows and columns, 16- or 32-deep slices, forced
/// through `WgpuConfig::matmul_block`) against float64 in f16: emulated on every adapter
/// with `SHADER_F16` (the tiling, double buffering, edges, layouts and epilogue), on matrix
/// units where the adapter has them. Ragged shapes (no extent a multiple of the tile, K not
/// of the slice), batched, with the right operand as `W^T` (B along K), row-major (B along
/// N) and the left one transposed (the generic layout), at an offset, and with the bias and
/// activation fused; tolerance 1e-3 norm-relative (f16 outputs).
#[test]
fn coop_matmul_tiles_against_float64() {
    if gpu().is_none() {
        return;
    }
    // (m, k, n); the aligned layouts need K and N multiples of 4.
    let shapes = [
        (65, 33, 70),
        (200, 100, 129),
        (130, 72, 68),
        (257, 264, 136),
        (64, 32, 64),
    ];
    let batch = 2;
    let mut seed = 100;
    for mode in coop_modes() {
        for tile in [
            [64, 64, 16],
            [64, 64, 32],
            [128, 64, 32],
            [64, 128, 16],
            [128, 128, 16],
            [128, 128, 32],
        ] {
            let dev = Device::wgpu_with(WgpuConfig {
                cooperative_matrix: mode,
                matmul_block: Some(tile),
                ..WgpuConfig::default()
            })
            .unwrap();
            for (m, k, n) in shapes {
                let what = format!("{mode:?} tile {tile:?} {batch}x{m}x{k}x{n}");
                let path = &dev
                    .wgpu_matmul_paths(&[(batch, m, k, n)], DType::F16)
                    .unwrap()[0]
                    .1;
                if !path.starts_with("cooperative") {
                    // The tile is over the adapter's workgroup memory: the FMA kernels run.
                    eprintln!("{what}: {path} (the tile does not fit this adapter)");
                    continue;
                }
                seed += 1;
                let a = hashed(batch * m * k, seed);
                let w = hashed(n * k, seed + 1000);
                let bias = hashed(n, seed + 2000);
                let up = |v: &[f32], shape: &[usize]| {
                    Tensor::from_slice(v, shape, &dev)
                        .unwrap()
                        .to_dtype(DType::F16)
                        .unwrap()
                };
                let dims = (batch, m, k, n);
                let want = reference_f16(&a, &w, None, Activation::Identity, dims);
                let at = up(&a, &[batch, m, k]);
                let wt = up(&w, &[n, k]).t().unwrap();
                let check = |how: &str, got: &Tensor, want: &[f64]| {
                    assert_eq!(got.dims(), &[batch, m, n], "{what} {how}");
                    let e = rel_err(&f32s(got), want);
                    assert!(e <= 1e-3, "{what} {how}: relative error {e:.2e}");
                };
                check("A W^T", &at.matmul(&wt).unwrap(), &want);
                let w_kn = wt.contiguous().unwrap();
                check("A W", &at.matmul(&w_kn).unwrap(), &want);
                let a_km: Vec<f32> = (0..batch * k * m)
                    .map(|e| {
                        let (bi, l, i) = (e / (k * m), (e / m) % k, e % m);
                        a[(bi * m + i) * k + l]
                    })
                    .collect();
                let a_t = up(&a_km, &[batch, k, m]).transpose(1, 2).unwrap();
                check("A^T W", &a_t.matmul(&w_kn).unwrap(), &want);
                let mut padded = hashed(k, seed + 3000);
                padded.extend_from_slice(&a);
                let a_off = up(&padded, &[batch * m + 1, k])
                    .narrow(0, 1, batch * m)
                    .unwrap()
                    .reshape(&[batch, m, k])
                    .unwrap();
                check("A at an offset, W^T", &a_off.matmul(&wt).unwrap(), &want);
                let bias_t = up(&bias, &[n]);
                for act in [Activation::Gelu, Activation::Relu] {
                    let want = reference_f16(&a, &w, Some(&bias), act, dims);
                    let math = MatmulMath::Exact;
                    check(
                        &format!("A W^T + bias, {act:?}"),
                        &at.matmul_bias_act(&wt, &bias_t, act, math).unwrap(),
                        &want,
                    );
                    check(
                        &format!("A W + bias, {act:?}"),
                        &at.matmul_bias_act(&w_kn, &bias_t, act, math).unwrap(),
                        &want,
                    );
                }
            }
        }
    }
}

/// The cooperative-matrix matmul from four threads at once, each on its own pooled stream
/// with its own operands, each result against float64 (the automatic tile choice).
#[test]
fn coop_matmul_from_several_threads() {
    if gpu().is_none() {
        return;
    }
    for mode in coop_modes() {
        let dev = Device::wgpu_with(WgpuConfig {
            cooperative_matrix: mode,
            ..WgpuConfig::default()
        })
        .unwrap();
        let (batch, m, k, n) = (1, 300, 384, 200);
        let path = &dev
            .wgpu_matmul_paths(&[(batch, m, k, n)], DType::F16)
            .unwrap()[0]
            .1;
        assert!(path.starts_with("cooperative"), "{mode:?}: {path}");
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let dev = dev.clone();
                s.spawn(move || {
                    let a = hashed(m * k, 500 + t);
                    let w = hashed(n * k, 600 + t);
                    let want = reference_f16(&a, &w, None, Activation::Identity, (batch, m, k, n));
                    let up = |v: &[f32], shape: &[usize]| {
                        Tensor::from_slice(v, shape, &dev)
                            .unwrap()
                            .to_dtype(DType::F16)
                            .unwrap()
                    };
                    let at = up(&a, &[batch, m, k]);
                    let wt = up(&w, &[n, k]).t().unwrap();
                    for round in 0..5 {
                        let got = at.matmul(&wt).unwrap();
                        let e = rel_err(&f32s(&got), &want);
                        assert!(e <= 1e-3, "{mode:?} thread {t} round {round}: {e:.2e}");
                    }
                });
            }
        });
    }
}
