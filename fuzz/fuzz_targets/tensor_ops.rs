//! Arbitrary small tensor programs on the CPU device: tensors from data whose length may not
//! fill the shape, then a sequence of ops with arbitrary operands and arguments (axes, ranges,
//! eps, ids, target shapes). Every call must return `Ok` or `Err`, never panic; a result that
//! is `Ok` must also read back as many elements as its shape holds.
//!
//! Sizes stay bounded (rank <= 4, small dims <= 8, results over [`MAX_ELEMS`] dropped) so one
//! run takes microseconds; "huge" dims appear only where no allocation of that size happens
//! before the shape is checked (reshape targets, `from_vec` shapes, narrow ranges).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use streampool::{Activation, Device, Tensor};

/// Results larger than this are not kept as operands (keeps later ops cheap).
const MAX_ELEMS: usize = 4096;
const MAX_OPS: usize = 24;
const MAX_TENSORS: usize = 16;

/// A dimension: usually 0..=8, sometimes anything (overflow checks).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dim {
    Small(u8),
    Huge(usize),
}

impl Dim {
    fn small(self) -> usize {
        match self {
            Dim::Small(d) => (d % 9) as usize,
            Dim::Huge(d) => d % 9,
        }
    }
    fn any(self) -> usize {
        match self {
            Dim::Small(d) => (d % 9) as usize,
            Dim::Huge(d) => d,
        }
    }
}

