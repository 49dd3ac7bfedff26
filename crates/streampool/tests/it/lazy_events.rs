//! The lazy event policy (the default on CUDA) on the CPU backend: write events recorded on
//! first foreign use, free guards recorded only when another stream needs the block.

use std::time::Duration;

use streampool::{Device, DeviceConfig, EventPolicy, StreamGuard, Tensor};

fn lazy_device() -> Device {
    Device::cpu_with(DeviceConfig {
        events: EventPolicy::Lazy,
        ..DeviceConfig::default()
    })
    .unwrap()
}

#[test]
fn consumer_on_another_stream_waits_for_a_slow_producer() {
    let dev = lazy_device();
    let (s1, s2) = (dev.stream_at(1).unwrap(), dev.stream_at(2).unwrap());
    let x = {
        let _g = StreamGuard::new(&s1);
        s1.debug_delay(Duration::from_millis(150)).unwrap();
        Tensor::full(3.0, &[4096], &dev).unwrap()
    };
    let _g = StreamGuard::new(&s2);
    let y = x.scale(2.0).unwrap().to_vec::<f32>().unwrap();
    assert!(y.iter().all(|&v| v == 6.0));
}

#[test]
fn block_freed_on_a_busy_stream_is_not_reused_by_another_stream_too_early() {
    let dev = lazy_device();
    let (a, b) = (dev.stream_at(1).unwrap(), dev.stream_at(2).unwrap());
    let n = 64 * 1024;
    let r = {
        let _g = StreamGuard::new(&a);
        a.debug_delay(Duration::from_millis(200)).unwrap();
        let t = Tensor::full(7.0, &[n], &dev).unwrap();
        t.scale(1.0).unwrap()
        // `t` is freed here, on the host, while stream `a` has not even written it yet.
    };
    let z = {
        let _g = StreamGuard::new(&b);
        Tensor::full(9.0, &[n], &dev).unwrap()
    };
    // Had `z` reused `t`'s block, stream `a` would later overwrite it with 7s.
    dev.synchronize().unwrap();
    assert!(
        z.to_vec::<f32>().unwrap().iter().all(|&v| v == 9.0),
        "z was overwritten"
    );
    assert!(r.to_vec::<f32>().unwrap().iter().all(|&v| v == 7.0));
    assert!(!z.shares_storage(&r));
}

#[test]
fn own_stream_reuse_records_no_guard_events() {
    let dev = lazy_device();
    let s = dev.stream_at(3).unwrap();
    let _g = StreamGuard::new(&s);
    let w = Tensor::randn(&[32, 32], 1, &dev).unwrap();
    for i in 0..200 {
        let x = Tensor::randn(&[4, 32], i, &dev).unwrap();
        let y = x.matmul(&w).unwrap().relu().unwrap().sum(1, false).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap().len(), 4);
    }
    let stats = dev.allocator_stats();
    assert_eq!(
        stats.guard_resolutions, 0,
        "one stream alone never needs a guard event"
    );
    assert!(stats.cache_hits > 500, "same-stream reuse: {stats:?}");
}

#[test]
fn memory_moves_across_idle_streams_through_resolved_guards() {
    let dev = lazy_device();
    let n = 256 * 1024; // 1 MiB per tensor
    for slot in 1..dev.pool_size() {
        let s = dev.stream_at(slot).unwrap();
        let _g = StreamGuard::new(&s);
        let x = Tensor::full(slot as f32, &[n], &dev).unwrap();
        let y = x.scale(2.0).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap()[n - 1], 2.0 * slot as f32);
    }
    let stats = dev.allocator_stats();
    assert!(stats.guard_resolutions > 0);
    assert!(stats.cross_stream_reuses > 0, "{stats:?}");
    // One stream would need two live 1 MiB blocks; hopping over 31 idle streams must not
    // grow that (the allocator's 1.25x bound).
    assert!(
        stats.peak_reserved as f64 <= 1.25 * stats.peak_allocated as f64,
        "reserved {} vs live {}",
        stats.peak_reserved,
        stats.peak_allocated
    );
}

#[test]
fn empty_cache_releases_lazily_freed_blocks_once_idle() {
    let dev = lazy_device();
    let s = dev.stream_at(1).unwrap();
    {
        let _g = StreamGuard::new(&s);
        let x = Tensor::full(1.0, &[1 << 16], &dev).unwrap();
        x.to_vec::<f32>().unwrap();
    }
    dev.synchronize().unwrap();
    dev.empty_cache();
    let stats = dev.allocator_stats();
    assert_eq!(stats.reserved, 0, "{stats:?}");
}
