//! The shared result schema (also written by `bench/torch_baseline.py`), the JSON file, the
//! table and the target checks that need only our own figures.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::measure::Latency;

/// One measured point. Field names are shared with `bench/torch_baseline.py`; fields that do
/// not apply to a scenario are left out of the JSON.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    /// `streampool` (here) or `pytorch`.
    pub system: String,
    /// The device, e.g. `cpu` or `cuda:0 (NVIDIA H100 80GB HBM3)`.
    pub device: String,
    /// `mlp`, `minilm32`, `minilm128`, or `ops` for the overhead scenario.
    pub workload: String,
    /// `threading`, `batching`, `ceiling`, `forward` (pre-tokenized: forward, pooling and
    /// read-back only; packed for `minilm-mix` where the embedder packs), `forward-padded`
    /// (`minilm-mix` on the padded path) or `overhead`.
    pub scenario: String,
    /// The compute dtype of the point: `f32`, `tf32`, `f16` or `bf16` (the MLP and the ops are
    /// always `f32`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Threads calling the model directly (threading, ceiling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Threads each submitting one request at a time to a BatchQueue (batching).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callers: Option<usize>,
    /// Rows (MLP inputs or sentences) per call; for batching, the queue's `max_batch_size`.
    pub batch: usize,
    /// Rows (MLP rows or sentence embeddings) per second.
    pub throughput_per_s: f64,
    /// Calls (forwards, or requests for batching) per second.
    pub calls_per_s: f64,
    /// Per-call (per-request for batching) latency percentiles.
    pub latency_ms: Latency,
    /// Calls measured and the measured span.
    pub calls: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// The model behind a minilm workload and its compute dtype (`all-MiniLM-L6-v2 f16`,
    /// `tiny-bert f32`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Threads of the whole process while the point ran (Linux), callers included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os_threads: Option<usize>,
    /// Batching: the queue's wait window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<f64>,
    /// Batching: worker threads of the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Batching: mean requests per batch (from the queue's statistics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_batch_size: Option<f64>,
    /// Batching: the median time of one pre-formed batch of `batch` rows (ceiling scenario).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_time_ms: Option<f64>,
    /// Batching: `max_wait + 2 * batch_time`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_bound_ms: Option<f64>,
    /// Batching: whether p99 latency is within the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_within_bound: Option<bool>,
    /// Batching: the ceiling's throughput at batch `batch`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_per_s: Option<f64>,
    /// Batching: `throughput_per_s / ceiling_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_fraction: Option<f64>,
    /// Forward: milliseconds to tokenize this batch (median of a few, outside the timed
    /// loop), so `tokenize_ms / (tokenize_ms + p50)` is the host share of an end-to-end call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenize_ms: Option<f64>,
    /// Forward (minilm): host nanoseconds per token to tokenize this batch as `embed` does
    /// (fast path; on the tokenization pool when the batch is large).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenize_ns_per_token: Option<f64>,
    /// Forward (minilm): the same on one thread (the fast path, no pool).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenize_serial_ns_per_token: Option<f64>,
    /// Forward (minilm): the same through `tokenizers`' own `encode_batch` (the path before
    /// the fast path; parallel on rayon's global pool unless `TOKENIZERS_PARALLELISM` is false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenize_tokenizers_ns_per_token: Option<f64>,
    /// Forward (minilm): threads of the tokenization pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenize_threads: Option<usize>,
    /// Batching: the batch adapter the queue ran (the inference core's `EmbedBatch` for the
    /// encoder workloads: the server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Batching: mean milliseconds per batch in the model's host preparation step
    /// (tokenization; only when the queue runs a preparing stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepare_ms_per_batch: Option<f64>,
    /// Batching: mean milliseconds per batch inside the model's forward (tokenization
    /// included when there is no preparing stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_ms_per_batch: Option<f64>,
    /// Ceiling and batching (minilm): `throughput_per_s` over the forward scenario's
    /// (pre-tokenized) throughput at batch `batch` in the same run, when measured: how close
    /// end to end (the ceiling: tokenization included) or the queue comes to the forward.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_fraction: Option<f64>,
    /// Overhead: what was timed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Overhead: microseconds per op (host enqueue time, or one matmul with its sync).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub us_per_op: Option<f64>,
    /// Overhead: the reference's microseconds per op (single-threaded `matrixmultiply::sgemm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_us_per_op: Option<f64>,
    /// Overhead: `us_per_op / reference_us_per_op`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