fn small_shape(dims: &[Dim]) -> Vec<usize> {
    dims.iter().take(4).map(|d| d.small()).collect()
}
fn any_shape(dims: &[Dim]) -> Vec<usize> {
    dims.iter().take(4).map(|d| d.any()).collect()
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    F32,
    I64,
    F16,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A new tensor from `elems(shape) + delta` values (so the length may not match).
    FromVec {
        shape: Vec<Dim>,
        delta: i8,
        kind: Kind,
        seed: u8,
    },
    /// `Tensor::full` with a small shape.
    Full {
        shape: Vec<Dim>,
        value: f32,
    },
    Reshape {
        x: u8,
        shape: Vec<Dim>,
    },
    Transpose {
        x: u8,
        d0: u8,
        d1: u8,
    },
    T {
        x: u8,
    },
    Narrow {
        x: u8,
        axis: u8,
        start: Dim,
        len: Dim,
    },
    Matmul {
        a: u8,
        b: u8,
    },
    Add {
        a: u8,
        b: u8,
    },
    Sub {
        a: u8,
        b: u8,
    },
    Mul {
        a: u8,
        b: u8,
    },
    Div {
        a: u8,
        b: u8,
    },
    Maximum {
        a: u8,
        b: u8,
    },
    Unary {
        x: u8,
        which: u8,
    },
    Affine {
        x: u8,
        mul: f32,
        add: f32,
    },
    Softmax {
        x: u8,
    },
    LayerNorm {
        x: u8,
        gamma: u8,
        beta: u8,
        eps: f32,
    },
    AddLayerNorm {
        x: u8,
        r: u8,
        gamma: u8,
        beta: u8,
        eps: f32,
    },
    BiasAct {
        x: u8,
        bias: u8,
        act: u8,
    },
    Sum {
        x: u8,
        axis: u8,
        keepdim: bool,
    },
    Mean {
        x: u8,
        axis: u8,
        keepdim: bool,
    },
    Max {
        x: u8,
        axis: u8,
        keepdim: bool,
    },
    IndexSelect {
        table: u8,
        ids: u8,
    },
    Embedding {
        table: u8,
        ids: Vec<i64>,
        shape: Vec<Dim>,
    },
    Contiguous {
        x: u8,
    },
    ToVec {
        x: u8,
    },
    ToScalar {
        x: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Program {
    ops: Vec<Op>,
}

/// The operand pool; picking from an empty pool skips the op.
struct Pool(Vec<Tensor>);

impl Pool {
    fn get(&self, i: u8) -> Option<&Tensor> {
        if self.0.is_empty() {
            None
        } else {
            Some(&self.0[i as usize % self.0.len()])
        }
    }

    /// Keeps `Ok` results as operands (bounded) after checking they read back whole.
    fn keep(&mut self, r: streampool::Result<Tensor>) {
        let Ok(t) = r else { return };
        check_readback(&t);
        if t.elem_count() <= MAX_ELEMS && self.0.len() < MAX_TENSORS {
            self.0.push(t);
        }
    }
}

fn check_readback(t: &Tensor) {
    if t.elem_count() > MAX_ELEMS {
        return;
    }
    let n = match t.dtype() {
        streampool::DType::F32 => t.to_vec::<f32>().map(|v| v.len()),
        streampool::DType::I64 => t.to_vec::<i64>().map(|v| v.len()),
        streampool::DType::F16 => t.to_vec::<half::f16>().map(|v| v.len()),
        streampool::DType::BF16 => t.to_vec::<half::bf16>().map(|v| v.len()),
    };
    if let Ok(n) = n {
        assert_eq!(n, t.elem_count(), "read back {n} of {:?}", t.dims());
    }
}

fn values(n: usize, seed: u8) -> impl Iterator<Item = i64> {
    (0..n as i64).map(move |i| (i * 7 + seed as i64) % 11 - 3)
}

fuzz_target!(|prog: Program| {
    let dev = Device::cpu();
    let mut pool = Pool(Vec::new());
    for op in prog.ops.into_iter().take(MAX_OPS) {
        match op {
            Op::FromVec {
                shape,
                delta,
                kind,
                seed,
            } => {
                let shape = any_shape(&shape);
                // Fill the product when it is small, else a few values: the length check must
                // reject the mismatch (or the overflow) before anything is allocated.
                let n = shape
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .filter(|&n| n <= MAX_ELEMS)
                    .unwrap_or(3);
                let n = (n as i64 + delta as i64).clamp(0, MAX_ELEMS as i64) as usize;
                let r = match kind {
                    Kind::F32 => {
                        let v: Vec<f32> = values(n, seed).map(|x| x as f32 / 4.0).collect();
                        Tensor::from_vec(v, &shape, &dev)
                    }
                    Kind::I64 => Tensor::from_vec(values(n, seed).collect(), &shape, &dev),
                    Kind::F16 => {
                        let v = values(n, seed).map(|x| half::f16::from_f32(x as f32));
                        Tensor::from_vec(v.collect(), &shape, &dev)
                    }
                };
                pool.keep(r);
            }
            Op::Full { shape, value } => pool.keep(Tensor::full(value, &small_shape(&shape), &dev)),
            Op::Reshape { x, shape } => {
                if let Some(t) = pool.get(x) {
                    let r = t.reshape(&any_shape(&shape));
                    pool.keep(r);
                }
            }
            Op::Transpose { x, d0, d1 } => {
                if let Some(t) = pool.get(x) {
                    let r = t.transpose(d0 as usize, d1 as usize);
                    pool.keep(r);
                }
            }
            Op::T { x } => {
                if let Some(t) = pool.get(x) {
                    let r = t.t();
                    pool.keep(r);
                }
            }
            Op::Narrow {
                x,
                axis,
                start,
                len,
            } => {
                if let Some(t) = pool.get(x) {
                    let r = t.narrow(axis as usize, start.any(), len.any());
                    pool.keep(r);
                }
            }
            Op::Matmul { a, b }
            | Op::Add { a, b }
            | Op::Sub { a, b }
            | Op::Mul { a, b }
            | Op::Div { a, b }
            | Op::Maximum { a, b } => {
                let (Some(ta), Some(tb)) = (pool.get(a).cloned(), pool.get(b).cloned()) else {
                    continue;
                };
                let r = match op {
                    Op::Matmul { .. } => ta.matmul(&tb),
                    Op::Add { .. } => ta.add(&tb),
                    Op::Sub { .. } => ta.sub(&tb),
                    Op::Mul { .. } => ta.mul(&tb),
                    Op::Div { .. } => ta.div(&tb),
                    _ => ta.maximum(&tb),
                };
                pool.keep(r);
            }
            Op::Unary { x, which } => {
                if let Some(t) = pool.get(x) {
                    let r = match which % 8 {
                        0 => t.relu(),
                        1 => t.gelu(),
                        2 => t.tanh(),
                        3 => t.exp(),
                        4 => t.sqrt(),
                        5 => t.sqr(),
                        6 => t.neg(),
                        _ => t.recip(),
                    };
                    pool.keep(r);
                }
            }
            Op::Affine { x, mul, add } => {
                if let Some(t) = pool.get(x) {
                    let r = t.affine(mul, add);
                    pool.keep(r);
                }
            }
            Op::Softmax { x } => {
                if let Some(t) = pool.get(x) {
                    let r = t.softmax();
                    pool.keep(r);
                }
            }
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            } => {
                if let (Some(t), Some(g), Some(b)) = (pool.get(x), pool.get(gamma), pool.get(beta))
                {
                    let r = t.layer_norm(g, b, eps);
                    pool.keep(r);
                }
            }
            Op::AddLayerNorm {
                x,
                r,
                gamma,
                beta,
                eps,
            } => {
                if let (Some(t), Some(res), Some(g), Some(b)) =
                    (pool.get(x), pool.get(r), pool.get(gamma), pool.get(beta))
                {
                    let out = t.add_layer_norm(res, g, b, eps);
                    pool.keep(out);
                }
            }
            Op::BiasAct { x, bias, act } => {
                if let (Some(t), Some(b)) = (pool.get(x), pool.get(bias)) {
                    let act = match act % 3 {
                        0 => Activation::Identity,
                        1 => Activation::Relu,
                        _ => Activation::Gelu,
                    };
                    let r = t.bias_act(b, act);
                    pool.keep(r);
                }
            }
            Op::Sum { x, axis, keepdim } => {
                if let Some(t) = pool.get(x) {
                    let r = t.sum(axis as usize, keepdim);
                    pool.keep(r);
                }
            }
            Op::Mean { x, axis, keepdim } => {
                if let Some(t) = pool.get(x) {
                    let r = t.mean(axis as usize, keepdim);
                    pool.keep(r);
                }
            }
            Op::Max { x, axis, keepdim } => {
                if let Some(t) = pool.get(x) {
                    let r = t.max(axis as usize, keepdim);
                    pool.keep(r);
                }
            }
            Op::IndexSelect { table, ids } => {
                if let (Some(t), Some(i)) = (pool.get(table), pool.get(ids)) {
                    let r = t.index_select(i);
                    pool.keep(r);
                }
            }
            Op::Embedding { table, ids, shape } => {
                if let Some(t) = pool.get(table) {
                    let ids: Vec<i64> = ids.into_iter().take(MAX_ELEMS).collect();
                    let r = t.embedding(&ids, &any_shape(&shape));
                    pool.keep(r);
                }
            }
            Op::Contiguous { x } => {
                if let Some(t) = pool.get(x) {
                    let r = t.contiguous();
                    pool.keep(r);
                }
            }
            Op::ToVec { x } => {
                if let Some(t) = pool.get(x) {
                    check_readback(t);
                    // The wrong element type is an error, not a reinterpretation.
                    if t.dtype() != streampool::DType::I64 {
                        assert!(t.to_vec::<i64>().is_err());
                    }
                }
            }
            Op::ToScalar { x } => {
                if let Some(t) = pool.get(x) {
                    let _ = t.to_scalar();
                }
            }
        }
    }
});
