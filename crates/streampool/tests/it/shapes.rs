//! Property tests of broadcasting, reshapes, transposes and shape errors: random shapes of
//! rank 0-4 with dims 1-5 (1s are drawn often, to trigger broadcasting) against a NumPy-rule
//! reference and float64 results (tolerance as in `util`).

use crate::util::{assert_close, assert_norm_close, numpy_broadcast, Nd, Rng};
use proptest::prelude::*;
use streampool::tensor::broadcast_shapes;
use streampool::{Device, Error, Tensor};

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), 1..=5usize]
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=4)
}

/// Two shapes that broadcast together: suffixes of one target with some dims set to 1.
fn compatible_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape().prop_flat_map(|target| {
        let r = target.len();
        (
            Just(target),
            0..=r,
            0..=r,
            prop::collection::vec(any::<bool>(), r),
            prop::collection::vec(any::<bool>(), r),
        )
            .prop_map(|(t, ra, rb, ones_a, ones_b)| {
                let pick = |rank: usize, ones: &[bool]| {
                    (t.len() - rank..t.len())
                        .map(|i| if ones[i] { 1 } else { t[i] })
                        .collect::<Vec<_>>()
                };
                (pick(ra, &ones_a), pick(rb, &ones_b))
            })
    })
}

/// Two shapes that do not broadcast: a compatible pair with one aligned dim set to two
/// different sizes above 1.
fn incompatible_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        compatible_pair(),
        2..=5usize,
        1..=3usize,
        any::<prop::sample::Index>(),
    )
        .prop_map(|((mut a, mut b), x, delta, at)| {
            if a.is_empty() {
                a.push(1);
            }
            if b.is_empty() {
                b.push(1);
            }
            let common = a.len().min(b.len());
            let back = at.index(common) + 1; // position from the end, shared by both
            let (ia, ib) = (a.len() - back, b.len() - back);
            a[ia] = x;
            b[ib] = x + delta;
            (a, b)
        })
}

fn rand_tensor(shape: &[usize], seed: u64) -> (Tensor, Nd<f64>) {
    let data = Rng::new(seed).normals(shape.iter().product());
    let r = Nd::from_f32(shape, &data);
    (Tensor::from_vec(data, shape, &Device::cpu()).unwrap(), r)
}

/// A random tensor of `shape`: for rank >= 2 a transposed view of storage with the first
/// and last dims swapped, else a plain tensor.
fn transposed_view(shape: &[usize], seed: u64) -> (Tensor, Nd<f64>) {
    let r = shape.len();
    if r < 2 {
        return rand_tensor(shape, seed);
    }
    let mut stored = shape.to_vec();
    stored.swap(0, r - 1);
    let (x, xr) = rand_tensor(&stored, seed);
    (x.transpose(0, r - 1).unwrap(), xr.transpose(0, r - 1))
}

fn is_shape_err<T>(r: &streampool::Result<T>) -> bool {
    matches!(r, Err(Error::Shape { .. }))
}

