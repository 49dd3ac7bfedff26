//! The floor under a wgpu read-back (what bounds a small call): what one submission, fence
//! wait and buffer mapping cost on this adapter with plain wgpu, no streampool in between,
//! next to streampool's smallest call.
//!
//! ```text
//! cargo run --release -p streampool --features wgpu --example wgpu_floor -- [--iters N]
//! ```
//!
//! Each row runs `--iters` times (default 2000, after 100 unmeasured) on one thread and
//! prints the median and the 10th and 90th percentiles of one round trip, in microseconds:
//!
//! 1. `submit nothing + wait`: `Queue::submit([])` and `Device::poll(Wait)` on its index.
//! 2. `empty command buffer + wait`: an encoder finished with no commands, submitted, waited.
//! 3. `copy 4 B + map`: a 4-byte buffer copy into a kept `MAP_READ` buffer, submitted,
//!    waited, mapped, read, unmapped: the least a read-back can do.
//! 4. `dispatch + copy 4 B + map`: a one-workgroup kernel with its pipeline, bind group and
//!    parameters made once, then row 3's read-back in the same command buffer: the least one
//!    kernel and its read-back can cost.
//! 5. `as 4, new params + bind group`: row 4 with a new uniform buffer (mapped at creation)
//!    and bind group each call, as streampool prepares every launch.
//! 6. `streampool affine [4] + to_vec`: one launch and a read-back through streampool.
//!
//! Rows 3 and 4 also print their phases (record + submit, wait, map + read).

use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const KERNEL: &str = "
@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32) {
    if (i == 0u) { x[0] = x[0] + p.x; }
}
";

fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Times `f` `iters` times after 100 unmeasured runs; `f` returns its phases in microseconds.
fn row(name: &str, iters: usize, mut f: impl FnMut() -> Res<Vec<f64>>) -> Res<()> {
    for _ in 0..100 {
        f()?;
    }
    let mut total = Vec::with_capacity(iters);
    let mut phases: Vec<Vec<f64>> = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let ph = f()?;
        total.push(t.elapsed().as_secs_f64() * 1e6);
        phases.resize(ph.len(), Vec::new());
        for (p, v) in phases.iter_mut().zip(ph) {
            p.push(v);
        }
    }
    let (m, lo, hi) = percentiles(total);
    let split: Vec<String> = phases
        .into_iter()
        .map(|p| format!("{:.1}", percentiles(p).0))
        .collect();
    println!(
        "| {name} | {m:.1} | {lo:.1} | {hi:.1} | {} |",
        if split.is_empty() {
            String::new()
        } else {
            split.join(" / ")
        }
    );
    Ok(())
}

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iters: usize = match args.iter().position(|a| a == "--iters") {
        Some(i) => args.get(i + 1).ok_or("--iters needs a value")?.parse()?,
        None => 2000,
    };
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let adapter = adapters
        .iter()
        .find(|a| a.get_info().device_type == wgpu::DeviceType::DiscreteGpu)
        .or(adapters.first())
        .ok_or("no wgpu adapter")?;
    let info = adapter.get_info();
    let features = adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("wgpu_floor"),
        required_features: features,
        ..Default::default()
    }))?;
    println!(
        "adapter: {} ({:?}, {:?}), driver {} {}; {iters} round trips per row, one thread\n",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    println!("| round trip | p50 us | p10 | p90 | phases p50 us |");
    println!("|---|---:|---:|---:|---|");
    let wait = |index: wgpu::SubmissionIndex| -> Res<()> {
        device.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(Duration::from_secs(10)),
        })?;
        Ok(())
    };

    row("submit nothing + wait", iters, || {
        wait(queue.submit([]))?;
        Ok(vec![])
    })?;
    row("empty command buffer + wait", iters, || {
        let enc = device.create_command_encoder(&Default::default());
        wait(queue.submit([enc.finish()]))?;
        Ok(vec![])
    })?;

    let data = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    // Waits for `index`, then maps the staging buffer's first word, reads it and unmaps.
    let map_read = |index: wgpu::SubmissionIndex| -> Res<(f64, f64, u32)> {
        let t = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..4, move |r| {
            let _ = tx.send(r);
        });
        wait(index)?;
        let waited = us(t);
        let t = Instant::now();
        device.poll(wgpu::PollType::Poll)?;
        rx.recv_timeout(Duration::from_secs(10))??;
        let v = {
            let view = staging.get_mapped_range(..4)?;
            u32::from_le_bytes([view[0], view[1], view[2], view[3]])
        };
        staging.unmap();
        Ok((waited, us(t), v))
    };
    row("copy 4 B + map", iters, || {
        let t = Instant::now();
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&data, 0, &staging, 0, 4);
        let index = queue.submit([enc.finish()]);
        let submitted = us(t);
        let (waited, mapped, _) = map_read(index)?;
        Ok(vec![submitted, waited, mapped])
    })?;

    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(KERNEL.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let layout = pipeline.get_bind_group_layout(0);
    let params = |mapped: bool| {
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM
                | if mapped {
                    wgpu::BufferUsages::MAP_WRITE
                } else {
                    wgpu::BufferUsages::COPY_DST
                },
            mapped_at_creation: true,
        });
        b.get_mapped_range_mut(..)
            .expect("mapped at creation")
            .copy_from_slice(&[1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        b.unmap();
        b
    };
    let mapped = features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
    let group = |p: &wgpu::Buffer| {
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: p.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: data.as_entire_binding(),
                },
            ],
        })
    };
    let kept_params = params(mapped);
    let kept_group = group(&kept_params);
    let dispatch = |g: &wgpu::BindGroup| -> Res<Vec<f64>> {
        let t = Instant::now();
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, g, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        enc.copy_buffer_to_buffer(&data, 0, &staging, 0, 4);
        let index = queue.submit([enc.finish()]);
        let submitted = us(t);
        let (waited, mapped, _) = map_read(index)?;
        Ok(vec![submitted, waited, mapped])
    };
    row("dispatch + copy 4 B + map", iters, || dispatch(&kept_group))?;
    row("as above, new params + bind group", iters, || {
        let t = Instant::now();
        let p = params(mapped);
        let g = group(&p);
        let made = us(t);
        let mut v = dispatch(&g)?;
        v.insert(0, made);
        Ok(v)
    })?;
    // Each dispatch added 1 and the last call copied the count out: check it.
    let (_, _, count) = map_read(queue.submit([]))?;
    assert_eq!(count, 2 * (iters + 100) as u32, "dispatch count");

    let dev = streampool::Device::wgpu()?;
    let x = streampool::Tensor::zeros(&[4], &dev)?;
    println!("\n(streampool on {})\n", dev.name());
    let _ = streampool::wgpu_profile();
    row("streampool affine [4] + to_vec", iters, || {
        let v = x.affine(1.0, 1.0)?.to_vec::<f32>()?;
        assert_eq!(v, [1.0; 4]);
        Ok(vec![])
    })?;
    // With STREAMPOOL_WGPU_PROFILE=host (or 1): where streampool's call went, per phase.
    let p = streampool::wgpu_profile();
    for k in &p.host {
        println!(
            "  host {:>8.1} us x{:>6.2} per call  {}",
            k.total_ns as f64 / 1e3 / k.calls.max(1) as f64,
            k.calls as f64 / (iters + 100) as f64,
            k.label
        );
    }
    if p.stretches > 0 {
        println!(
            "  GPU per call: {:.1} us in kernels of {:.1} us spanned",
            p.busy_ns as f64 / 1e3 / p.stretches as f64,
            p.span_ns as f64 / 1e3 / p.stretches as f64
        );
    }
    Ok(())
}
