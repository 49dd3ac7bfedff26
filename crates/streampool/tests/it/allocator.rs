//! Caching-allocator tests: reuse across streams never hands out a block
//! still in use, same-stream reuse is free, statistics and limits behave, and memory does
//! not grow with the number of streams.
//!
//! The hazard tests make a stream slow on purpose (`Stream::debug_delay`) so that a block is
//! freed on the host while a stream has yet to read it; a wrong reuse then shows up as wrong
//! values. Each test uses its own device so its statistics are its own.
//!
//! A shared suite: it runs on the CPU backend and again under `wgpu` on a wgpu device; the
//! parent module supplies the device (`super::device_under_test`, `super::device_with`).

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use streampool::allocator::size_class;
use streampool::{AllocatorStats, Device, DeviceConfig, Error, Stream, StreamGuard, Tensor};

fn ints(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((i * 7 + seed * 13 + (i * seed) % 5) % 17) as f32 - 8.0)
        .collect()
}

fn device(memory_limit: Option<usize>) -> Device {
    super::device_with(DeviceConfig {
        memory_limit,
        ..DeviceConfig::default()
    })
    .unwrap()
}

/// Runs `f` with `s` as the calling thread's current stream.
fn on<R>(s: &Stream, f: impl FnOnce() -> R) -> R {
    let _g = StreamGuard::new(s);
    f()
}

/// 16 KiB of `f32`: exactly one size class.
const LEN: usize = 4096;
const BYTES: usize = LEN * 4;

/// The delay a test first gives its slow stream; doubled for each undecided attempt.
const DELAY: Duration = Duration::from_millis(300);

/// Runs a timing scenario with a slow stream's delay of `DELAY`, doubling it while an
/// attempt is undecided (`None`: the host thread was held off the CPU past the delay, so
/// whether it waited for the slow stream cannot be told: other test threads compiling GPU
/// kernels on every core do that for hundreds of ms); panics if four attempts all are. Each
/// attempt's checks are as strict as one run's: a host that really waits is undecided every
/// time, and fails.
fn decided(what: &str, mut attempt: impl FnMut(Duration) -> Option<()>) {
    let mut delay = DELAY;
    for _ in 0..4 {
        if attempt(delay).is_some() {
            return;
        }
        delay *= 2;
    }
    panic!("{what} (or the host was held off the CPU past the slow stream's delay four times, up to {:?})", delay / 2);
}

/// Queues `delay` on `s` and returns the soonest instant work queued behind it can complete
/// (the delay starts no sooner than this call, on every backend).
fn slow_down(s: &Stream, delay: Duration) -> Instant {
    let earliest = Instant::now() + delay;
    s.debug_delay(delay).unwrap();
    earliest
}

/// Whether the host is known not to have waited for `done`, whose work cannot complete
/// before `earliest`: it is still before then, or the work is still pending. `false` is
/// undecided, not a failure (see `decided`).
fn known_not_waited(earliest: Instant, done: &streampool::Event) -> bool {
    Instant::now() < earliest || !done.query()
}

/// Sets up the hazard: `x` is written on `sw`, then read on the slow stream `sr` (behind
/// `delay`) into `y`, and `x` is freed on the host before that read has run. Returns `y`, the
/// values of `x`, an event that completes once `sr` has read `x`, and the soonest instant it
/// can; `None` if the read may have run before the free (the precondition is undecided).
fn freed_while_a_slow_stream_reads(
    dev: &Device,
    sw: &Stream,
    sr: &Stream,
    delay: Duration,
) -> Option<(Tensor, Vec<f32>, streampool::Event, Instant)> {
    let data = ints(LEN, 11);
    let x = on(sw, || Tensor::from_vec(data.clone(), &[LEN], dev).unwrap());
    let (y, earliest) = on(sr, || {
        let earliest = slow_down(sr, delay);
        (x.affine(1.0, 0.5).unwrap(), earliest)
    });
    let read_done = sr.record_event().unwrap();
    drop(x);
    // Precondition, not a claim about the runtime: the read is still queued.
    known_not_waited(earliest, &read_done).then_some((y, data, read_done, earliest))
}

