//! The CPU backend's two levels of parallelism together: streams (one worker thread each)
//! and the intra-op pool they all share. Kernels here are large enough to go through the
//! pool; values are small integers, so every result is exact whatever order the pool's
//! pieces sum in, and a hazard shows up as a wrong number.
//!
//! Each test runs alone in a process of its own (`util::in_own_process`): it sizes the pool
//! to 3 threads (the pool is per process, sized before its first use), so that 64 callers on
//! 32 streams oversubscribe it many times over, and one test counts the process's threads.

use std::sync::{Arc, Barrier, Mutex, MutexGuard, Once};
use std::thread;
use std::time::Duration;

use streampool::{Device, DeviceConfig, StreamGuard, Tensor};

use crate::util::in_own_process;

const POOL: usize = 3;

/// Sizes the pool, and serializes the tests of one process: one of them counts the process's
/// threads, which the others' callers and stream workers would inflate.
fn init() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| streampool::set_cpu_threads(POOL).expect("first use of the pool"));
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn ints(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((i * 7 + seed * 13 + (i * seed) % 5) % 9) as f32 - 4.0)
        .collect()
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += x * b[p * n + j];
            }
        }
    }
    out
}

/// Runs `f` on another thread and fails the test if it has not finished in `limit`: a
/// deadlock between streams and the pool shows up as a failure, not a hung CI job.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = crossbeam_channel::bounded(1);
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("streams and the intra-op pool deadlocked (or a worker panicked)")
}

// Big enough for the pool: 96 x 128 x 80 = 983,040 multiply-adds, which the matmul cuts
// into a grid of tiles on the pool's threads (the element-wise ops after it are small and
// run on the stream's worker; the softmax and attention test below sends those through).
const M: usize = 96;
const K: usize = 128;
const N: usize = 80;

/// `relu(x @ w + bias) * 2 - 3`, checked exactly; returns the stream it ran on.
fn chain(dev: &Device, w: &Tensor, w_data: &[f32], bias: &[f32], seed: u64) -> usize {
    let x_data = ints(M * K, seed);
    let x = Tensor::from_vec(x_data.clone(), &[M, K], dev).unwrap();
    let b = Tensor::from_vec(bias.to_vec(), &[N], dev).unwrap();
    let y = x
        .matmul_bias(w, &b, Default::default())
        .unwrap()
        .relu()
        .unwrap()
        .affine(2.0, -3.0)
        .unwrap();
    let mut want = matmul_ref(&x_data, w_data, M, K, N);
    for (i, v) in want.iter_mut().enumerate() {
        *v = (*v + bias[i % N]).max(0.0) * 2.0 - 3.0;
    }
    assert_eq!(y.to_vec::<f32>().unwrap(), want, "seed {seed}");
    dev.current_stream().unwrap().index()
}

#[test]
fn the_pool_has_the_size_asked_for() {
    in_own_process("intra_op::the_pool_has_the_size_asked_for", || {
        let _serial = init();
        assert_eq!(streampool::cpu_threads(), POOL);
        // Asking again for the same size is fine; another size is an error, not a silent no-op.
        streampool::set_cpu_threads(POOL).unwrap();
        assert!(streampool::set_cpu_threads(POOL + 1).is_err());
        assert!(streampool::set_cpu_threads(0).is_err());
    });
}

#[test]
fn sixty_four_callers_share_one_pool_with_exact_results() {
    in_own_process(
        "intra_op::sixty_four_callers_share_one_pool_with_exact_results",
        || {
            let _serial = init();
            within(Duration::from_secs(300), || {
                let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
                let w_data = ints(K * N, 99);
                let bias: Vec<f32> = (0..N).map(|j| (j % 5) as f32 - 2.0).collect();
                let w = Tensor::from_vec(w_data.clone(), &[K, N], &dev).unwrap();
                const THREADS: usize = 64;
                let barrier = Arc::new(Barrier::new(THREADS + 1));
                let handles: Vec<_> = (0..THREADS as u64)
                    .map(|t| {
                        let (dev, w, w_data, bias, barrier) = (
                            dev.clone(),
                            w.clone(),
                            w_data.clone(),
                            bias.clone(),
                            barrier.clone(),
                        );
                        thread::spawn(move || {
                            let _ = dev.current_stream().unwrap();
                            // All at once past the barrier: `w`'s first products race to pack it
                            // into its slot (one packs, on the pool; the other streams wait for it).
                            barrier.wait();
                            // Everyone alive: count threads while the calls run.
                            for i in 0..6 {
                                chain(&dev, &w, &w_data, &bias, t * 10 + i);
                            }
                        })
                    })
                    .collect();
                barrier.wait();
                #[cfg(target_os = "linux")]
                {
                    // 64 callers, 32 stream workers, one pool of 3, the harness and this thread:
                    // not 64 pools. (A pool per caller would add 64 x 3.)
                    let threads = std::fs::read_to_string("/proc/self/status")
                        .unwrap()
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("Threads:")
                                .map(|n| n.trim().parse::<usize>())
                        })
                        .unwrap()
                        .unwrap();
                    assert!(
                        threads <= THREADS + 32 + POOL + 16,
                        "{threads} threads for 64 callers"
                    );
                }
                for h in handles {
                    h.join().unwrap();
                }
            });
        },
    );
}

