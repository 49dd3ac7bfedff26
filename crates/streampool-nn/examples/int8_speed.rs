//! int8 against f32 on the CPU: a sentence encoder's forward (a pre-tokenized batch of
//! random ids, pooled, the embeddings read back) in rounds that each run one f32 forward and
//! one int8 forward back to back, the order alternating, so both meet the same host load.
//! Per point: the medians of wall time and of process CPU time (user + system, every thread)
//! per forward, and the int8/f32 speed ratios of both. On a host shared with other work the
//! CPU-time ratio is the one the others' load disturbs least (their threads take cores away,
//! which stretches wall time but not the CPU time ours spend); on an idle host the two agree.
//! The int8 model is loaded with the accuracy gate forced off (this measures speed only).
//!
//! ```text
//! cargo run --release -p streampool-nn --example int8_speed -- DIR \
//!     --batches 1,64 --seqs 32,128 --rounds 7 [--json OUT.json]
//! ```

use std::time::Instant;

use streampool::Device;
use streampool_nn::accuracy::QuantizationGate;
use streampool_nn::{BertInput, ComputeDType, LoadOptions, SentenceEmbedder};

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

/// CPU time this process has spent, every thread, in seconds.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Wall and CPU seconds of one forward of `input`, embeddings read back.
fn forward(emb: &SentenceEmbedder, input: &BertInput) -> Res<(f64, f64)> {
    let (w0, c0) = (Instant::now(), cpu_seconds());
    let out = emb.embed_input(input)?.to_vec::<f32>()?;
    let (wall, cpu) = (w0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    assert!(out.iter().all(|v| v.is_finite()));
    Ok((wall, cpu))
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().filter(|a| !a.starts_with("--")) else {
        return Err(
            "usage: int8_speed DIR [--batches 1,64] [--seqs 32,128] [--rounds 7] [--json OUT]"
                .into(),
        );
    };
    let batches = list(arg(&args, "--batches").unwrap_or("1,64"))?;
    let seqs = list(arg(&args, "--seqs").unwrap_or("32,128"))?;
    let rounds: usize = arg(&args, "--rounds").unwrap_or("7").parse()?;
    let dev = Device::cpu();
    let f32s = SentenceEmbedder::load(&dev, dir)?;
    let int8 = SentenceEmbedder::load_with_options(
        &dev,
        dir,
        &LoadOptions {
            dtype: ComputeDType::Int8,
            gate: QuantizationGate::Force,
            ..LoadOptions::default()
        },
    )?;
    println!(
        "int8 vs f32, {} CPU threads, {rounds} rounds per point (medians per forward)",
        streampool::cpu_threads()
    );
    println!(
        "tokens batch   f32 wall ms  int8 wall ms  wall ratio   f32 cpu ms  int8 cpu ms  cpu ratio"
    );
    let mut points = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for &seq in &seqs {
        for &batch in &batches {
            // Random ids (a fixed sequence), [CLS] first and [SEP] last, no padding.
            let ids: Vec<i64> = (0..batch * seq)
                .map(|i| match i % seq {
                    0 => 101,
                    p if p == seq - 1 => 102,
                    _ => {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        1000 + (seed % 20000) as i64
                    }
                })
                .collect();
            let input = BertInput::new(ids, vec![1; batch * seq], None, batch)?;
            // Warm-up: shapes seen, the int8 weights quantized.
            forward(&f32s, &input)?;
            forward(&int8, &input)?;
            let (mut fw, mut fc, mut iw, mut ic) = (vec![], vec![], vec![], vec![]);
            let (mut rw, mut rc) = (vec![], vec![]);
            for r in 0..rounds {
                let (f, i) = if r % 2 == 0 {
                    let f = forward(&f32s, &input)?;
                    (f, forward(&int8, &input)?)
                } else {
                    let i = forward(&int8, &input)?;
                    (forward(&f32s, &input)?, i)
                };
                fw.push(f.0);
                fc.push(f.1);
                iw.push(i.0);
                ic.push(i.1);
                rw.push(f.0 / i.0);
                rc.push(f.1 / i.1);
            }
            let p = [
                median(fw),
                median(iw),
                median(rw.clone()),
                median(fc),
                median(ic),
                median(rc.clone()),
            ];
            println!(
                "{seq:>6} {batch:>5} {:>13.2} {:>13.2} {:>10.2}x {:>12.2} {:>12.2} {:>9.2}x",
                p[0] * 1e3,
                p[1] * 1e3,
                p[2],
                p[3] * 1e3,
                p[4] * 1e3,
                p[5]
            );
            points.push(serde_json::json!({
                "tokens": seq, "batch": batch,
                "f32_wall_ms": p[0] * 1e3, "int8_wall_ms": p[1] * 1e3, "wall_ratio": p[2],
                "f32_cpu_ms": p[3] * 1e3, "int8_cpu_ms": p[4] * 1e3, "cpu_ratio": p[5],
                "wall_ratios": rw, "cpu_ratios": rc,
            }));
        }
    }
    if let Some(out) = arg(&args, "--json") {
        let json = serde_json::json!({
            "cpu_threads": streampool::cpu_threads(),
            "rounds": rounds,
            "points": points,
        });
        std::fs::write(out, serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