#[test]
fn a_block_freed_while_another_stream_reads_it_is_not_reused() {
    decided("allocation blocked the host on the slow stream", |delay| {
        let dev = device(None);
        let (sw, sr, s3) = (
            dev.stream_at(1).unwrap(),
            dev.stream_at(2).unwrap(),
            dev.stream_at(3).unwrap(),
        );
        let (y, data, read_done, earliest) =
            freed_while_a_slow_stream_reads(&dev, &sw, &sr, delay)?;
        // Allocate the same size on the block's own stream (its free list) and on a third one,
        // and write at once: neither may land on the block the slow stream still has to read.
        let z = on(&sw, || Tensor::full(-1.0, &[LEN], &dev).unwrap());
        let w = on(&sw, || {
            Tensor::from_vec(vec![99.0f32; LEN], &[LEN], &dev).unwrap()
        });
        let z3 = on(&s3, || Tensor::full(-2.0, &[LEN], &dev).unwrap());
        if !known_not_waited(earliest, &read_done) {
            return None;
        }

        let expect: Vec<f32> = data.iter().map(|v| v + 0.5).collect();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            expect,
            "the slow reader saw reused memory"
        );
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![-1.0; LEN]);
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![99.0; LEN]);
        assert_eq!(z3.to_vec::<f32>().unwrap(), vec![-2.0; LEN]);
        let st = dev.allocator_stats();
        assert_eq!((st.cross_stream_reuses, st.event_gated_reuses), (0, 0));

        // Once the read is done, the block is free for any stream: a cross-stream cache hit.
        read_done.synchronize().unwrap();
        let hits = st.cache_hits;
        let v = on(&s3, || Tensor::full(3.0, &[LEN], &dev).unwrap());
        let st = dev.allocator_stats();
        assert_eq!(st.cross_stream_reuses, 1);
        assert_eq!(st.cache_hits, hits + 1);
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![3.0; LEN]);
        Some(())
    });
}

#[test]
fn at_the_limit_a_pending_block_is_reused_behind_a_device_side_wait() {
    decided("allocation blocked the host on the slow stream", |delay| {
        // Room for exactly two blocks: x (then y's input) and y.
        let dev = device(Some(2 * BYTES));
        let (sw, sr) = (dev.stream_at(1).unwrap(), dev.stream_at(2).unwrap());
        let (y, data, read_done, earliest) =
            freed_while_a_slow_stream_reads(&dev, &sw, &sr, delay)?;
        // No room for a third block and nothing idle to release: the allocator must hand out
        // x's block with `sw` ordered after the slow read, without blocking the host.
        let z = on(&sw, || Tensor::full(-1.0, &[LEN], &dev).unwrap());
        if !known_not_waited(earliest, &read_done) {
            return None;
        }
        let st = dev.allocator_stats();
        assert_eq!(st.event_gated_reuses, 1);
        assert_eq!(st.reserved, 2 * BYTES);

        let expect: Vec<f32> = data.iter().map(|v| v + 0.5).collect();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            expect,
            "z overwrote x before the slow read"
        );
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![-1.0; LEN]);
        assert_eq!(dev.allocator_stats().peak_reserved, 2 * BYTES);
        Some(())
    });
}

