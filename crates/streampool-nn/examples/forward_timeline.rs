//! Where one pre-tokenized embedding call's time goes on the device's timeline: the call the
//! `streampool bench` forward scenario makes (`embed_input` then `to_vec`), split with timed
//! events on the stream and `Instant`s on the host, next to the same calls queued back to
//! back with no read-back (what the device alone needs per call) and a read-back alone.
//!
//! ```text
//! cargo run --release --features cuda -p streampool-nn --example forward_timeline -- \
//!     DIR --device cuda --dtype f16 --batch 512 --seq 128 --iters 40
//! ```
//! With `--loop-forward N` it only makes N such calls (for `ncu`).
//!
//! Columns of the split (medians over the iterations, ms): `fwd gpu` from before the
//! forward is queued to after (uploads, embeddings, layers, and any wait of the device for
//! the host), `pool gpu`, `back gpu` from the pool to after the read-back returned (copy,
//! the host's wake-up and its copy out of pinned memory), `gap gpu` from there to the next
//! call's first work (the host between calls); and the host's time to queue the forward and
//! the pool and to wait for the read-back.

use std::time::Instant;

use streampool::{Device, Event, Tensor};
use streampool_nn::{BertModel, BertTokenizer, ComputeDType, SentenceEmbedder};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn device(spec: &str) -> Res<Device> {
    Ok(match spec {
        "cpu" => Device::cpu(),
        #[cfg(feature = "cuda")]
        "cuda" => Device::cuda(0)?,
        other => return Err(format!("unknown device {other}").into()),
    })
}

fn ms(a: &Event, b: &Event) -> Res<f64> {
    Ok(b.elapsed_since(a)?.as_secs_f64() * 1e3)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().filter(|a| !a.starts_with("--")) else {
        return Err("usage: forward_timeline DIR [--device cpu|cuda] [--dtype f16] [--batch 512] [--seq 128] [--iters 40] [--loop-forward N]".into());
    };
    let dev = device(arg(&args, "--device").unwrap_or("cpu"))?;
    let dtype: ComputeDType = arg(&args, "--dtype").unwrap_or("f16").parse()?;
    let batch: usize = arg(&args, "--batch").unwrap_or("512").parse()?;
    let seq: usize = arg(&args, "--seq").unwrap_or("128").parse()?;
    let iters: usize = arg(&args, "--iters").unwrap_or("40").parse()?;
    let bert = BertModel::load_with(&dev, dir, dtype)?;
    let max = bert.config().max_position_embeddings;
    let tokenizer =
        BertTokenizer::from_file(std::path::Path::new(dir).join("tokenizer.json"), max)?;
    let model = SentenceEmbedder::new(tokenizer, bert)?;
    let bert = model.model();
    let pooling = model.pooling();
    let stream = dev.current_stream()?;
    // "the" is one token: seq - 2 of them plus [CLS] and [SEP].
    let text = vec!["the"; seq.saturating_sub(2)].join(" ");
    let texts: Vec<&str> = vec![text.as_str(); batch];
    let input = model.tokenize(&texts)?;
    if input.seq_len() != seq {
        return Err(format!("tokenized to {} tokens, not {seq}", input.seq_len()).into());
    }
    let call = || -> Res<Vec<f32>> { Ok(model.embed_input(&input)?.to_vec::<f32>()?) };
    if let Some(n) = arg(&args, "--loop-forward") {
        // Only the bench's calls, back to back: what a kernel profiler (ncu) should see.
        for _ in 0..n.parse::<usize>()? {
            call()?;
        }
        return Ok(());
    }
    for _ in 0..5 {
        call()?;
    }
    println!(
        "device {} dtype {dtype} batch {batch} seq {seq}",
        dev.name()
    );

    // 1. The bench's call as it runs, timed per call on the host.
    let mut plain = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(call()?);
        plain.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // 2. The same call split by events (the steps `embed_input` takes for an unpadded batch).
    struct Marks {
        ev: [Event; 4],
        host: [Instant; 4],
    }
    let mut marks = Vec::with_capacity(iters);
    for _ in 0..iters {
        let h0 = Instant::now();
        let e0 = Event::record(&stream)?;
        let hidden = bert.forward(&input)?;
        let h1 = Instant::now();
        let e1 = Event::record(&stream)?;
        let pooled = pooling.pool(&hidden, input.attention_mask(), pooling.normalize)?;
        let h2 = Instant::now();
        let e2 = Event::record(&stream)?;
        drop(hidden);
        std::hint::black_box(pooled.to_vec::<f32>()?);
        let h3 = Instant::now();
        let e3 = Event::record(&stream)?;
        marks.push(Marks {
            ev: [e0, e1, e2, e3],
            host: [h0, h1, h2, h3],
        });
    }
    stream.synchronize()?;
    let mut cols: [Vec<f64>; 8] = Default::default();
    for (i, m) in marks.iter().enumerate() {
        cols[0].push(ms(&m.ev[0], &m.ev[1])?);
        cols[1].push(ms(&m.ev[1], &m.ev[2])?);
        cols[2].push(ms(&m.ev[2], &m.ev[3])?);
        if let Some(next) = marks.get(i + 1) {
            cols[3].push(ms(&m.ev[3], &next.ev[0])?);
            cols[7].push((next.host[0] - m.host[0]).as_secs_f64() * 1e3);
        }
        for k in 0..3 {
            cols[4 + k].push((m.host[k + 1] - m.host[k]).as_secs_f64() * 1e3);
        }
    }
    let [fwd, pool, back, gap, q_fwd, q_pool, wait, total] = cols.map(median);
    println!(
        "split (ms): fwd gpu {fwd:.3} | pool gpu {pool:.3} | back gpu {back:.3} | gap gpu {gap:.3} || host: queue fwd {q_fwd:.3} | queue pool {q_pool:.3} | read-back wait {wait:.3} | per call {total:.3}"
    );

    // 3. The device alone: calls queued back to back, one read-back at the end.
    let e0 = Event::record(&stream)?;
    let t = Instant::now();
    let mut kept: Vec<Tensor> = Vec::with_capacity(iters);
    for _ in 0..iters {
        kept.push(model.embed_input(&input)?);
    }
    let queued = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
    let e1 = Event::record(&stream)?;
    e1.synchronize()?;
    let device_per_call = ms(&e0, &e1)? / iters as f64;
    drop(kept);

    // 4. The read-back alone, of a result of the same shape.
    let pooled = model.embed_input(&input)?;
    stream.synchronize()?;
    let mut back_alone = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::hint::black_box(pooled.to_vec::<f32>()?);
        back_alone.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let plain = median(plain);
    println!(
        "bench call {plain:.3} ms ({:.0} sent/s) | queued back to back: device {device_per_call:.3} ms/call ({:.0} sent/s), host queues in {queued:.3} | read-back alone {:.3} ms",
        batch as f64 / plain * 1e3,
        batch as f64 / device_per_call * 1e3,
        median(back_alone)
    );
    Ok(())
}
