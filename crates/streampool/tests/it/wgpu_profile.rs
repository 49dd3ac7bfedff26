//! The wgpu profile (`STREAMPOOL_WGPU_PROFILE=1`, the tunables' `wgpu.profile`): every
//! launch is counted once under its kernel's label, the kernels' times add up to the busy
//! time inside the span, and an adapter without timestamps says so instead of giving an
//! empty table. The test runs in a process of its own (`util::in_own_process`): the
//! process's tunables are fixed once, and the profile's totals are process-wide, so one test
//! holds the whole sequence.

use streampool::config::{self, Tuning, WgpuProfiling};
use streampool::{wgpu_profile, Device, Tensor};

use crate::util::in_own_process;

#[test]
fn every_launch_is_counted_once_under_its_kernel_and_the_times_add_up() {
    in_own_process(
        "wgpu_profile::every_launch_is_counted_once_under_its_kernel_and_the_times_add_up",
        || {
            // Before any device opens: the device is opened with timestamps when profiling.
            let mut tuning = Tuning::from_env();
            tuning.wgpu.profile = WgpuProfiling::Gpu;
            config::set(tuning).expect("the first use of the tunables in this process");
            let dev = match Device::wgpu() {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("no wgpu adapter ({e}), skipping");
                    return;
                }
            };
            let s = dev.current_stream().unwrap();
            let x = Tensor::randn(&[64, 64], 0, &dev).unwrap();
            let w = Tensor::randn(&[64, 64], 1, &dev).unwrap();
            s.synchronize().unwrap();
            // Whatever the setup launched (and its pipeline builds) is left out of what follows.
            let _ = wgpu_profile();

            // Five launches (a matmul, a relu, three affines) and one read-back.
            let y = x.matmul(&w).unwrap().relu().unwrap();
            let y = y.affine(2.0, 1.0).unwrap().affine(0.5, 0.0).unwrap();
            let y = y.affine(1.0, -0.5).unwrap();
            let got = y.to_vec::<f32>().unwrap();
            let p = wgpu_profile();
            // Read and reset: the next profile starts empty.
            let again = wgpu_profile();
            assert!(
                again.kernels.is_empty() && again.host.is_empty(),
                "{again:?}"
            );
            eprintln!("{p:#?}");

            // The result is right: relu(x @ w) (the affines cancel out).
            let (xv, wv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            for (i, g) in got.iter().enumerate() {
                let (r, c) = (i / 64, i % 64);
                let want: f32 = (0..64).map(|k| xv[r * 64 + k] * wv[k * 64 + c]).sum();
                assert!(
                    (g - want.max(0.0)).abs() < 1e-3,
                    "{i}: {g} vs {}",
                    want.max(0.0)
                );
            }

            // Host phases are recorded whether or not the adapter has timestamps.
            let host = |label: &str| {
                p.host
                    .iter()
                    .find(|k| k.label == label)
                    .map_or(0, |k| k.calls)
            };
            assert_eq!(
                host("launch: prepare (bind group, parameters)"),
                5,
                "{:?}",
                p.host
            );
            assert_eq!(host("read-back: wait for the GPU"), 1, "{:?}", p.host);
            assert_eq!(host("read-back: map"), 1, "{:?}", p.host);

            if !p.unsupported.is_empty() {
                // No TIMESTAMP_QUERY: named, and no kernel time made up.
                assert!(
                    dev.name().contains(&p.unsupported[0]),
                    "{:?}",
                    p.unsupported
                );
                assert!(p.kernels.is_empty() && p.busy_ns == 0 && p.span_ns == 0);
                eprintln!(
                    "{} has no timestamps: kernel times unsupported, host phases checked",
                    dev.name()
                );
                return;
            }
            let calls = |prefix: &str| -> u64 {
                p.kernels
                    .iter()
                    .filter(|k| k.label.starts_with(prefix))
                    .map(|k| k.calls)
                    .sum()
            };
            assert_eq!(calls("matmul f32 64x64x64 [matmul"), 1, "{:?}", p.kernels);
            assert_eq!(calls("unary f32 Relu 4096"), 1, "{:?}", p.kernels);
            assert_eq!(calls("unary f32 Affine"), 3, "{:?}", p.kernels);
            assert_eq!(p.kernels.iter().map(|k| k.calls).sum::<u64>(), 5);
            assert_eq!(p.untimed, 0);
            // The matmul counted its operations; the element-wise kernels their bytes.
            let mm = p
                .kernels
                .iter()
                .find(|k| k.label.starts_with("matmul"))
                .unwrap();
            assert_eq!(mm.flops, 2 * 64 * 64 * 64);
            assert!(!mm.rate().is_empty() || mm.total_ns == 0);
            // Busy time is the kernels' sum, and lies inside the span of the one stretch (the
            // passes run one after another; a nanosecond of rounding per pass allowed).
            let sum: u128 = p.kernels.iter().map(|k| k.total_ns).sum();
            assert_eq!(p.busy_ns, sum);
            assert_eq!(p.stretches, 1);
            assert!(
                p.busy_ns <= p.span_ns + 5,
                "busy {} span {}",
                p.busy_ns,
                p.span_ns
            );
            assert!(p.span_ns > 0);
        },
    );
}