#[test]
fn same_stream_reuse_is_a_cache_hit_without_a_wait() {
    decided("same-stream reuse waited for the stream", |delay| {
        let dev = device(None);
        let s = dev.stream_at(1).unwrap();
        let (before, marker, earliest) = on(&s, || {
            let earliest = slow_down(&s, delay);
            let x = Tensor::full(1.0, &[LEN], &dev).unwrap();
            let marker = s.record_event().unwrap();
            drop(x); // its guard (on s) is still pending
            (dev.allocator_stats(), marker, earliest)
        });
        let y = on(&s, || Tensor::full(2.0, &[LEN], &dev).unwrap());
        // Stream order alone keeps y's fill after x's: the host did not wait.
        if !known_not_waited(earliest, &marker) {
            return None;
        }
        let after = dev.allocator_stats();
        assert_eq!(after.cache_hits, before.cache_hits + 1);
        assert_eq!(after.backend_allocs, before.backend_allocs);
        assert_eq!(
            (after.cross_stream_reuses, after.event_gated_reuses),
            (0, 0)
        );
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0; LEN]);
        Some(())
    });
}

#[test]
fn empty_cache_releases_idle_blocks_only() {
    let dev = device(None);
    let (s1, s2) = (dev.stream_at(1).unwrap(), dev.stream_at(2).unwrap());
    let idle = on(&s1, || Tensor::full(1.0, &[LEN], &dev).unwrap());
    idle.to_vec::<f32>().unwrap();
    let busy_done = on(&s2, || {
        s2.debug_delay(Duration::from_millis(200)).unwrap();
        let busy = Tensor::full(1.0, &[2 * LEN], &dev).unwrap();
        let e = s2.record_event().unwrap();
        drop(busy);
        e
    });
    drop(idle);
    let st = dev.allocator_stats();
    assert_eq!(st.allocated, 0);
    assert_eq!(st.reserved, 3 * BYTES);

    dev.empty_cache();
    let st = dev.allocator_stats();
    if !busy_done.query() {
        // The block s2 is still writing stays cached.
        assert_eq!(st.reserved, 2 * BYTES);
        assert_eq!(st.backend_frees, 1);
    }
    dev.synchronize().unwrap();
    dev.empty_cache();
    let st = dev.allocator_stats();
    assert_eq!(st.reserved, 0);
    assert_eq!(st.backend_frees, 2);
    assert_eq!(st.peak_reserved, 3 * BYTES);

    // The device keeps working after its cache is emptied.
    let t = on(&s1, || Tensor::full(5.0, &[LEN], &dev).unwrap());
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![5.0; LEN]);
    assert_eq!(dev.allocator_stats().backend_allocs, 3);
}

#[test]
fn statistics_follow_allocations() {
    let dev = device(None);
    assert_eq!(dev.allocator_stats(), AllocatorStats::default());
    let sizes = [100usize, 1000, 5000];
    let tensors: Vec<Tensor> = sizes
        .iter()
        .map(|&n| Tensor::zeros(&[n], &dev).unwrap())
        .collect();
    let live: usize = sizes.iter().map(|n| size_class(n * 4)).sum();
    let st = dev.allocator_stats();
    assert_eq!(st.allocs, 3);
    assert_eq!(st.backend_allocs, 3);
    assert_eq!(st.allocated, live);
    assert_eq!(st.reserved, live);
    assert_eq!(st.peak_allocated, live);
    assert_eq!(st.cache_hits, 0);

    let last = size_class(5000 * 4);
    drop(tensors);
    dev.synchronize().unwrap();
    let st = dev.allocator_stats();
    assert_eq!(st.allocated, 0);
    assert_eq!(st.reserved, live, "freed blocks stay cached");
    assert_eq!(st.peak_allocated, live);

    // A request of another size in the same class reuses the cached block.
    let again = Tensor::zeros(&[4990], &dev).unwrap();
    let st = dev.allocator_stats();
    assert_eq!(size_class(4990 * 4), last);
    assert_eq!(st.allocs, 4);
    assert_eq!(st.cache_hits, 1);
    assert_eq!(st.backend_allocs, 3);
    assert_eq!(st.allocated, last);
    assert_eq!(st.peak_reserved, live);
    assert_eq!(again.to_vec::<f32>().unwrap(), vec![0.0; 4990]);
}

