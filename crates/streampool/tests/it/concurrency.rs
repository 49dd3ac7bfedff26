//! Concurrency tests: many threads, one device, right answers.
//!
//! Every test checks values against a host reference computed from small integers, so
//! results are exact and any cross-stream hazard (a read before its write, a block reused
//! while still read) shows up as a wrong number rather than a flaky tolerance. Tests that
//! need deterministic pool state (slot numbers, stream counts) use their own device from
//! `super::device_with`; the rest share the process-wide device, as users would.
//!
//! A shared suite: it runs on the CPU backend and again under `wgpu` on a wgpu device; the
//! parent module supplies the device (`super::device_under_test`, `super::device_with`).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use streampool::{Device, DeviceConfig, Error, Event, Stream, StreamGuard, Tensor};

/// Small integers as `f32`, different for every `seed`: sums of their products stay exact.
fn ints(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((i * 7 + seed * 13 + (i * seed) % 5) % 17) as f32 - 8.0)
        .collect()
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

/// A fresh device with the default configuration (its own pool and counters).
fn fresh_device() -> Device {
    super::device_with(DeviceConfig::default()).unwrap()
}

const M: usize = 8;
const K: usize = 16;
const N: usize = 8;

/// The shared weights of [`check_chain`].
struct Weights {
    w: Tensor,
    w_data: Vec<f32>,
    bias: Tensor,
    bias_data: Vec<f32>,
}

impl Weights {
    fn new(dev: &Device) -> Self {
        let w_data = ints(K * N, 1000);
        let bias_data = ints(N, 2000);
        Self {
            w: Tensor::from_vec(w_data.clone(), &[K, N], dev).unwrap(),
            w_data,
            bias: Tensor::from_vec(bias_data.clone(), &[N], dev).unwrap(),
            bias_data,
        }
    }
}

/// Runs `relu((x @ w + bias) * 0.5 + 1)` and its row sums on the calling thread's current
/// stream and checks both against the host reference. Returns the stream used.
fn check_chain(dev: &Device, wts: &Weights, seed: u64) -> Stream {
    let x_data = ints(M * K, seed);
    let x = Tensor::from_vec(x_data.clone(), &[M, K], dev).unwrap();
    let y = x
        .matmul(&wts.w)
        .unwrap()
        .add(&wts.bias)
        .unwrap()
        .affine(0.5, 1.0)
        .unwrap()
        .relu()
        .unwrap();
    let rows = y.sum(1, false).unwrap();

    let mut expect = matmul_ref(&x_data, &wts.w_data, M, K, N);
    for (i, v) in expect.iter_mut().enumerate() {
        *v = ((*v + wts.bias_data[i % N]) * 0.5 + 1.0).max(0.0);
    }
    let expect_rows: Vec<f32> = expect.chunks(N).map(|r| r.iter().sum()).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), expect, "seed {seed}");
    assert_eq!(rows.to_vec::<f32>().unwrap(), expect_rows, "seed {seed}");
    dev.current_stream().unwrap()
}

#[test]
fn parallel_basic_ops_from_two_threads() {
    let dev = super::device_under_test();
    let wts = Weights::new(&dev);
    thread::scope(|sc| {
        for t in 0..2u64 {
            let (dev, wts) = (&dev, &wts);
            sc.spawn(move || {
                for i in 0..300 {
                    check_chain(dev, wts, t * 10_000 + i);
                }
            });
        }
    });
}

#[test]
fn four_threads_through_a_fixed_pool() {
    let dev = super::device_under_test();
    let wts = Arc::new(Weights::new(&dev));
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<u64>();
    let (res_tx, res_rx) = crossbeam_channel::unbounded::<(u64, usize, Stream)>();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (dev, wts, job_rx, res_tx) =
                (dev.clone(), wts.clone(), job_rx.clone(), res_tx.clone());
            thread::spawn(move || {
                for seed in job_rx {
                    let stream = check_chain(&dev, &wts, seed);
                    res_tx.send((seed, w, stream)).unwrap();
                }
            })
        })
        .collect();
    drop(res_tx);
    const JOBS: u64 = 400;
    for seed in 0..JOBS {
        job_tx.send(seed).unwrap();
    }
    drop(job_tx);
    for w in workers {
        w.join().unwrap();
    }

    let results: Vec<_> = res_rx.iter().collect();
    let seeds: HashSet<u64> = results.iter().map(|r| r.0).collect();
    assert_eq!(results.len() as u64, JOBS, "every job reported once");
    assert_eq!(seeds.len() as u64, JOBS);
    // A pool thread keeps its stream for life (thread-local caching).
    let mut per_worker: BTreeMap<usize, HashSet<usize>> = BTreeMap::new();
    for (_, w, s) in &results {
        per_worker.entry(*w).or_default().insert(s.index());
    }
    for (w, streams) in per_worker {
        assert_eq!(streams.len(), 1, "worker {w} used streams {streams:?}");
    }
}

