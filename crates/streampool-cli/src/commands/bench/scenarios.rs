//! The scenarios: ceiling (pre-formed batches, one thread), threading (N threads calling the
//! shared model at batch 1), batching (N callers through a BatchQueue) and overhead (per-op
//! host cost, large matmul against `matrixmultiply::sgemm`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use streampool::{Device, Tensor};
use streampool_batch::{BatchConfig, BatchModel, BatchQueue, StatsSnapshot};
use streampool_core::{wait_row, EmbedBatch, EmbedderEndpoint, ModelConfig};
use streampool_nn::{ComputeDType, TokenizePool};

use super::measure::{closed_loop, median_time, Latency, LoopResult, Window};
use super::report::Record;
use super::workloads::{EncoderWorkload, Tokenize, Workload};

/// Request numbers of different threads never overlap below this many calls per thread, so
/// threads cycle through the input pool from different places.
const THREAD_STRIDE: usize = 7919;

fn record(
    device: &Device,
    workload: &Workload,
    scenario: &str,
    rows: usize,
    r: &LoopResult,
) -> Record {
    Record {
        system: "streampool".into(),
        device: device.name(),
        workload: workload.name(),
        scenario: scenario.into(),
        dtype: Some(workload.dtype().to_string()),
        batch: rows,
        throughput_per_s: r.calls_per_s() * rows as f64,
        calls_per_s: r.calls_per_s(),
        latency_ms: r.latency,
        calls: r.calls,
        seconds: r.seconds,
        os_threads: r.os_threads,
        ..Record::default()
    }
}

/// One thread calling the model on pre-formed batches of `batch` rows (upload or
/// tokenization, forward, read-back): the throughput a BatchQueue should approach, and the
/// batch time its p99 bound uses.
pub fn ceiling(device: &Device, w: &Workload, batch: usize, window: Window) -> Result<Record> {
    let r = closed_loop(1, window, || {}, |_, i| w.call(batch, i * batch))?;
    let mut rec = record(device, w, "ceiling", batch, &r);
    rec.threads = Some(1);
    Ok(rec)
}

/// One thread calling the encoder on one batch of `batch` sentences tokenized once, before
/// the loop: each call uploads the token ids and mask, runs the forward, mean-pools and
/// normalizes, and reads the embeddings back. The same counting as PyTorch's `forward`
/// figure in `bench/torch_baseline.py` (tokenization excluded); the MLP has no such split.
/// Before the loop it times tokenizing the batch (medians) by the pool path `embed` uses,
/// by the fast path on one thread and by `tokenizers`' own `encode_batch`, in host
/// nanoseconds per token.
pub fn forward(device: &Device, w: &Workload, batch: usize, window: Window) -> Result<Record> {
    let Workload::Encoder(e) = w else {
        bail!("the forward scenario is for the minilm workloads");
    };
    let input = e.tokenized(batch, 0)?;
    let tokens = input.attention_mask().iter().filter(|&&m| m != 0).count();
    let time =
        |how: Tokenize, reps: usize| median_time(reps, || e.tokenized_by(batch, 0, how).map(drop));
    let pool_s = time(Tokenize::Pool, 7)?;
    let serial_s = time(Tokenize::Serial, 5)?;
    let tokenizers_s = time(Tokenize::Tokenizers, 3)?;
    let per_token = |s: f64| s * 1e9 / tokens.max(1) as f64;
    let r = closed_loop(1, window, || {}, |_, _| e.forward(&input).map(drop))?;
    let mut rec = record(device, w, "forward", batch, &r);
    rec.threads = Some(1);
    rec.tokenize_ms = Some(pool_s * 1e3);
    rec.tokenize_ns_per_token = Some(per_token(pool_s));
    rec.tokenize_serial_ns_per_token = Some(per_token(serial_s));
    rec.tokenize_tokenizers_ns_per_token = Some(per_token(tokenizers_s));
    rec.tokenize_threads = Some(TokenizePool::global().threads());
    Ok(rec)
}

/// [`forward`] on the padded path (scenario `forward-padded`): for the mixed-length workload,
/// whose `forward` runs packed where the embedder packs (f16/bf16 on CPU and CUDA).
pub fn forward_padded(
    device: &Device,
    w: &Workload,
    batch: usize,
    window: Window,
) -> Result<Record> {
    let Workload::Encoder(e) = w else {
        bail!("the forward scenario is for the minilm workloads");
    };
    let input = e.tokenized(batch, 0)?;
    let r = closed_loop(1, window, || {}, |_, _| e.forward_padded(&input).map(drop))?;
    let mut rec = record(device, w, "forward-padded", batch, &r);
    rec.threads = Some(1);
    Ok(rec)
}