#[test]
fn every_stream_waiting_on_pool_work_of_another_stream_completes() {
    in_own_process(
        "intra_op::every_stream_waiting_on_pool_work_of_another_stream_completes",
        || {
            let _serial = init();
            within(Duration::from_secs(300), || {
                let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
                let producer = dev.stream_at(1).unwrap();
                let a_data = ints(M * K, 5);
                let w_data = ints(K * N, 6);
                // The producer's large matmul sits behind a delay: every consumer stream is queued
                // waiting on it while the pool is busy with their own earlier work.
                let (y, done) = {
                    let _g = StreamGuard::new(&producer);
                    producer.debug_delay(Duration::from_millis(200)).unwrap();
                    let a = Tensor::from_vec(a_data.clone(), &[M, K], &dev).unwrap();
                    let w = Tensor::from_vec(w_data.clone(), &[K, N], &dev).unwrap();
                    (a.matmul(&w).unwrap(), producer.record_event().unwrap())
                };
                let want = matmul_ref(&a_data, &w_data, M, K, N);
                let consumers: Vec<_> = (2..32)
                    .map(|s| {
                        let (dev, y, done, want) =
                            (dev.clone(), y.clone(), done.clone(), want.clone());
                        thread::spawn(move || {
                            let stream = dev.stream_at(s).unwrap();
                            let _g = StreamGuard::new(&stream);
                            // Own pool work first, then the wait, then work on the producer's result.
                            let own = Tensor::from_vec(ints(M * K, s as u64), &[M, K], &dev)
                                .unwrap()
                                .matmul(&Tensor::from_vec(ints(K * N, 7), &[K, N], &dev).unwrap())
                                .unwrap();
                            stream.wait_event(&done).unwrap();
                            let z = y.affine(1.0, s as f32).unwrap().add(&own).unwrap();
                            let own_want =
                                matmul_ref(&ints(M * K, s as u64), &ints(K * N, 7), M, K, N);
                            let expect: Vec<f32> = want
                                .iter()
                                .zip(&own_want)
                                .map(|(y, o)| y + s as f32 + o)
                                .collect();
                            assert_eq!(z.to_vec::<f32>().unwrap(), expect, "stream {s}");
                        })
                    })
                    .collect();
                for c in consumers {
                    c.join().unwrap();
                }
            });
        },
    );
}

#[test]
fn large_attention_and_softmax_match_the_small_path() {
    in_own_process(
        "intra_op::large_attention_and_softmax_match_the_small_path",
        || {
            let _serial = init();
            // The same inputs through the pool (large) and, row by row, through calls too small
            // for it: the pieces must not change any value.
            let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
            let (rows, cols) = (512, 96);
            let data: Vec<f32> = ints(rows * cols, 3).iter().map(|v| v * 0.25).collect();
            let all = Tensor::from_vec(data.clone(), &[rows, cols], &dev)
                .unwrap()
                .softmax()
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for r in (0..rows).step_by(37) {
                let one =
                    Tensor::from_vec(data[r * cols..(r + 1) * cols].to_vec(), &[1, cols], &dev)
                        .unwrap()
                        .softmax()
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                assert_eq!(one, all[r * cols..(r + 1) * cols], "row {r}");
            }
            // Fused attention: 8 sequences x 4 heads x 64 tokens goes to the pool; one sequence
            // alone (smaller) must give the same rows.
            let (batch, seq, heads, d) = (8, 64, 4, 16);
            let qkv: Vec<f32> = ints(batch * seq * 3 * heads * d, 4)
                .iter()
                .map(|v| v * 0.125)
                .collect();
            let mask: Vec<f32> = (0..batch * seq)
                .map(|i| f32::from(i % seq < seq - (i / seq) * 5))
                .collect();
            let run = |b0: usize, nb: usize| {
                let width = seq * 3 * heads * d;
                let x = Tensor::from_vec(
                    qkv[b0 * width..(b0 + nb) * width].to_vec(),
                    &[nb, seq, 3 * heads * d],
                    &dev,
                )
                .unwrap();
                let m =
                    Tensor::from_vec(mask[b0 * seq..(b0 + nb) * seq].to_vec(), &[nb, seq], &dev)
                        .unwrap();
                x.attention(Some(&m), heads)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
            };
            let all = run(0, batch);
            let per = seq * heads * d;
            for b in 0..batch {
                assert_eq!(run(b, 1), all[b * per..(b + 1) * per], "sequence {b}");
            }
        },
    );
}

#[test]
fn split_matmul_with_bias_and_activation_matches_the_separate_kernels() {
    in_own_process(
        "intra_op::split_matmul_with_bias_and_activation_matches_the_separate_kernels",
        || {
            let _serial = init();
            // Large enough to be cut into tiles, each writing its block's bias and activation: the
            // fused result must equal the product followed by the bias-and-activation kernel.
            use streampool::{Activation, MatmulMath};
            let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
            let (m, k, n) = (192, 128, 160);
            let x = Tensor::from_vec(
                ints(m * k, 11).iter().map(|v| v * 0.125).collect(),
                &[m, k],
                &dev,
            )
            .unwrap();
            let w = Tensor::from_vec(
                ints(k * n, 12).iter().map(|v| v * 0.0625).collect(),
                &[k, n],
                &dev,
            )
            .unwrap();
            let b = Tensor::from_vec(ints(n, 13), &[n], &dev).unwrap();
            for act in [
                Activation::Identity,
                Activation::Relu,
                Activation::Gelu,
                Activation::GeluTanh,
            ] {
                let fused = x
                    .matmul_bias_act(&w, &b, act, MatmulMath::Exact)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let separate = x
                    .matmul(&w)
                    .unwrap()
                    .bias_act(&b, act)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                assert_eq!(fused.len(), m * n);
                for (i, (f, s)) in fused.iter().zip(&separate).enumerate() {
                    assert!(
                        (f - s).abs() <= 1e-6 * s.abs().max(1.0),
                        "{act:?} [{i}]: {f} vs {s}"
                    );
                }
            }
        },
    );
}