impl Record {
    /// The workload with the dtype for the encoder workloads (`minilm32 f16`), so points of
    /// several dtypes of one run stay apart in checks, tables and plots.
    pub fn series(&self) -> String {
        match &self.dtype {
            Some(d) if self.workload.starts_with("minilm") => format!("{} {d}", self.workload),
            _ => self.workload.clone(),
        }
    }
}

/// One target and whether our own figures meet it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked, with the figures.
    pub target: String,
    /// The measured value.
    pub value: f64,
    /// The threshold.
    pub threshold: f64,
    /// Met or not.
    pub pass: bool,
}

/// The whole JSON file.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `streampool`.
    pub system: String,
    /// The device.
    pub device: String,
    /// When it ran (UTC, ISO 8601).
    pub date: String,
    /// The command line.
    pub command: String,
    /// CPU device: threads of the intra-op pool that every stream shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_threads: Option<usize>,
    /// CPU device: the path `bf16` products take (`amx`, `avx512` or `portable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_bf16_path: Option<String>,
    /// The host's CPU model and the cores this process may use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The measured points.
    pub results: Vec<Record>,
    /// The targets checked from our figures alone (cross-system ones: `bench/compare.py`).
    pub checks: Vec<Check>,
    /// Points that failed, with their errors.
    pub errors: Vec<String>,
}

/// The host's CPU model (Linux `/proc/cpuinfo`) and the cores this process may use.
pub fn host_description() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {cores} cores")
}

impl Report {
    /// Writes the report as pretty JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}

fn find<'a>(
    results: &'a [Record],
    workload: &str,
    scenario: &str,
    pred: impl Fn(&Record) -> bool,
) -> Option<&'a Record> {
    results
        .iter()
        .find(|r| r.workload == workload && r.scenario == scenario && pred(r))
}

/// The batch and fraction of the end-to-end target: in process, text in, at batch 512, at
/// least 85% of the pre-tokenized forward's sentences per second (the tokenization must
/// overlap the device, not add to it).
const E2E_BATCH: usize = 512;
const E2E_FRACTION: f64 = 0.85;

