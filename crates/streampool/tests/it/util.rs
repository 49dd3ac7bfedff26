//! Helpers shared by the test modules: a seeded RNG, a float64 reference n-d array that
//! mirrors the tensor ops element by element, the closeness measures every numeric check of
//! this crate's tests uses, and [`in_own_process`].
//!
//! The reference is deliberately naive (index arithmetic over row-major data, f64 math) so
//! that it shares no code or strategy with the kernels it checks.

use std::f64::consts::PI;

/// Relative tolerance of the f32 op checks ([`assert_close`], [`assert_norm_close`]): a few
/// f32 roundings of the result, far below any indexing or accumulation mistake.
pub const TOL: f64 = 1e-5;

/// SplitMix64: tiny, seeded, and good enough for test inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        (lo as f64 + (hi as f64 - lo as f64) * self.unit()) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = 1.0 - self.unit(); // in (0, 1], so the log is finite
        let u2 = self.unit();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()) as f32
    }

    pub fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }

    pub fn uniforms(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Every multi-index of `shape`, row-major (one empty index for rank 0).
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0; shape.len()];
    for _ in 0..n {
        out.push(idx.clone());
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// NumPy broadcasting, written independently of the crate's `broadcast_shapes`.
pub fn numpy_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; n - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// A row-major n-d array on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Nd<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

impl<T: Copy> Nd<T> {
    pub fn new(shape: &[usize], data: Vec<T>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape {shape:?}"
        );
        Nd {
            shape: shape.to_vec(),
            data,
        }
    }

    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> T) -> Self {
        let data = indices(shape).iter().map(|i| f(i)).collect();
        Nd::new(shape, data)
    }

    pub fn at(&self, idx: &[usize]) -> T {
        let mut off = 0;
        for (d, &i) in idx.iter().enumerate() {
            assert!(i < self.shape[d]);
            off = off * self.shape[d] + i;
        }
        self.data[off]
    }

    pub fn transpose(&self, d0: usize, d1: usize) -> Self {
        let mut shape = self.shape.clone();
        shape.swap(d0, d1);
        Nd::from_fn(&shape, |i| {
            let mut j = i.to_vec();
            j.swap(d0, d1);
            self.at(&j)
        })
    }

    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Self {
        let mut shape = self.shape.clone();
        shape[axis] = len;
        Nd::from_fn(&shape, |i| {
            let mut j = i.to_vec();
            j[axis] += start;
            self.at(&j)
        })
    }

    pub fn reshape(&self, shape: &[usize]) -> Self {
        Nd::new(shape, self.data.clone())
    }

    pub fn map<U: Copy>(&self, f: impl Fn(T) -> U) -> Nd<U> {
        Nd::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }
}

impl Nd<f64> {
    pub fn from_f32(shape: &[usize], data: &[f32]) -> Self {
        Nd::new(shape, data.iter().map(|&x| x as f64).collect())
    }

    /// Element-wise `f(self, other)` with NumPy broadcasting.
    pub fn zip(&self, other: &Nd<f64>, f: impl Fn(f64, f64) -> f64) -> Nd<f64> {
        let shape = numpy_broadcast(&self.shape, &other.shape).expect("broadcastable");
        let pick = |src: &Nd<f64>, i: &[usize]| {
            let skip = i.len() - src.shape.len();
            let j: Vec<usize> = src
                .shape
                .iter()
                .zip(&i[skip..])
                .map(|(&d, &x)| if d == 1 { 0 } else { x })
                .collect();
            src.at(&j)
        };
        Nd::from_fn(&shape, |i| f(pick(self, i), pick(other, i)))
    }

    /// `[..., m, k] @ [..., k, n]`, or `[..., m, k] @ [k, n]` with the right side shared.
    pub fn matmul(&self, rhs: &Nd<f64>) -> Nd<f64> {
        let r = self.shape.len();
        let (m, k) = (self.shape[r - 2], self.shape[r - 1]);
        let n = rhs.shape[rhs.shape.len() - 1];
        let mut shape = self.shape[..r - 2].to_vec();
        shape.extend([m, n]);
        Nd::from_fn(&shape, |i| {
            let batch = &i[..r - 2];
            let (row, col) = (i[r - 2], i[r - 1]);
            (0..k)
                .map(|p| {
                    let mut ai = batch.to_vec();
                    ai.extend([row, p]);
                    let mut bi = if rhs.shape.len() == 2 {
                        vec![]
                    } else {
                        batch.to_vec()
                    };
                    bi.extend([p, col]);
                    self.at(&ai) * rhs.at(&bi)
                })
                .sum()
        })
    }