#[test]
fn thread_churn_one_thousand_short_lived_threads() {
    let dev = super::device_under_test();
    let wts = Weights::new(&dev);
    let mut done = 0;
    // Waves of 50 live threads: 1,000 threads in all, each created, used and gone.
    for wave in 0..20u64 {
        thread::scope(|sc| {
            let handles: Vec<_> = (0..50u64)
                .map(|i| {
                    let (dev, wts) = (&dev, &wts);
                    sc.spawn(move || {
                        let seed = 50_000 + wave * 50 + i;
                        let s = check_chain(dev, wts, seed);
                        assert!((1..dev.pool_size()).contains(&s.index()));
                        // A second, dependent op on the same thread: reads the first result.
                        let x = Tensor::full(seed as f32, &[4], dev).unwrap();
                        let y = x.affine(2.0, 0.0).unwrap().add(&x).unwrap();
                        assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0 * seed as f32; 4]);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
                done += 1;
            }
        });
    }
    assert_eq!(done, 1000);
}

/// A tensor produced on a stream that is still busy is handed to other threads (other
/// streams) which use it at once: each consumer's stream must wait for the producer's write.
#[test]
fn tensor_from_busy_producer_stream_is_read_correctly_on_other_threads() {
    let dev = fresh_device();
    let data = ints(1024, 7);
    let (tx, rx) = crossbeam_channel::unbounded::<(Tensor, Tensor, Event)>();
    let producer_stream = {
        let (dev, data) = (dev.clone(), data.clone());
        thread::spawn(move || {
            let s = dev.current_stream().unwrap();
            // Everything below is queued behind this delay: the values do not exist yet
            // when the consumers start.
            s.debug_delay(Duration::from_millis(400)).unwrap();
            let x = Tensor::from_vec(data, &[32, 32], &dev).unwrap();
            let y = x.affine(3.0, -1.0).unwrap();
            let written = s.record_event().unwrap();
            for _ in 0..3 {
                tx.send((x.clone(), y.clone(), written.clone())).unwrap();
            }
            // The producer lets go at once: the consumers hold the only references.
            s
        })
        .join()
        .unwrap()
    };
    let consumers: Vec<_> = (0..3)
        .map(|c| {
            let (dev, rx, data) = (dev.clone(), rx.clone(), data.clone());
            thread::spawn(move || {
                let (x, y, written) = rx.recv().unwrap();
                let mine = dev.current_stream().unwrap();
                assert_ne!(mine.index(), 1, "consumer {c} shares the producer's stream");
                // Precondition of the test, not a timing claim about the runtime: with a
                // 400 ms delay queued, the producer's work has not run yet.
                assert!(
                    !written.query(),
                    "producer stream already idle; delay too short"
                );
                let z = y.add(&x).unwrap().scale(c as f32 + 1.0).unwrap();
                let expect: Vec<f32> = data
                    .iter()
                    .map(|v| (4.0 * v - 1.0) * (c as f32 + 1.0))
                    .collect();
                assert_eq!(z.to_vec::<f32>().unwrap(), expect, "consumer {c}");
                assert_eq!(y.to_vec::<f32>().unwrap()[5], 3.0 * data[5] - 1.0);
            })
        })
        .collect();
    for c in consumers {
        c.join().unwrap();
    }
    assert_eq!(producer_stream.index(), 1);
}

#[test]
fn sixty_four_threads_share_a_thirty_two_stream_pool() {
    let dev = fresh_device();
    let wts = Weights::new_on_default_stream(&dev);
    const THREADS: usize = 64;
    let barrier = Barrier::new(THREADS);
    let slots: Vec<usize> = thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (dev, wts, barrier) = (&dev, &wts, &barrier);
                sc.spawn(move || {
                    // Every thread holds its stream while all 64 are alive.
                    let s = dev.current_stream().unwrap();
                    barrier.wait();
                    for i in 0..20 {
                        let used = check_chain(dev, wts, t * 100 + i);
                        assert_eq!(used, s, "the thread's stream is cached");
                    }
                    s.index()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Round-robin over slots 1..32 from a fresh counter: 64 = 2 * 31 + 2, so slots 1 and 2
    // serve three threads and every other pooled slot two; the default stream none.
    let mut count = BTreeMap::new();
    for s in slots {
        *count.entry(s).or_insert(0) += 1;
    }
    let expect: BTreeMap<usize, i32> = (1..32).map(|s| (s, if s <= 2 { 3 } else { 2 })).collect();
    assert_eq!(count, expect);
    // 31 pooled streams, plus the default stream that loaded the weights.
    assert_eq!(dev.streams_created(), 32);
}

impl Weights {
    /// Loads the weights on the default stream, leaving the pool's round-robin counter alone.
    fn new_on_default_stream(dev: &Device) -> Self {
        let _g = StreamGuard::new(&dev.default_stream().unwrap());
        Self::new(dev)
    }
}

#[test]
fn pool_semantics() {
    let dev = fresh_device();
    assert_eq!(dev.pool_size(), 32);
    assert_eq!(dev.streams_created(), 0, "streams are created lazily");

    let first = dev.current_stream().unwrap();
    assert_eq!(
        first.index(),
        1,
        "the first thread gets the first pooled slot"
    );
    assert_eq!(dev.streams_created(), 1);
    assert_eq!(
        dev.current_stream().unwrap(),
        first,
        "cached thread-locally"
    );
    assert_eq!(dev.streams_created(), 1);

    let other = dev.stream_from_pool().unwrap();
    assert_eq!(other.index(), 2, "stream_from_pool takes the next slot");
    assert_eq!(
        dev.current_stream().unwrap(),
        first,
        "and leaves the current stream alone"
    );

    dev.release_current_thread_slot();
    let second = dev.current_stream().unwrap();
    assert_eq!(second.index(), 3, "a released thread is assigned afresh");
    assert_eq!(dev.current_stream().unwrap(), second);

    let default = dev.default_stream().unwrap();
    assert_eq!(default.index(), 0);
    assert_eq!(dev.streams_created(), 4);

    // Another thread's first use takes the next slot.
    let dev2 = dev.clone();
    let theirs = thread::spawn(move || dev2.current_stream().unwrap().index())
        .join()
        .unwrap();
    assert_eq!(theirs, 4);

    // Round-robin covers 1..32, never the default stream, then wraps.
    let mut seen = Vec::new();
    for _ in 0..62 {
        seen.push(dev.stream_from_pool().unwrap().index());
    }
    let expect: Vec<usize> = (0..62).map(|i| 1 + (4 + i) % 31).collect();
    assert_eq!(seen, expect);
    assert_eq!(dev.streams_created(), 32);

    assert_eq!(dev.stream_at(31).unwrap().index(), 31);
    assert!(matches!(dev.stream_at(32), Err(Error::InvalidArgument(_))));
}

#[test]
fn pool_size_is_configurable_and_validated() {
    let dev = super::device_with(DeviceConfig {
        pool_size: 4,
        ..DeviceConfig::default()
    })
    .unwrap();
    assert_eq!(dev.pool_size(), 4);
    let slots: Vec<usize> = (0..7)
        .map(|_| dev.stream_from_pool().unwrap().index())
        .collect();
    assert_eq!(slots, vec![1, 2, 3, 1, 2, 3, 1]);
    assert!(dev.stream_at(4).is_err());
    assert_eq!(dev.streams_created(), 3);

    // Two slots: a default stream and one pooled stream that every thread shares.
    let two = super::device_with(DeviceConfig {
        pool_size: 2,
        ..DeviceConfig::default()
    })
    .unwrap();
    let wts = Weights::new_on_default_stream(&two);
    thread::scope(|sc| {
        for t in 0..4 {
            let (two, wts) = (&two, &wts);
            sc.spawn(move || assert_eq!(check_chain(two, wts, t).index(), 1));
        }
    });

    for bad in [0, 1] {
        let r = super::device_with(DeviceConfig {
            pool_size: bad,
            ..DeviceConfig::default()
        });
        match r {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("pool size"), "{msg}"),
            other => panic!("pool_size {bad}: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[test]
fn events_order_work_across_streams() {
    let dev = fresh_device();
    let s1 = dev.stream_at(1).unwrap();
    let s2 = dev.stream_at(2).unwrap();
    let delay = Duration::from_millis(300);
    let data = ints(256, 3);

    let start = s1.record_event().unwrap();
    let x = {
        let _g = StreamGuard::new(&s1);
        s1.debug_delay(delay).unwrap();
        Tensor::from_vec(data.clone(), &[256], &dev).unwrap()
    };
    let done_on_s1 = s1.record_event().unwrap();
    // Precondition: the delay is still running (see the producer test).
    assert!(
        !done_on_s1.query(),
        "s1 finished its delay before we looked"
    );

    // Explicit ordering: s2 waits for s1's event, so s2's later marker cannot complete first.
    s2.wait_event(&done_on_s1).unwrap();
    let after_wait = s2.record_event().unwrap();
    after_wait.synchronize().unwrap();
    assert!(
        done_on_s1.query(),
        "s2 ran past its wait before s1 reached the event"
    );

    // Implicit ordering through the tensor, and s2's work sees s1's result.
    let y = {
        let _g = StreamGuard::new(&s2);
        x.affine(-1.0, 0.5).unwrap()
    };
    let expect: Vec<f32> = data.iter().map(|v| 0.5 - v).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), expect);

    done_on_s1.synchronize().unwrap();
    assert!(done_on_s1.query());
    let elapsed = done_on_s1.elapsed_since(&start).unwrap();
    assert!(elapsed >= delay, "{elapsed:?} < {delay:?}");

    // Events of another device are rejected, with an error rather than a hang or a panic.
    let other = fresh_device();
    let foreign = other.stream_at(1).unwrap().record_event().unwrap();
    assert!(matches!(s2.wait_event(&foreign), Err(Error::Device { .. })));
    assert!(matches!(
        foreign.elapsed_since(&start),
        Err(Error::InvalidArgument(_))
    ));
    // The device still works after the rejected calls.
    s2.synchronize().unwrap();
}

/// Bad calls on some threads return errors while other threads, some of them on the very
/// same stream, keep getting right answers; afterwards the device works for everyone.
#[test]
fn errors_on_one_thread_leave_other_threads_working() {
    let dev = super::device_with(DeviceConfig {
        memory_limit: Some(4 << 20),
        ..DeviceConfig::default()
    })
    .unwrap();
    let wts = Weights::new_on_default_stream(&dev);
    let other_dev = fresh_device();
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|sc| {
        let good: Vec<_> = (0..3u64)
            .map(|t| {
                let (dev, wts) = (&dev, &wts);
                sc.spawn(move || {
                    for i in 0..150 {
                        check_chain(dev, wts, 90_000 + t * 1000 + i);
                    }
                })
            })
            .collect();
        let bad = {
            let (dev, wts, other_dev, stop) = (&dev, &wts, &other_dev, &stop);
            sc.spawn(move || {
                // Share slot 1 with one of the good threads (they take slots 1, 2, 3): the strictest case.
                let _g = StreamGuard::new(&dev.stream_at(1).unwrap());
                let x = Tensor::from_vec(ints(M * K, 1), &[M, K], dev).unwrap();
                let elsewhere = Tensor::zeros(&[K, N], other_dev).unwrap();
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 20 {
                    rounds += 1;
                    assert!(matches!(x.matmul(&x), Err(Error::Shape { .. })));
                    assert!(matches!(x.add(&wts.w), Err(Error::Shape { .. })));
                    assert!(matches!(x.matmul(&elsewhere), Err(Error::Device { .. })));
                    assert!(x.reshape(&[3, 3]).is_err());
                    let ids = Tensor::from_vec(vec![0i64, 1], &[2], dev).unwrap();
                    assert!(matches!(ids.relu(), Err(Error::DType { .. })));
                    // Larger than the whole limit: always out of memory, whatever others hold.
                    match Tensor::zeros(&[2 << 20], dev) {
                        Err(Error::OutOfMemory { requested, .. }) => assert_eq!(requested, 8 << 20),
                        other => panic!("expected OutOfMemory, got {other:?}"),
                    }
                    thread::yield_now();
                }
                rounds
            })
        };
        for g in good {
            g.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(bad.join().unwrap() >= 20);
    });
    dev.synchronize().unwrap();
    check_chain(&dev, &wts, 1);
}

#[test]
fn stream_guards_nest_and_restore() {
    let a = fresh_device();
    let b = fresh_device();
    let pooled_a = a.current_stream().unwrap();
    let pooled_b = b.current_stream().unwrap();
    let (a3, a5, a0) = (
        a.stream_at(3).unwrap(),
        a.stream_at(5).unwrap(),
        a.default_stream().unwrap(),
    );
    let b7 = b.stream_at(7).unwrap();
    {
        let _g1 = StreamGuard::new(&a3);
        assert_eq!(a.current_stream().unwrap(), a3);
        {
            let _g2 = StreamGuard::new(&a5);
            assert_eq!(a.current_stream().unwrap(), a5);
            {
                // A guard on another device changes only that device's current stream.
                let _gb = StreamGuard::new(&b7);
                assert_eq!(b.current_stream().unwrap(), b7);
                assert_eq!(a.current_stream().unwrap(), a5);
                let _g3 = StreamGuard::new(&a0);
                assert_eq!(a.current_stream().unwrap(), a0);
                assert_eq!(b.current_stream().unwrap(), b7);
            }
            assert_eq!(a.current_stream().unwrap(), a5);
            assert_eq!(b.current_stream().unwrap(), pooled_b);
            // Work under a guard runs on the guard's stream: x is queued behind a5's delay,
            // so a reader on another thread (another stream) waits for that delay too.
            a5.debug_delay(Duration::from_millis(100)).unwrap();
            let delay_done = a5.record_event().unwrap();
            let x = Tensor::full(2.0, &[16], &a).unwrap();
            let got = thread::scope(|sc| sc.spawn(|| x.to_vec::<f32>().unwrap()).join().unwrap());
            assert_eq!(got, vec![2.0; 16]);
            assert!(
                delay_done.query(),
                "the reader did not wait for a5: x was not written there"
            );
        }
        assert_eq!(a.current_stream().unwrap(), a3);
    }
    assert_eq!(a.current_stream().unwrap(), pooled_a);
    assert_eq!(b.current_stream().unwrap(), pooled_b);

    // Releasing the pooled slot under a guard keeps the guard's stream current; once the
    // guard drops, the thread is assigned a new pooled stream.
    {
        let _g = StreamGuard::new(&a5);
        a.release_current_thread_slot();
        assert_eq!(a.current_stream().unwrap(), a5);
    }
    let reassigned = a.current_stream().unwrap();
    assert_ne!(reassigned, pooled_a);
    assert_ne!(reassigned.index(), 0);
    assert_eq!(
        b.current_stream().unwrap(),
        pooled_b,
        "only device a was released"
    );

    // Guards are per thread: another thread sees its own pooled stream.
    let a9 = a.stream_at(9).unwrap();
    let _g = StreamGuard::new(&a9);
    let a2 = a.clone();
    let theirs = thread::spawn(move || a2.current_stream().unwrap())
        .join()
        .unwrap();
    assert_ne!(theirs, a9);
    assert_ne!(theirs.index(), 0, "{theirs:?}");
    assert_eq!(a.current_stream().unwrap(), a9);
}

#[test]
fn device_synchronize_waits_for_every_stream() {
    let dev = fresh_device();
    let mut pending = Vec::new();
    for slot in 0..8 {
        let s = dev.stream_at(slot).unwrap();
        let _g = StreamGuard::new(&s);
        s.debug_delay(Duration::from_millis(20 + 10 * slot as u64))
            .unwrap();
        let t = Tensor::full(slot as f32, &[64], &dev).unwrap();
        pending.push((s.record_event().unwrap(), t, slot));
    }
    dev.synchronize().unwrap();
    for (e, t, slot) in pending {
        assert!(
            e.query(),
            "stream {slot} still busy after Device::synchronize"
        );
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![slot as f32; 64]);
    }
}