/// A random factorization of `n` into `rank` dims (rank 0 only when `n == 1`).
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the MSRV is 1.80
fn factorize(mut n: usize, rank: usize, rng: &mut Rng) -> Vec<usize> {
    let rank = if n == 1 { rank } else { rank.max(1) };
    let mut dims = vec![1; rank];
    let mut p = 2;
    while n > 1 {
        while n % p == 0 {
            n /= p;
            let i = rng.below(rank);
            dims[i] *= p;
        }
        p += 1;
    }
    dims
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn broadcast_shapes_follows_numpy_rules(a in shape(), b in shape()) {
        match (broadcast_shapes("add", &a, &b), numpy_broadcast(&a, &b)) {
            (Ok(got), Some(want)) => prop_assert_eq!(got.to_vec(), want),
            (Err(Error::Shape { op: "add", .. }), None) => {}
            (got, want) => prop_assert!(false, "{a:?} {b:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn broadcast_shapes_of_compatible_pairs((a, b) in compatible_pair()) {
        let want = numpy_broadcast(&a, &b).unwrap();
        prop_assert_eq!(broadcast_shapes("add", &a, &b).unwrap().to_vec(), want.clone());
        prop_assert_eq!(broadcast_shapes("add", &b, &a).unwrap().to_vec(), want);
    }

    #[test]
    fn add_broadcasts_like_the_reference((a, b) in compatible_pair(), seed in any::<u64>()) {
        let (x, xr) = rand_tensor(&a, seed);
        let (y, yr) = rand_tensor(&b, seed ^ 1);
        let got = x.add(&y).unwrap();
        assert_close("add", got.dims(), &got.to_vec::<f32>().unwrap(), &xr.zip(&yr, |p, q| p + q));
        let got = y.mul(&x).unwrap();
        assert_close("mul", got.dims(), &got.to_vec::<f32>().unwrap(), &yr.zip(&xr, |p, q| p * q));
    }

    #[test]
    fn add_broadcasts_transposed_operands((a, b) in compatible_pair(), seed in any::<u64>()) {
        // The same pair, with each operand of rank >= 2 stored with its outer and inner dims
        // swapped and read through a transposed view.
        let (x, xr) = transposed_view(&a, seed);
        let (y, yr) = transposed_view(&b, seed ^ 2);
        let got = x.sub(&y).unwrap();
        let want = xr.zip(&yr, |p, q| p - q);
        assert_close("sub", got.dims(), &got.to_vec::<f32>().unwrap(), &want);
    }

    #[test]
    fn incompatible_shapes_are_shape_errors((a, b) in incompatible_pair()) {
        prop_assert!(numpy_broadcast(&a, &b).is_none(), "{a:?} {b:?}");
        let dev = Device::cpu();
        let (x, y) = (Tensor::zeros(&a, &dev).unwrap(), Tensor::zeros(&b, &dev).unwrap());
        for r in [x.add(&y), y.add(&x), x.sub(&y), x.mul(&y), x.div(&y), x.maximum(&y)] {
            prop_assert!(matches!(r, Err(Error::Shape { .. })), "{a:?} {b:?}: {r:?}");
        }
        prop_assert!(is_shape_err(&broadcast_shapes("x", &a, &b)));
    }

    #[test]
    fn any_pair_is_ok_or_a_shape_error(a in shape(), b in shape()) {
        let dev = Device::cpu();
        let (x, y) = (Tensor::ones(&a, &dev).unwrap(), Tensor::ones(&b, &dev).unwrap());
        match (x.maximum(&y), numpy_broadcast(&a, &b)) {
            (Ok(t), Some(s)) => {
                prop_assert_eq!(t.dims(), s.as_slice());
                prop_assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
            }
            (Err(Error::Shape { .. }), None) => {}
            (got, want) => prop_assert!(false, "{a:?} {b:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn reshape_to_any_factorization_preserves_data(
        s in shape(), rank in 0..=4usize, seed in any::<u64>(), transposed in any::<bool>()
    ) {
        let (x, xr) = rand_tensor(&s, seed);
        // Reshaping a transposed view must read it in logical (row-major) order.
        let (x, xr) = if transposed && s.len() >= 2 {
            (x.t().unwrap(), xr.transpose(s.len() - 2, s.len() - 1))
        } else {
            (x, xr)
        };
        let target = factorize(s.iter().product(), rank, &mut Rng::new(seed));
        let y = x.reshape(&target).unwrap();
        prop_assert_eq!(y.dims(), target.as_slice());
        prop_assert_eq!(y.shares_storage(&x), x.is_contiguous());
        let got: Vec<f64> = y.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        prop_assert_eq!(got, xr.data);
        // And back.
        let z = y.reshape(x.dims()).unwrap();
        prop_assert_eq!(z.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    }

    #[test]
    fn reshape_to_a_wrong_count_is_a_shape_error(s in shape(), t in shape()) {
        let n: usize = s.iter().product();
        prop_assume!(t.iter().product::<usize>() != n);
        let x = Tensor::zeros(&s, &Device::cpu()).unwrap();
        prop_assert!(is_shape_err(&x.reshape(&t)), "{s:?} -> {t:?}");
    }

    #[test]
    fn transpose_twice_is_identity(
        s in prop::collection::vec(dim(), 1..=4), i in any::<prop::sample::Index>(),
        j in any::<prop::sample::Index>(), seed in any::<u64>()
    ) {
        let (d0, d1) = (i.index(s.len()), j.index(s.len()));
        let (x, xr) = rand_tensor(&s, seed);
        let t = x.transpose(d0, d1).unwrap();
        let tr = xr.transpose(d0, d1);
        prop_assert_eq!(t.dims(), tr.shape.as_slice());
        let got: Vec<f64> = t.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        prop_assert_eq!(got, tr.data);
        let back = t.transpose(d0, d1).unwrap();
        prop_assert_eq!(back.layout(), x.layout());
        prop_assert_eq!(back.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        prop_assert!(is_shape_err(&x.transpose(s.len(), d0)));
    }

    #[test]
    fn ops_on_random_views_match_the_reference(
        base in prop::collection::vec(dim(), 1..=4),
        swaps in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..3),
        cut in (any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        axis in any::<prop::sample::Index>(), keepdim in any::<bool>(), seed in any::<u64>()
    ) {
        let (mut x, mut xr) = rand_tensor(&base, seed);
        let r = base.len();
        for (i, j) in swaps {
            let (d0, d1) = (i.index(r), j.index(r));
            x = x.transpose(d0, d1).unwrap();
            xr = xr.transpose(d0, d1);
        }
        let ax = cut.0.index(r);
        let extent = x.dims()[ax];
        let start = cut.1.index(extent);
        let len = 1 + cut.2.index(extent - start);
        let (x, xr) = (x.narrow(ax, start, len).unwrap(), xr.narrow(ax, start, len));
        let read = |t: &Tensor| t.to_vec::<f32>().unwrap();
        let c = x.contiguous().unwrap();
        prop_assert!(c.is_contiguous());
        assert_close("contiguous", c.dims(), &read(&c), &xr);
        let axis = axis.index(r);
        let s = x.sum(axis, keepdim).unwrap();
        assert_close("sum", s.dims(), &read(&s), &xr.reduce(axis, keepdim, |v| v.iter().sum()));
        let m = x.max(axis, keepdim).unwrap();
        let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_close("max", m.dims(), &read(&m), &xr.reduce(axis, keepdim, max));
        let e = x.exp().unwrap();
        assert_close("exp", e.dims(), &read(&e), &xr.map(f64::exp));
        let sm = x.softmax().unwrap();
        let softmax = |row: &[f64]| {
            let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            row.iter().map(|v| (v - mx).exp() / z).collect()
        };
        assert_close("softmax", sm.dims(), &read(&sm), &xr.map_rows(softmax));
    }

    #[test]
    fn matmul_of_random_views_matches_the_reference(
        base in prop::collection::vec(dim(), 2..=4),
        swaps in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..3),
        cut in (any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        n in dim(), shared_rhs in any::<bool>(), rhs_t in any::<bool>(), seed in any::<u64>()
    ) {
        // The left operand: a random tensor seen through random transposes and a narrow, so
        // every stride pattern mat_operand must accept (or copy) turns up.
        let (x, xr) = rand_tensor(&base, seed);
        let (mut a, mut ar) = (x, xr);
        let r = base.len();
        for (i, j) in swaps {
            let (d0, d1) = (i.index(r), j.index(r));
            a = a.transpose(d0, d1).unwrap();
            ar = ar.transpose(d0, d1);
        }
        let axis = cut.0.index(r);
        let extent = a.dims()[axis];
        let start = cut.1.index(extent);
        let len = 1 + cut.2.index(extent - start);
        let a = a.narrow(axis, start, len).unwrap();
        let ar = ar.narrow(axis, start, len);
        let dims = a.dims().to_vec();
        let k = dims[r - 1];
        // The right operand: [batch.., k, n] or a shared [k, n], optionally a transposed view.
        let mut sb = if shared_rhs { vec![] } else { dims[..r - 2].to_vec() };
        if rhs_t { sb.extend([n, k]) } else { sb.extend([k, n]) }
        let (b, br) = rand_tensor(&sb, seed ^ 4);
        let (b, br) = if rhs_t {
            let rb = sb.len();
            (b.t().unwrap(), br.transpose(rb - 2, rb - 1))
        } else {
            (b, br)
        };
        let c = a.matmul(&b).unwrap();
        assert_norm_close("matmul views", c.dims(), &c.to_vec::<f32>().unwrap(), &ar.matmul(&br));
    }

    #[test]
    fn matmul_checks_inner_and_batch_dims(
        batch in prop::collection::vec(dim(), 0..=2), m in dim(), k in dim(), n in dim(),
        k2 in dim(), shared_rhs in any::<bool>(), seed in any::<u64>()
    ) {
        let mut sa = batch.clone();
        sa.extend([m, k]);
        let mut sb = if shared_rhs { vec![] } else { batch.clone() };
        sb.extend([k2, n]);
        let (a, ar) = rand_tensor(&sa, seed);
        let (b, br) = rand_tensor(&sb, seed ^ 3);
        match a.matmul(&b) {
            Ok(c) => {
                prop_assert_eq!(k, k2);
                assert_norm_close("matmul", c.dims(), &c.to_vec::<f32>().unwrap(), &ar.matmul(&br));
            }
            Err(Error::Shape { op: "matmul", .. }) => prop_assert_ne!(k, k2),
            Err(e) => prop_assert!(false, "{sa:?} @ {sb:?}: {e}"),
        }
        // A batch mismatch is an error too (never broadcast silently).
        if !batch.is_empty() {
            let mut sc = batch.clone();
            sc[0] += 1;
            sc.extend([k, n]);
            let c = Tensor::zeros(&sc, &Device::cpu()).unwrap();
            prop_assert!(is_shape_err(&a.matmul(&c)), "{sa:?} @ {sc:?}");
        }
    }
}