    /// `f` applied to each fiber along `axis`.
    pub fn reduce(&self, axis: usize, keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Nd<f64> {
        let mut kept = self.shape.clone();
        kept[axis] = 1;
        let out = Nd::from_fn(&kept, |i| {
            let fiber: Vec<f64> = (0..self.shape[axis])
                .map(|a| {
                    let mut j = i.to_vec();
                    j[axis] = a;
                    self.at(&j)
                })
                .collect();
            f(&fiber)
        });
        if keepdim {
            out
        } else {
            let mut shape = self.shape.clone();
            shape.remove(axis);
            out.reshape(&shape)
        }
    }

    /// `f` applied to each row of the last axis.
    pub fn map_rows(&self, f: impl Fn(&[f64]) -> Vec<f64>) -> Nd<f64> {
        let cols = *self.shape.last().expect("rank >= 1");
        let data = if cols == 0 {
            vec![]
        } else {
            self.data.chunks(cols).flat_map(f).collect()
        };
        Nd::new(&self.shape, data)
    }
}

/// `erf` in float64: Maclaurin series below 2.5 (terms stay below e^6.25, so the
/// alternating sum keeps ~13 digits), the erfc continued fraction above.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.5 {
        let x2 = a * a;
        let (mut term, mut sum) = (a, a);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-18 {
                break;
            }
        }
        sum * 2.0 / PI.sqrt()
    } else {
        // erfc(a) = e^{-a^2} / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...))))
        let mut f = a;
        for n in (1..=80).rev() {
            f = a + (n as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / PI.sqrt() / f
    };
    r.copysign(x)
}

pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

/// Element-wise check: `|got - want| <= TOL * max(1, |want|)`, i.e. relative error for
/// values of magnitude above 1 and absolute error below (where relative error of a value
/// that cancels to ~0 says nothing about the kernel). Non-finite values must match exactly.
pub fn assert_close(what: &str, shape: &[usize], got: &[f32], want: &Nd<f64>) {
    assert_eq!(shape, want.shape.as_slice(), "{what}: shape");
    assert_eq!(got.len(), want.data.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(&want.data).enumerate() {
        let g = g as f64;
        let ok = if w.is_finite() {
            (g - w).abs() <= TOL * w.abs().max(1.0)
        } else {
            g == w || (g.is_nan() && w.is_nan())
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// Norm-relative check for matmul: `||got - want||_2 <= TOL * max(1, ||want||_2)`. A dot
/// product's rounding error scales with `|a| |b|`, not with the result, so single elements
/// that cancel to ~0 would fail an element-wise relative test without any kernel bug.
pub fn assert_norm_close(what: &str, shape: &[usize], got: &[f32], want: &Nd<f64>) {
    assert_eq!(shape, want.shape.as_slice(), "{what}: shape");
    assert_eq!(got.len(), want.data.len(), "{what}: length");
    let diff: f64 = got
        .iter()
        .zip(&want.data)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want.data.iter().map(|w| w * w).sum::<f64>().sqrt();
    assert!(
        diff <= TOL * norm.max(1.0),
        "{what}: |got - want| = {diff}, |want| = {norm}"
    );
}

/// Norm-relative error `||got - want||_2 / ||want||_2` (infinite if `got` holds a NaN or an
/// infinity). The measure for half-precision results and fused ops, whose error is a
/// storage rounding of every element: it bounds the error over the whole output, where an
/// element-wise bound would fail on values that cancel to near zero.
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if !got.iter().all(|g| g.is_finite()) {
        return f64::INFINITY;
    }
    let e: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let n: f64 = want.iter().map(|w| w * w).sum();
    (e / n.max(1e-300)).sqrt()
}

/// The largest element error relative to the largest reference magnitude,
/// `max |got - want| / max |want|`: the measure for row-wise ops (normalizations, rotary
/// positions, gated activations) whose error scales with the row's magnitude.
pub fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

/// The largest element error, each measured against its own magnitude plus the mean
/// magnitude of `want`, so values near zero are not judged by an error relative to almost
/// nothing; NaN where both are NaN counts as equal. The measure of a GPU result against the
/// CPU backend's, both in f32.
#[cfg(feature = "cuda")]
pub fn rel_err_vs_mean(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if want.is_empty() {
        return 0.0;
    }
    let scale = want.iter().map(|v| v.abs()).sum::<f32>() / want.len() as f32;
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() || w.is_nan() {
                return if g.is_nan() && w.is_nan() {
                    0.0
                } else {
                    f32::INFINITY
                };
            }
            (g - w).abs() / (w.abs() + scale + f32::MIN_POSITIVE)
        })
        .fold(0.0, f32::max)
}

/// A tensor of any float dtype as `f32` values on the host.
pub fn f32s(t: &streampool::Tensor) -> Vec<f32> {
    t.to_dtype(streampool::DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

/// Runs the test `name` (its path in this binary: `module::test`) alone in a child process of
/// this test binary and fails if it fails there; in that child, runs `body`. For a test that
/// sets what a process has only one of (the size of the CPU backend's intra-op pool, the
/// wgpu profile's mode) or counts what the whole process holds (its threads): the other
/// tests of this binary run in parallel in this process.
pub fn in_own_process(name: &str, body: impl FnOnce()) {
    const CHILD: &str = "STREAMPOOL_TEST_CHILD";
    if std::env::var_os(CHILD).is_some_and(|v| v == name) {
        return body();
    }
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .output()
        .expect("start this test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{text}");
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "{name} in its own process: {}",
        out.status
    );
}
