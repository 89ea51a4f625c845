//! `oncelog serve --tls-cert --tls-key`, and the CLI reaching it over https with `--cacert`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{bin, run};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const LIMIT: Duration = Duration::from_secs(20);

/// Ends the server it holds (a child of this test) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_cli_speaks_https_to_a_tls_server_with_a_private_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let cert =
        CertificateParams::new(vec!["localhost".to_string()]).expect("params").signed_by(&key, &ca).expect("cert");
    let (ca_file, cert_file, key_file) =
        (dir.path().join("ca.pem"), dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&ca_file, ca.pem()).expect("ca");
    std::fs::write(&cert_file, cert.pem()).expect("cert");
    std::fs::write(&key_file, key.serialize_pem()).expect("key");

    let mut serve = bin();
    serve
        .args(["serve", "--addr", "127.0.0.1:0", "--fsync", "false"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(&cert_file)
        .arg("--tls-key")
        .arg(&key_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut server = Server(serve.spawn().expect("start oncelog serve"));
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
    let addr = line
        .trim()
        .strip_prefix("oncelog listening on https://")
        .unwrap_or_else(|| panic!("unexpected: {line:?}"))
        .to_owned();
    let port = addr.rsplit(':').next().expect("port");
    let url = format!("https://localhost:{port}/v1/stream");

    let cli = |args: &[&str], cacert: bool| {
        let mut c = bin();
        c.args(args).args(["--url", &url]);
        if cacert {
            c.arg("--cacert").arg(&ca_file);
        }
        c
    };
    let out = run(cli(&["create", "secure"], false), b"", LIMIT);
    assert!(!out.ok, "an unknown CA is refused: {}", out.stdout);
    let out = run(cli(&["create", "secure"], true), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cli(&["append", "secure"], true), b"over tls\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let mut read = cli(&["read", "secure"], false);
    read.env("ONCELOG_CACERT", &ca_file);
    assert_eq!(run(read, b"", LIMIT).stdout, "over tls\n");
}
