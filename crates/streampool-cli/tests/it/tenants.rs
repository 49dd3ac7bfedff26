//! `streampool serve --tenants-file`: each tenant's key opens its own models, the flag
//! excludes the single-key flags, and `serve --help` explains the file.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const KEY: &str = "sp-cli-tenant-0123456789abcdef";

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// A tenants file in a folder of the test's own (`name`); the test removes the folder.
fn tenants_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sp-cli-tenants-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tenants.toml");
    std::fs::write(
        &path,
        format!("[[tenant]]\nname = \"search\"\nkey = \"{KEY}\"\nmodels = [\"tiny-bert\"]\n"),
    )
    .expect("write the tenants file");
    path
}

fn serve() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_streampool"));
    cmd.arg("serve").env_remove("STREAMPOOL_API_KEY");
    cmd
}

/// `GET path` with an optional bearer key: the status and the body.
fn get(port: u16, path: &str, key: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("answer");
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

#[test]
fn a_tenant_key_opens_its_models_only() {
    let models = models_dir();
    let file = tenants_file("serve");
    let mut child = serve()
        .args(["--device", "cpu", "--port", "0", "--no-warm-up", "--model"])
        .arg(models.join("tiny-bert"))
        .arg("--tenants-file")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start streampool serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("the server's first line");
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let (status, body) = get(port, "/v1/models", Some(KEY));
    assert_eq!(status, 200, "{body}");
    // The demo MLP is served too, but not to this tenant.
    assert!(
        body.contains("tiny-bert") && !body.contains("mlp"),
        "{body}"
    );
    assert_eq!(get(port, "/v2/models/mlp", Some(KEY)).0, 404);
    assert_eq!(get(port, "/v1/models", None).0, 401);
    assert_eq!(get(port, "/v2/health/ready", None).0, 200);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(file.parent().expect("a folder"));
}

#[test]
fn the_tenants_file_excludes_a_single_key() {
    let file = tenants_file("conflict");
    let out = serve()
        .arg("--tenants-file")
        .arg(&file)
        .args(["--api-key", KEY])
        .output()
        .expect("run streampool serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let _ = std::fs::remove_dir_all(file.parent().expect("a folder"));
}

#[test]
fn serve_help_explains_the_tenants_file() {
    let out = serve()
        .arg("--help")
        .output()
        .expect("run streampool serve --help");
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--tenants-file",
        "key_sha256",
        "requests_per_second",
        "max_concurrent",
        "[[tenant]]",
    ] {
        assert!(help.contains(word), "--help lacks {word}");
    }
}