#[test]
fn out_of_memory_names_the_bytes_and_the_device_recovers() {
    const MIB: usize = 1 << 20;
    let dev = device(Some(MIB));
    let held = Tensor::zeros(&[MIB / 8], &dev).unwrap(); // 512 KiB
    let err = Tensor::zeros(&[3 * MIB / 16], &dev).unwrap_err(); // 768 KiB
    match &err {
        Error::OutOfMemory {
            requested,
            allocated,
            reserved,
            limit,
            ..
        } => {
            assert_eq!(*requested, 3 * MIB / 4);
            assert_eq!(*allocated, MIB / 2);
            assert_eq!(*reserved, MIB / 2);
            assert_eq!(*limit, Some(MIB));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let msg = err.to_string();
    for needle in ["786432", "524288", "requested", "reserved"] {
        assert!(msg.contains(needle), "{needle:?} missing from {msg:?}");
    }
    let st = dev.allocator_stats();
    assert_eq!(
        (st.allocated, st.reserved),
        (MIB / 2, MIB / 2),
        "a failed request leaks nothing"
    );

    // The device keeps working: small work fits next to the held tensor.
    let small = Tensor::full(4.0, &[1000], &dev).unwrap();
    assert_eq!(
        small.affine(0.5, 0.0).unwrap().to_vec::<f32>().unwrap(),
        vec![2.0; 1000]
    );
    assert_eq!(held.to_vec::<f32>().unwrap()[0], 0.0);

    // Once the big tensor is gone, the cached block is released to make room.
    drop(held);
    let big = Tensor::full(1.0, &[3 * MIB / 16], &dev).unwrap();
    assert_eq!(
        big.sum(0, false).unwrap().to_scalar().unwrap(),
        (3 * MIB / 16) as f32
    );
    let st = dev.allocator_stats();
    assert!(st.reserved <= MIB, "{st:?}");
    assert!(st.backend_frees >= 1, "{st:?}");
}

/// A request larger than the whole limit can never succeed: it fails at once, without
/// releasing anyone's cached blocks or waiting for a busy stream.
#[test]
fn a_request_over_the_whole_limit_fails_at_once() {
    decided("an impossible request waited for a busy stream", |delay| {
        let dev = device(Some(4 * BYTES));
        let (s1, sr) = (dev.stream_at(1).unwrap(), dev.stream_at(2).unwrap());
        let idle = on(&s1, || Tensor::full(1.0, &[LEN], &dev).unwrap());
        idle.to_vec::<f32>().unwrap();
        drop(idle);
        let (busy_done, earliest) = on(&sr, || {
            let earliest = slow_down(&sr, delay);
            drop(Tensor::full(2.0, &[2 * LEN], &dev).unwrap());
            (sr.record_event().unwrap(), earliest)
        });
        let before = dev.allocator_stats();
        match on(&s1, || Tensor::zeros(&[5 * LEN], &dev)) {
            Err(Error::OutOfMemory {
                requested, limit, ..
            }) => {
                assert_eq!(requested, 5 * BYTES);
                assert_eq!(limit, Some(4 * BYTES));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        if !known_not_waited(earliest, &busy_done) {
            return None;
        }
        let after = dev.allocator_stats();
        assert_eq!(
            after.backend_frees, before.backend_frees,
            "the cache was emptied"
        );
        assert_eq!(after.reserved, 3 * BYTES);
        Some(())
    });
}

/// Two threads at the limit both need a block that a slow stream still reads to be
/// released. Whichever waits for it, the other must still see it (and the room it
/// leaves): both requests fit once the read is done, so neither may fail.
/// With no limit set, a request the backend itself refuses (here: 4 TiB) must fail with
/// `OutOfMemory` at once. The at-limit path once took its own refused reservation for room
/// made by another thread and retried for ever.
#[test]
fn a_request_the_backend_refuses_fails_instead_of_retrying() {
    let dev = device(None);
    let err = Tensor::zeros(&[1usize << 40], &dev).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { .. }),
        "expected out of memory, got {err:?}"
    );
    // The device still works, and nothing stays counted for the refused request.
    let x = Tensor::from_vec(ints(64, 3), &[64], &dev).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), ints(64, 3));
    drop(x);
    assert_eq!(dev.allocator_stats().allocated, 0);
}