/// `threads` threads each calling the shared model with one row at a time.
pub fn threading(device: &Device, w: &Workload, threads: usize, window: Window) -> Result<Record> {
    let r = closed_loop(
        threads,
        window,
        || {},
        |t, i| w.call(1, t * THREAD_STRIDE + i),
    )?;
    let mut rec = record(device, w, "threading", 1, &r);
    rec.threads = Some(threads);
    Ok(rec)
}

/// How one batching point is set up.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetup {
    /// Threads each submitting one request and waiting for it, in a loop.
    pub callers: usize,
    /// The queue's `max_batch_size`.
    pub max_batch: usize,
    /// The queue's `max_wait`.
    pub max_wait: Duration,
    /// The queue's `max_batch_tokens`.
    pub max_batch_tokens: usize,
    /// The queue's worker threads.
    pub workers: usize,
}

/// `callers` threads each sending single requests through a BatchQueue. `ceiling` is the
/// ceiling record at `max_batch` rows, if measured: its throughput and batch time give the
/// ceiling fraction and the p99 bound.
pub fn batching(
    device: &Device,
    w: &Workload,
    setup: QueueSetup,
    window: Window,
    ceiling: Option<&Record>,
) -> Result<Record> {
    let config = BatchConfig {
        max_batch_size: setup.max_batch,
        max_batch_tokens: setup.max_batch_tokens,
        max_wait: setup.max_wait,
        max_queue: setup.callers.max(1) * 2,
        workers: setup.workers,
        ..BatchConfig::default()
    };
    let (r, stats, adapter) = match w {
        Workload::Mlp(m) => {
            let (r, stats) = through_queue(m.clone(), config, setup.callers, window, |i| m.row(i))?;
            (
                r,
                stats,
                std::any::type_name::<super::workloads::MlpWorkload>(),
            )
        }
        Workload::Encoder(e) => {
            let (r, stats) = through_core(e, config, setup.callers, window)?;
            (r, stats, std::any::type_name::<EmbedBatch>())
        }
    };
    let mut rec = record(device, w, "batching", 1, &r);
    rec.adapter = Some(adapter.to_string());
    rec.batch = setup.max_batch;
    rec.callers = Some(setup.callers);
    rec.max_wait_ms = Some(setup.max_wait.as_secs_f64() * 1e3);
    rec.workers = Some(setup.workers);
    rec.mean_batch_size = Some(stats.mean_batch_size);
    let per_batch = |d: Duration, n: u64| (n > 0).then(|| d.as_secs_f64() * 1e3 / n as f64);
    rec.prepare_ms_per_batch = per_batch(stats.prepare, stats.prepared_batches);
    rec.forward_ms_per_batch = per_batch(stats.forward, stats.batches);
    if let Some(c) = ceiling {
        let batch_time = c.latency_ms.p50;
        let bound = setup.max_wait.as_secs_f64() * 1e3 + 2.0 * batch_time;
        rec.batch_time_ms = Some(batch_time);
        rec.p99_bound_ms = Some(bound);
        rec.p99_within_bound = Some(rec.latency_ms.p99 <= bound);
        rec.ceiling_per_s = Some(c.throughput_per_s);
        rec.ceiling_fraction = Some(rec.throughput_per_s / c.throughput_per_s);
    }
    Ok(rec)
}

/// Runs the closed loop through a fresh queue over `model`; returns the loop's figures and
/// the queue's statistics after the warm-up.
fn through_queue<M: BatchModel>(
    model: Arc<M>,
    config: BatchConfig,
    callers: usize,
    window: Window,
    input: impl Fn(usize) -> M::Input + Sync,
) -> Result<(LoopResult, StatsSnapshot)> {
    let queue = BatchQueue::new(model, config)?;
    let r = closed_loop(
        callers,
        window,
        || queue.reset_stats(),
        |t, i| {
            queue.infer(input(t * THREAD_STRIDE + i))?;
            Ok(())
        },
    )?;
    let stats = queue.stats();
    queue.shutdown();
    Ok((r, stats))
}

/// Runs the closed loop through the inference core's embedder (the server's: one replica
/// with `config`, each caller tokenizing its own text through the core, as a server's
/// handler does); the loop's figures and the queue's statistics after the warm-up.
fn through_core(
    e: &EncoderWorkload,
    config: BatchConfig,
    callers: usize,
    window: Window,
) -> Result<(LoopResult, StatsSnapshot)> {
    let model = ModelConfig {
        truncate: true,
        batch: config,
        ..ModelConfig::default()
    };
    let label = e.embedder().model().device().name();
    let endpoint = EmbedderEndpoint::new(vec![(label, e.embedder().clone())], &model)?;
    let r = closed_loop(
        callers,
        window,
        || endpoint.replicas().reset_stats(),
        |t, i| {
            let text = e.text(t * THREAD_STRIDE + i);
            let ids = endpoint.tokenize_texts_blocking(&[&text], None, true)?;
            let handle = endpoint.submit(ids, true, None)?.pop();
            let handle = handle.context("the core answered no handle")?;
            wait_row(handle, 0)?;
            Ok(())
        },
    )?;
    let stats = StatsSnapshot::sum(endpoint.replicas().stats().iter().map(|r| &r.queue));
    endpoint.shutdown();
    Ok((r, stats))
}