/// The targets we can judge from our own figures: threading 8 threads >= 6x one (MLP),
/// BatchQueue at the most callers >= 90% of the ceiling with p99 within its bound (each
/// workload: the best configuration), end to end at batch 512 >= 85% of the forward
/// (minilm, GPU runs), and the CPU overhead targets.
pub fn checks(results: &[Record], cpu: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let one = find(results, "mlp", "threading", |r| r.threads == Some(1));
    let eight = find(results, "mlp", "threading", |r| r.threads == Some(8));
    if let (Some(one), Some(eight)) = (one, eight) {
        let v = eight.throughput_per_s / one.throughput_per_s;
        out.push(Check {
            target: format!(
                "mlp threading: 8 threads / 1 thread >= 6x ({:.0} / {:.0} per s)",
                eight.throughput_per_s, one.throughput_per_s
            ),
            value: v,
            threshold: 6.0,
            pass: v >= 6.0,
        });
    }
    let mut series: Vec<String> = Vec::new();
    for r in results {
        if !series.contains(&r.series()) {
            series.push(r.series());
        }
    }
    for w in &series {
        let most = results
            .iter()
            .filter(|r| &r.series() == w && r.scenario == "batching")
            .filter_map(|r| r.callers)
            .max();
        let Some(most) = most else { continue };
        // The configuration that meets both targets with the most throughput; if none does,
        // the one closest to the ceiling.
        let candidates: Vec<&Record> = results
            .iter()
            .filter(|r| &r.series() == w && r.scenario == "batching" && r.callers == Some(most))
            .filter(|r| r.ceiling_fraction.is_some())
            .collect();
        let meets = |r: &&&Record| {
            r.ceiling_fraction.unwrap_or(0.0) >= 0.9 && r.p99_within_bound == Some(true)
        };
        let best = candidates
            .iter()
            .filter(meets)
            .max_by(|a, b| a.throughput_per_s.total_cmp(&b.throughput_per_s))
            .or_else(|| {
                candidates.iter().max_by(|a, b| {
                    let f = |r: &Record| r.ceiling_fraction.unwrap_or(0.0);
                    f(a).total_cmp(&f(b))
                })
            })
            .copied();
        let Some(best) = best else { continue };
        let frac = best.ceiling_fraction.unwrap_or(0.0);
        let config = format!(
            "max_batch {}, max_wait {} ms",
            best.batch,
            best.max_wait_ms.unwrap_or(0.0)
        );
        out.push(Check {
            target: format!(
                "{w} batching, {most} callers, best config ({config}): >= 90% of the ceiling ({:.0} / {:.0} per s)",
                best.throughput_per_s,
                best.ceiling_per_s.unwrap_or(0.0)
            ),
            value: frac,
            threshold: 0.9,
            pass: frac >= 0.9,
        });
        if let (Some(bound), Some(ok)) = (best.p99_bound_ms, best.p99_within_bound) {
            out.push(Check {
                target: format!(
                    "{w} batching, {most} callers ({config}): p99 {:.2} ms <= max_wait + 2 batch times",
                    best.latency_ms.p99
                ),
                value: best.latency_ms.p99,
                threshold: bound,
                pass: ok,
            });
        }
    }
    // End to end (tokenization included) against the pre-tokenized forward, batch 512: a GPU
    // target (on the CPU backend the forward dwarfs tokenization, and a point is one call).
    let e2e = |r: &&Record| !cpu && r.scenario == "ceiling" && r.batch == E2E_BATCH;
    for r in results.iter().filter(e2e) {
        if let Some(f) = r.forward_fraction {
            out.push(Check {
                target: format!(
                    "{} end to end at batch {E2E_BATCH} >= {:.0}% of the pre-tokenized forward ({:.0} per s)",
                    r.series(),
                    100.0 * E2E_FRACTION,
                    r.throughput_per_s
                ),
                value: f,
                threshold: E2E_FRACTION,
                pass: f >= E2E_FRACTION,
            });
        }
    }
    if cpu {
        for r in results.iter().filter(|r| r.scenario == "overhead") {
            match (r.op.as_deref(), r.us_per_op, r.ratio) {
                (Some(op), Some(us), None) if op.starts_with("enqueue") => out.push(Check {
                    target: format!("per-op host cost ({op}) < 5 us"),
                    value: us,
                    threshold: 5.0,
                    pass: us < 5.0,
                }),
                (Some(op), _, Some(ratio)) => out.push(Check {
                    target: format!("{op}: within 2x of single-threaded sgemm"),
                    value: ratio,
                    threshold: 2.0,
                    pass: ratio <= 2.0,
                }),
                _ => {}
            }
        }
    }
    out
}

fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Prints every point as one table, then the checks.
pub fn print(report: &Report) {
    println!("\nstreampool bench on {} ({})", report.device, report.date);
    println!(
        "{:<15} {:<10} {:>7} {:>6} {:>12} {:>9} {:>9} {:>9}  notes",
        "workload", "scenario", "thr/cal", "batch", "rows/s", "p50 ms", "p90 ms", "p99 ms"
    );
    for r in &report.results {
        let who = r.threads.or(r.callers).unwrap_or(1);
        let notes = match r.scenario.as_str() {
            "batching" => format!(
                "wait {} ms, mean batch {:.1}, prepare/forward {:.2}/{:.2} ms per batch, {:.0}% of ceiling, p99 bound {:.2} ms {}",
                r.max_wait_ms.unwrap_or(0.0),
                r.mean_batch_size.unwrap_or(0.0),
                r.prepare_ms_per_batch.unwrap_or(0.0),
                r.forward_ms_per_batch.unwrap_or(0.0),
                100.0 * r.ceiling_fraction.unwrap_or(0.0),
                r.p99_bound_ms.unwrap_or(0.0),
                match r.p99_within_bound {
                    Some(true) => "ok",
                    Some(false) => "EXCEEDED",
                    None => "",
                }
            ),
            "forward" => format!(
                "{}; tokenize {:.3} ms, ns/token: {:.1} pool ({} thr), {:.1} 1 thread, {:.0} tokenizers",
                r.model.clone().unwrap_or_default(),
                r.tokenize_ms.unwrap_or(0.0),
                r.tokenize_ns_per_token.unwrap_or(0.0),
                r.tokenize_threads.unwrap_or(0),
                r.tokenize_serial_ns_per_token.unwrap_or(0.0),
                r.tokenize_tokenizers_ns_per_token.unwrap_or(0.0)
            ),
            "ceiling" => match r.forward_fraction {
                Some(f) => format!(
                    "{}; {:.0}% of forward",
                    r.model.clone().unwrap_or_default(),
                    100.0 * f
                ),
                None => r.model.clone().unwrap_or_default(),
            },
            "overhead" => match (r.us_per_op, r.reference_us_per_op, r.ratio) {
                (Some(us), Some(rf), Some(ratio)) => format!(
                    "{}: {us:.1} us vs sgemm {rf:.1} us ({ratio:.2}x)",
                    r.op.as_deref().unwrap_or("")
                ),
                (Some(us), _, _) => format!("{}: {us:.2} us/op", r.op.as_deref().unwrap_or("")),
                _ => String::new(),
            },
            _ => r.model.clone().unwrap_or_default(),
        };
        println!(
            "{:<15} {:<10} {:>7} {:>6} {:>12} {:>9.3} {:>9.3} {:>9.3}  {}",
            r.series(),
            r.scenario,
            who,
            r.batch,
            fmt_rate(r.throughput_per_s),
            r.latency_ms.p50,
            r.latency_ms.p90,
            r.latency_ms.p99,
            notes
        );
    }
    if !report.checks.is_empty() {
        println!("\ntargets (own figures; cross-system targets: bench/compare.py)");
        for c in &report.checks {
            println!(
                "  [{}] {}: {:.3} (threshold {:.3})",
                if c.pass { "PASS" } else { "FAIL" },
                c.target,
                c.value,
                c.threshold
            );
        }
    }
}

/// Today's date and time in UTC, ISO 8601, from the system clock (no calendar crate needed).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(scenario: &str, batch: usize, rows_per_s: f64, fraction: Option<f64>) -> Record {
        Record {
            workload: "minilm32".into(),
            scenario: scenario.into(),
            dtype: Some("f16".into()),
            batch,
            throughput_per_s: rows_per_s,
            forward_fraction: fraction,
            ..Record::default()
        }
    }

    /// The end-to-end target is checked per series at batch 512 from the ceiling's fraction
    /// of the forward, on GPU runs only.
    #[test]
    fn end_to_end_check_at_batch_512() {
        let results = vec![
            point("forward", 512, 300_000.0, None),
            point("ceiling", 512, 270_000.0, Some(0.9)),
            point("ceiling", 64, 10_000.0, Some(0.1)),
        ];
        let gpu = checks(&results, false);
        assert_eq!(gpu.len(), 1, "{gpu:?}");
        assert!(gpu[0].pass && gpu[0].target.contains("minilm32 f16 end to end"));
        assert_eq!((gpu[0].value, gpu[0].threshold), (0.9, 0.85));
        let slow = vec![point("ceiling", 512, 200_000.0, Some(0.66))];
        assert!(!checks(&slow, false)[0].pass);
        assert!(checks(&results, true).is_empty());
    }
}
