//! The CPU soak as part of `cargo test`: `streampool soak` with thread churn, run as the user
//! runs it (the built binary), checking every result against its reference. It exits with an
//! error on any mismatch or failed op; the test also reads the summary line.
//!
//! This is CI's soak: a separate `cargo run` of the CLI cost CI a build of its own (minutes on
//! two cores) for a run of seconds.

use std::process::Command;

#[test]
fn cpu_soak_with_thread_churn_has_no_mismatches() {
    let out = Command::new(env!("CARGO_BIN_EXE_streampool"))
        .args([
            "soak",
            "--device",
            "cpu",
            "--ops",
            "300000",
            "--threads",
            "1..64",
            "--churn",
        ])
        .output()
        .expect("run the streampool binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "soak failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("mismatches 0, errors 0") && stdout.contains("with churn"),
        "unexpected summary:\n{stdout}\n{stderr}"
    );
}
