//! The fault suite's binary as scripts/chaos calls it. Built by the workspace's test build
//! (this test needs it), so `scripts/test` runs the binary of that build instead of building it a
//! second time with other features.

use std::process::Command;

fn chaos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oncelog-chaos"))
}

/// A run that cannot start its cluster never reports a clean history: exit 2 with the reason, and
/// no verdict line (a verdict of 0 violations over nothing would read as a pass).
#[test]
fn a_run_whose_server_cannot_start_fails_without_a_verdict() {
    let out = tempfile::tempdir().expect("tempdir");
    let missing = out.path().join("no-such-oncelog");
    let r = chaos()
        .args(["--seed", "1", "--seconds", "1", "--engine", "log", "--bin"])
        .arg(&missing)
        .arg("--out")
        .arg(out.path().join("run"))
        .output()
        .expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    assert_eq!(r.status.code(), Some(2), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("chaos: the run failed"), "{stderr}");
    assert!(!stdout.contains("violations"), "{stdout}");
}

#[test]
fn an_unknown_engine_is_refused_before_anything_runs() {
    let r = chaos().args(["--engine", "fjall", "--bin", "x", "--out", "y"]).output().expect("runs");
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("--engine"));
}

/// `--engine log-bucket` is an engine, and without the S3 API server it needs
/// (`ONCELOG_TEST_S3_ENDPOINT`) the run fails with the reason before anything starts, without a
/// verdict.
#[test]
fn log_bucket_without_an_s3_server_fails_with_the_reason() {
    let out = tempfile::tempdir().expect("tempdir");
    let r = chaos()
        .args(["--seed", "1", "--seconds", "1", "--engine", "log-bucket", "--bin"])
        .arg(out.path().join("no-such-oncelog"))
        .arg("--out")
        .arg(out.path().join("run"))
        .env_remove("ONCELOG_TEST_S3_ENDPOINT")
        .output()
        .expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    assert_eq!(r.status.code(), Some(2), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("ONCELOG_TEST_S3_ENDPOINT"), "{stderr}");
    assert!(!stdout.contains("violations"), "{stdout}");
}