#[test]
fn concurrent_requests_at_the_limit_both_succeed_once_the_cache_is_idle() {
    decided("the slow stream ran before its block was freed", |delay| {
        const KIB: usize = 1024;
        let dev = device(Some(64 * KIB));
        let (s1, s2, sr) = (
            dev.stream_at(1).unwrap(),
            dev.stream_at(2).unwrap(),
            dev.stream_at(3).unwrap(),
        );
        let held = on(&s1, || Tensor::full(1.0, &[2 * KIB], &dev).unwrap()); // 8 KiB
        let big = on(&s1, || Tensor::full(2.0, &[12 * KIB], &dev).unwrap()); // 48 KiB
        let (sum, earliest) = on(&sr, || {
            let earliest = slow_down(&sr, delay);
            (big.sum(0, false).unwrap(), earliest) // 512 bytes
        });
        let read_done = sr.record_event().unwrap();
        drop(big);
        // Precondition, not a claim about the runtime: the read is still queued.
        if !known_not_waited(earliest, &read_done) {
            return None;
        }
        // 56.5 KiB reserved: 16 KiB more does not fit until the 48 KiB block is released;
        // then both requests do (8 + 0.5 + 16 + 16 KiB).
        let barrier = Barrier::new(2);
        let results: Vec<_> = thread::scope(|sc| {
            let handles: Vec<_> = [(&s1, 3.0f32), (&s2, 4.0)]
                .into_iter()
                .map(|(s, v)| {
                    let (dev, barrier) = (&dev, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        on(s, || Tensor::full(v, &[4 * KIB], dev)).map(|t| (t, v))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            let (t, v) = r.expect("a request that fits failed");
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![v; 4 * KIB]);
        }
        assert_eq!(sum.to_scalar().unwrap(), 2.0 * (12 * KIB) as f32);
        assert_eq!(held.to_vec::<f32>().unwrap()[0], 1.0);
        assert!(dev.allocator_stats().peak_reserved <= 64 * KIB);
        Some(())
    });
}

/// One thread keeps asking for more than the limit while others, some on the same streams,
/// allocate and compute within it: only the greedy thread sees errors.
#[test]
fn out_of_memory_on_one_thread_leaves_others_working() {
    const LIMIT: usize = 2 << 20;
    let dev = device(Some(LIMIT));
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|sc| {
        let good: Vec<_> = (0..3u64)
            .map(|t| {
                let dev = &dev;
                sc.spawn(move || {
                    for i in 0..100 {
                        // At most two 64 KiB tensors live per thread: far below the limit.
                        let data = ints(16 * 1024, t * 1000 + i);
                        let x = Tensor::from_vec(data.clone(), &[16 * 1024], dev).unwrap();
                        let y = x.affine(2.0, 1.0).unwrap();
                        let expect: Vec<f32> = data.iter().map(|v| 2.0 * v + 1.0).collect();
                        assert_eq!(y.to_vec::<f32>().unwrap(), expect);
                    }
                })
            })
            .collect();
        let greedy = {
            let (dev, stop) = (&dev, &stop);
            sc.spawn(move || {
                let _g = StreamGuard::new(&dev.stream_at(1).unwrap());
                let mut failures = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || failures < 10 {
                    match Tensor::zeros(&[LIMIT / 4 + 1], dev) {
                        Err(Error::OutOfMemory { requested, .. }) => {
                            assert_eq!(requested, LIMIT + 4);
                            failures += 1;
                        }
                        other => panic!("expected OutOfMemory, got {other:?}"),
                    }
                    thread::sleep(Duration::from_micros(200));
                }
                failures
            })
        };
        for g in good {
            g.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(greedy.join().unwrap() >= 10);
    });
    let st = dev.allocator_stats();
    assert!(st.peak_reserved <= LIMIT, "{st:?}");
    assert_eq!(st.allocated, 0);
}

/// Tensors travel around a ring of threads, each on its own stream; every receiver reads
/// its tensor on its (sometimes slowed) stream and drops it at once, while the sender's
/// stream keeps allocating and writing. Any reuse of a block still being read would show
/// up as a wrong value.
#[test]
fn blocks_handed_between_threads_are_never_reused_while_read() {
    const THREADS: usize = 6;
    const ROUNDS: u64 = 80;
    let dev = device(None);
    let channels: Vec<_> = (0..THREADS)
        .map(|_| crossbeam_channel::unbounded::<(Tensor, f32)>())
        .collect();
    thread::scope(|sc| {
        for t in 0..THREADS {
            let dev = &dev;
            let tx = channels[(t + 1) % THREADS].0.clone();
            let rx = channels[t].1.clone();
            sc.spawn(move || {
                let s = dev.stream_at(1 + t).unwrap();
                let _g = StreamGuard::new(&s);
                let mut checks = Vec::new();
                for r in 0..ROUNDS {
                    // Small integers, so the sums below are exact in f32 (below 2^24).
                    let value = (t as u64 * 100 + r) as f32;
                    tx.send((Tensor::full(value, &[LEN], dev).unwrap(), value))
                        .unwrap();
                    let (got, v) = rx.recv().unwrap();
                    if (r + t as u64) % 3 == 1 {
                        s.debug_delay(Duration::from_micros(300)).unwrap();
                    }
                    // Read on this stream, then free at once: the read may not have run yet.
                    checks.push((got.affine(1.0, 1.0).unwrap().sum(0, false).unwrap(), v));
                    drop(got);
                    // Grab fresh blocks of the same size and scribble on them.
                    let junk = Tensor::full(-7.0, &[LEN], dev).unwrap();
                    drop(junk);
                }
                for (sum, v) in checks {
                    assert_eq!(sum.to_scalar().unwrap(), (v + 1.0) * LEN as f32);
                }
            });
        }
    });
    let st = dev.allocator_stats();
    assert_eq!(st.allocated, 0);
    assert!(st.cache_hits > 0, "{st:?}");
}

/// The allocator's memory bound: with 32 streams busy, reserved bytes stay within 1.25x of
/// what one stream needs for the same live data.
///
/// The workload: `THREADS` threads move in lock step through `STEPS` steps. In each step a
/// thread makes a working set (five tensors of three sizes), all threads hold their sets
/// at once (a barrier), check them, free them, and leave their stream busy with unrelated
/// work (a delay queued after the free). At step `k` thread `t` runs on slot
/// `(k * THREADS + t) % 32`, so consecutive steps always land on streams nobody used in
/// the previous step and, over the run, every one of the 32 streams (default included)
/// serves every size. The live data is the same at every step: `THREADS` working sets.
///
/// Run once with every thread on one stream, the peak of live bytes is exactly
/// `THREADS * set`. An allocator with one pool per stream (a failure mode other runtimes
/// have shipped) would end with every stream's pool holding a working set: 32 / 4 =
/// 8x that. Ours must reuse blocks freed on other streams, even though those streams are
/// still busy, because their guard events (recorded at the free) have passed; so reserved
/// memory stays near the live data.
#[test]
fn reserved_memory_does_not_grow_with_the_number_of_streams() {
    const THREADS: usize = 4;
    const STEPS: usize = 24;

    fn run(dev: &Device, slot_of: impl Fn(usize, usize) -> usize + Sync) {
        let barrier = Barrier::new(THREADS);
        thread::scope(|sc| {
            for t in 0..THREADS {
                let (barrier, slot_of) = (&barrier, &slot_of);
                sc.spawn(move || {
                    for k in 0..STEPS {
                        let s = dev.stream_at(slot_of(k, t)).unwrap();
                        let _g = StreamGuard::new(&s);
                        let seed = (k * THREADS + t) as u64;
                        let a_data = ints(8 * LEN, seed);
                        let a = Tensor::from_vec(a_data.clone(), &[8 * LEN], dev).unwrap();
                        let b = a.narrow(0, 0, LEN).unwrap().affine(2.0, 0.0).unwrap();
                        let c = b.add(&b).unwrap();
                        let d = Tensor::full(seed as f32, &[2 * LEN], dev).unwrap();
                        let e = c.sum(0, true).unwrap();
                        barrier.wait(); // every thread holds its whole set now
                        let b_expect: Vec<f32> = a_data[..LEN].iter().map(|v| 2.0 * v).collect();
                        assert_eq!(b.to_vec::<f32>().unwrap(), b_expect);
                        assert_eq!(c.to_vec::<f32>().unwrap()[LEN - 1], 2.0 * b_expect[LEN - 1]);
                        assert_eq!(d.to_vec::<f32>().unwrap()[7], seed as f32);
                        let sum: f32 = b_expect.iter().map(|v| 2.0 * v).sum();
                        assert_eq!(e.to_scalar().unwrap(), sum);
                        assert_eq!(a.to_vec::<f32>().unwrap(), a_data);
                        drop((a, b, c, d, e));
                        // Busy with other work after the free.
                        s.debug_delay(Duration::from_millis(2)).unwrap();
                        barrier.wait(); // every set is freed before the next step starts
                    }
                });
            }
        });
        dev.synchronize().unwrap();
    }

    let one = device(None);
    run(&one, |_, _| 1);
    let live = one.allocator_stats().peak_allocated;
    // a (128 KiB), b and c (16 KiB each), d (32 KiB), e (one float: the 512-byte minimum).
    let set = size_class(8 * BYTES) + 2 * BYTES + size_class(2 * BYTES) + size_class(4);
    assert_eq!(live, THREADS * set, "{:?}", one.allocator_stats());

    let many = device(None);
    run(&many, |k, t| (k * THREADS + t) % 32);
    let st = many.allocator_stats();
    assert_eq!(many.streams_created(), 32);
    assert!(st.cross_stream_reuses > 0, "{st:?}");
    assert!(
        st.peak_reserved * 4 <= live * 5,
        "peak reserved {} over 32 streams vs {} live on one stream: {st:?}",
        st.peak_reserved,
        live
    );
    assert_eq!(st.peak_allocated, live);
    assert_eq!(st.allocated, 0);
}

/// Allocations and frees racing on many streams at once leave the books balanced.
#[test]
fn concurrent_churn_keeps_statistics_consistent() {
    let dev = device(None);
    thread::scope(|sc| {
        for t in 0..8u64 {
            let dev = &dev;
            sc.spawn(move || {
                for i in 0..200u64 {
                    let n = 64 + ((t * 31 + i * 17) % 7) as usize * 300;
                    let x = Tensor::full(i as f32, &[n], dev).unwrap();
                    let y = x.affine(1.0, t as f32).unwrap();
                    if i % 50 == 49 {
                        dev.release_current_thread_slot();
                    }
                    assert_eq!(y.to_vec::<f32>().unwrap()[n - 1], (i + t) as f32);
                }
            });
        }
    });
    dev.synchronize().unwrap();
    let st = dev.allocator_stats();
    assert_eq!(st.allocated, 0);
    assert_eq!(st.allocs, 8 * 200 * 2);
    assert_eq!(st.allocs, st.cache_hits + st.backend_allocs);
    assert!(st.reserved <= st.peak_reserved);
    dev.empty_cache();
    assert_eq!(dev.allocator_stats().reserved, 0);
}