fn ops_record(
    device: &Device,
    op: String,
    us: f64,
    latency: Latency,
    calls: u64,
    secs: f64,
) -> Record {
    Record {
        system: "streampool".into(),
        device: device.name(),
        workload: "ops".into(),
        scenario: "overhead".into(),
        dtype: Some(ComputeDType::F32.to_string()),
        threads: Some(1),
        batch: 1,
        throughput_per_s: 1e6 / us,
        calls_per_s: 1e6 / us,
        latency_ms: latency,
        calls,
        seconds: secs,
        op: Some(op),
        us_per_op: Some(us),
        ..Record::default()
    }
}

/// Per-op host cost: `ops` small ops queued on this thread's stream, then one read-back;
/// the median over `reps` runs of the enqueue time per op (and, separately, of the time per
/// op including completion). Then an `n`^3 matmul (median of `reps`, each waited for) against
/// a direct single-threaded `matrixmultiply::sgemm` on the same data.
pub fn overhead(device: &Device, ops: usize, n: usize, reps: usize) -> Result<Vec<Record>> {
    let x = Tensor::full(1.0, &[16], device)?;
    let chain = |count: usize| -> Result<(f64, f64)> {
        let t = Instant::now();
        let mut y = x.clone();
        for _ in 0..count {
            y = y.affine(1.0, 0.5)?.affine(1.0, -0.5)?;
        }
        let queued = t.elapsed().as_secs_f64();
        let v = y.to_vec::<f32>()?;
        let done = t.elapsed().as_secs_f64();
        ensure!(
            v.iter().all(|&e| e == 1.0),
            "overhead chain gave wrong values"
        );
        Ok((queued, done))
    };
    chain(1000)?;
    let pairs = ops / 2;
    let mut runs: Vec<(f64, f64)> = (0..reps.max(1))
        .map(|_| chain(pairs))
        .collect::<Result<_>>()?;
    let per_op = |s: f64| s * 1e6 / (2 * pairs) as f64;
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let enqueue_us = per_op(runs[runs.len() / 2].0);
    runs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let done_us = per_op(runs[runs.len() / 2].1);
    let secs: f64 = runs.iter().map(|r| r.1).sum();
    let calls = (2 * pairs * runs.len()) as u64;
    let mut out = vec![
        ops_record(
            device,
            "enqueue affine [16] (host time, queued)".into(),
            enqueue_us,
            Latency::default(),
            calls,
            secs,
        ),
        ops_record(
            device,
            "affine [16] incl. completion".into(),
            done_us,
            Latency::default(),
            calls,
            secs,
        ),
    ];

    let a = host_values(n * n, 11);
    let b = host_values(n * n, 12);
    let (ta, tb) = (
        Tensor::from_slice(&a, &[n, n], device)?,
        Tensor::from_slice(&b, &[n, n], device)?,
    );
    let stream = device.current_stream()?;
    let mut ours = Vec::new();
    let ours_s = median_time(reps, || {
        let c = ta.matmul(&tb)?;
        stream.synchronize()?;
        ours = vec![c];
        Ok(())
    })?;
    let got = ours[0].to_vec::<f32>()?;
    let mut reference = vec![0.0f32; n * n];
    let ref_s = median_time(reps, || {
        sgemm(n, &a, &b, &mut reference);
        Ok(())
    })?;
    let scale = reference
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(1e-30);
    let err = got
        .iter()
        .zip(&reference)
        .fold(0.0f32, |m, (g, r)| m.max((g - r).abs()))
        / scale;
    ensure!(
        err < 1e-3,
        "matmul {n}^3 differs from sgemm by {err} (relative to max)"
    );
    let mut rec = ops_record(
        device,
        format!("matmul {n}x{n}x{n}"),
        ours_s * 1e6,
        Latency {
            p50: ours_s * 1e3,
            p90: ours_s * 1e3,
            p99: ours_s * 1e3,
        },
        reps as u64,
        ours_s * reps as f64,
    );
    rec.reference_us_per_op = Some(ref_s * 1e6);
    rec.ratio = Some(ours_s / ref_s);
    out.push(rec);
    Ok(out)
}

