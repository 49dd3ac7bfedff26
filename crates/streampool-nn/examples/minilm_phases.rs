//! Where a sentence-embedding batch's time goes: host tokenization, the forward (embeddings and
//! encoder layers) and pooling + read-back, each timed after a device synchronize (medians).
//!
//! ```text
//! cargo run --release --features cuda -p streampool-nn --example minilm_phases -- \
//!     DIR --device cuda --dtype f16 --batches 64,512 --seqs 32,128 --iters 20
//! ```
//! With `--loop-forward N` it instead runs N pre-tokenized forwards back to back (no phase
//! timers), which is what a kernel profiler (`ncu`) should look at.

use std::time::Instant;

use streampool::{Device, Tensor};
use streampool_nn::{BertModel, BertTokenizer, ComputeDType, SentenceEmbedder};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn list(s: &str) -> Res<Vec<usize>> {
    Ok(s.split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn device(spec: &str) -> Res<Device> {
    Ok(match spec {
        "cpu" => Device::cpu(),
        #[cfg(feature = "cuda")]
        "cuda" => Device::cuda(0)?,
        #[cfg(feature = "wgpu")]
        "wgpu" => Device::wgpu()?,
        other => return Err(format!("unknown device {other}").into()),
    })
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().filter(|a| !a.starts_with("--")) else {
        return Err("usage: minilm_phases DIR [--device cpu|cuda] [--dtype f16] [--batches 64,512] [--seqs 32,128] [--iters 20] [--loop-forward N]".into());
    };
    let dev = device(arg(&args, "--device").unwrap_or("cpu"))?;
    let dtype: ComputeDType = arg(&args, "--dtype").unwrap_or("f32").parse()?;
    let batches = list(arg(&args, "--batches").unwrap_or("64,512"))?;
    let seqs = list(arg(&args, "--seqs").unwrap_or("32,128"))?;
    let iters: usize = arg(&args, "--iters").unwrap_or("20").parse()?;
    // Truncation at the model's positions (512 for MiniLM), not sentence-transformers' 256,
    // so the long-sequence points run their full length.
    let bert = BertModel::load_with(&dev, dir, dtype)?;
    let max = bert.config().max_position_embeddings;
    let tokenizer =
        BertTokenizer::from_file(std::path::Path::new(dir).join("tokenizer.json"), max)?;
    let model = SentenceEmbedder::new(tokenizer, bert)?;
    let stream = dev.current_stream()?;
    println!("device {} dtype {dtype}", dev.name());
    println!(
        "{:>5} {:>4} | {:>9} {:>9} {:>9} | {:>9} {:>11} {:>8}",
        "batch", "seq", "tok ms", "fwd ms", "pool ms", "total ms", "sent/s", "tok %"
    );
    for &seq in &seqs {
        // "the" is one token: seq - 2 of them plus [CLS] and [SEP].
        let text = vec!["the"; seq.saturating_sub(2)].join(" ");
        for &batch in &batches {
            let texts: Vec<&str> = vec![text.as_str(); batch];
            let input = model.tokenize(&texts)?;
            if input.seq_len() != seq {
                return Err(format!("tokenized to {} tokens, not {seq}", input.seq_len()).into());
            }
            if let Some(n) = arg(&args, "--loop-forward") {
                let n: usize = n.parse()?;
                // One forward first (pipeline builds, first allocations), left out of the
                // profile (STREAMPOOL_WGPU_PROFILE=1) printed per forward below.
                model.embed_input(&input)?.to_vec::<f32>()?;
                #[cfg(feature = "wgpu")]
                let _ = streampool::wgpu_profile();
                let t0 = Instant::now();
                for _ in 0..n {
                    model.embed_input(&input)?.to_vec::<f32>()?;
                }
                let wall = t0.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64;
                println!("{batch:>5} {seq:>4} | {n} forwards, {wall:.3} ms each (wall, read-back included)");
                #[cfg(feature = "wgpu")]
                print_wgpu_profile(n);
                continue;
            }
            let bert = model.model();
            let mut phases: [Vec<f64>; 4] = Default::default();
            for i in 0..iters + 3 {
                let t0 = Instant::now();
                let input = model.tokenize(&texts)?;
                let t1 = Instant::now();
                // The full forward (graph replay of the layers where the device has graphs),
                // then the same embedding and pooling steps alone to split it.
                let out: Tensor = model.embed_input(&input)?;
                let v = out.to_vec::<f32>()?;
                let t2 = Instant::now();
                stream.synchronize()?;
                let hidden = bert.forward(&input)?;
                stream.synchronize()?;
                let t3 = Instant::now();
                drop(hidden);
                if i >= 3 {
                    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                    phases[0].push(ms(t0, t1));
                    phases[1].push(ms(t2, t3));
                    phases[2].push(ms(t1, t2) - ms(t2, t3));
                    phases[3].push(ms(t0, t2));
                }
                assert_eq!(v.len(), batch * model.dim());
            }
            let [tok, fwd, pool, total] = phases.map(median);
            println!(
                "{batch:>5} {seq:>4} | {tok:>9.3} {fwd:>9.3} {pool:>9.3} | {total:>9.3} {:>11.0} {:>7.1}%",
                batch as f64 / total * 1e3,
                tok / total * 100.0
            );
        }
    }
    Ok(())
}

/// The wgpu profile of the last `n` forwards, per forward: the GPU's time in kernels and
/// between passes, then each kernel and shape with its share, time and rate. Prints nothing
/// unless `STREAMPOOL_WGPU_PROFILE=1` (or `host`) is set.
#[cfg(feature = "wgpu")]
fn print_wgpu_profile(n: usize) {
    let p = streampool::wgpu_profile();
    let n = n.max(1) as f64;
    for a in &p.unsupported {
        println!("  {a}: no TIMESTAMP_QUERY, no kernel times");
    }
    if p.stretches > 0 {
        let idle = p.span_ns.saturating_sub(p.busy_ns);
        println!(
            "  GPU per forward: {:.3} ms spanned, {:.3} ms in kernels, {:.3} ms ({:.1}%) between passes",
            p.span_ns as f64 / 1e6 / n,
            p.busy_ns as f64 / 1e6 / n,
            idle as f64 / 1e6 / n,
            100.0 * idle as f64 / p.span_ns.max(1) as f64
        );
    }
    for k in &p.kernels {
        println!(
            "  {:5.1}% {:>8.3} ms x{:>5.1} {:>13}  {}",
            100.0 * k.total_ns as f64 / p.busy_ns.max(1) as f64,
            k.total_ns as f64 / 1e6 / n,
            k.calls as f64 / n,
            k.rate(),
            k.label
        );
    }
    for k in &p.host {
        println!(
            "  host {:>9.1} us x{:>6.1}  {}",
            k.total_ns as f64 / 1e3 / k.calls.max(1) as f64,
            k.calls as f64 / n,
            k.label
        );
    }
}