fn host_values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// `c = a b` for row-major `n x n` matrices, single-threaded `matrixmultiply`.
fn sgemm(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() == n * n && b.len() == n * n && c.len() == n * n);
    let s = n as isize;
    // SAFETY: the three slices hold n*n elements each (asserted above), the strides describe
    // row-major n x n matrices inside them, and `c` does not alias `a` or `b` (it is a
    // distinct `&mut`).
    unsafe {
        matrixmultiply::sgemm(
            n,
            n,
            n,
            1.0,
            a.as_ptr(),
            s,
            1,
            b.as_ptr(),
            s,
            1,
            0.0,
            c.as_mut_ptr(),
            s,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use streampool::Device;
    use streampool_nn::{find_tiny_bert, ComputeDType};

    use super::super::workloads::{EncoderChoice, EncoderWorkload, Workload};
    use super::*;

    fn tiny(seq: usize) -> Arc<EncoderWorkload> {
        let dev = Device::cpu();
        let choice = EncoderChoice {
            dir: find_tiny_bert().unwrap(),
            label: "tiny-bert".into(),
        };
        let emb = EncoderWorkload::load(&dev, &choice, ComputeDType::F32, 4, None).unwrap();
        Arc::new(EncoderWorkload::with_seq(emb, seq).unwrap())
    }

    fn window() -> Window {
        Window {
            warm: Duration::from_millis(20),
            measure: Duration::from_millis(60),
        }
    }

    #[test]
    fn forward_scenario_records_a_pre_tokenized_point_with_its_dtype() {
        let w = Workload::Encoder(tiny(32));
        let rec = forward(&Device::cpu(), &w, 6, window()).unwrap();
        assert_eq!(
            (rec.workload.as_str(), rec.scenario.as_str(), rec.batch),
            ("minilm32", "forward", 6)
        );
        assert_eq!(rec.dtype.as_deref(), Some("f32"));
        assert_eq!(rec.series(), "minilm32 f32");
        assert!(rec.calls > 0 && rec.throughput_per_s > 0.0);
        assert!(rec.tokenize_ms.is_some_and(|t| t > 0.0));
        for ns in [
            rec.tokenize_ns_per_token,
            rec.tokenize_serial_ns_per_token,
            rec.tokenize_tokenizers_ns_per_token,
        ] {
            assert!(ns.is_some_and(|t| t > 0.0));
        }
        assert!(rec.tokenize_threads.is_some_and(|t| t >= 1));
        let json = serde_json::to_value(&rec).unwrap();
        assert_eq!(json["scenario"], "forward");
        assert_eq!(json["dtype"], "f32");
        // The MLP has no tokenization to leave out.
        let mlp = Workload::Mlp(Arc::new(
            super::super::workloads::MlpWorkload::new(&Device::cpu()).unwrap(),
        ));
        assert!(forward(&Device::cpu(), &mlp, 4, window()).is_err());
    }

    /// The mixed-length workload's lengths are the integers `bench/torch_baseline.py`'s
    /// `mix_lengths` computes (printed by that script), so both systems run the same batch.
    #[test]
    fn mixed_lengths_match_the_pytorch_script() {
        let l = super::super::workloads::mix_lengths(512);
        assert_eq!(
            &l[..12],
            &[12, 33, 8, 67, 19, 55, 48, 67, 36, 179, 124, 112]
        );
        let (sum, min, max) = (
            l.iter().sum::<usize>(),
            *l.iter().min().unwrap(),
            *l.iter().max().unwrap(),
        );
        assert_eq!((sum, min, max), (37356, 8, 255));
        assert_eq!(super::super::workloads::mix_lengths(64), l[..64]);
    }

    /// The batching scenario's queue is the inference core's embedder: callers through it
    /// get the direct call's embeddings, and the record names the adapter.
    #[test]
    fn batching_runs_the_core_adapter_and_gives_the_direct_embeddings() {
        let w = tiny(32);
        let texts: Vec<String> = (0..7).map(|i| w.text(i)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let direct = w.embedder().embed(&refs).unwrap();
        let model = ModelConfig {
            truncate: true,
            ..ModelConfig::default()
        };
        let endpoint =
            EmbedderEndpoint::new(vec![("cpu".into(), w.embedder().clone())], &model).unwrap();
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = refs
                .iter()
                .map(|t| {
                    let e = &endpoint;
                    s.spawn(move || {
                        let ids = e.tokenize_texts_blocking(&[t], None, true).unwrap();
                        let h = e.submit(ids, true, None).unwrap().pop().unwrap();
                        wait_row(h, 0).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (a, b) in got.iter().zip(&direct) {
            let err = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-5, "queued and direct embeddings differ by {err}");
        }
        let setup = QueueSetup {
            callers: 2,
            max_batch: 4,
            max_wait: Duration::ZERO,
            max_batch_tokens: 4096,
            workers: 1,
        };
        let rec = batching(&Device::cpu(), &Workload::Encoder(w), setup, window(), None).unwrap();
        assert!(rec.calls > 0);
        assert_eq!(
            rec.adapter.as_deref(),
            Some(std::any::type_name::<EmbedBatch>())
        );
    }
}
