//! `oncelog serve` that cannot start says why, at once: a PostgreSQL database or role that does
//! not exist stops it within seconds in the database's own words (no "retrying" for ever), a
//! `--data-dir` it cannot use is named, and a connection that `sslmode=prefer` let fall back to
//! plaintext is warned about. Needs `ONCELOG_TEST_POSTGRES_URL` and
//! `ONCELOG_TEST_POSTGRES_SOCKET_DIR` (the README's test command sets both).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn pg_url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").expect("ONCELOG_TEST_POSTGRES_URL (./scripts/test sets it)")
}

/// `url` with its user and database replaced (`postgres://USER@HOST:PORT/DB?QUERY`).
fn with(url: &str, user: Option<&str>, db: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, rest) = rest.split_once('@').expect("a user in the URL");
    let (host, rest) = rest.split_once('/').expect("a database in the URL");
    let (old_db, query) = rest.split_once('?').unwrap_or((rest, ""));
    let user = user.unwrap_or(userinfo);
    let db = db.unwrap_or(old_db);
    format!("{scheme}://{user}@{host}/{db}?{query}")
}

/// Runs `serve` with `args` and expects it to exit non-zero within 10 s; answers its stderr.
fn fails_at_once(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let mut cmd = common::bin();
    cmd.arg("serve").args(["--addr", "127.0.0.1:0", "--data-dir"]).arg(dir.path()).args(args);
    let out = common::run(cmd, b"", Duration::from_secs(10));
    assert!(!out.ok, "serve {args:?} started: {}", out.stderr);
    assert!(started.elapsed() < Duration::from_secs(8), "it took {:?} to give up", started.elapsed());
    out.stderr
}

#[test]
fn a_database_or_role_that_does_not_exist_stops_serve_at_once_naming_it() {
    let url = pg_url();
    let err = fails_at_once(&["--storage", &with(&url, None, Some("no_such_database_here"))]);
    assert!(err.contains(r#"database "no_such_database_here" does not exist"#), "{err}");
    assert!(!err.contains("retrying"), "a refusal for good is not retried: {err}");
    let err = fails_at_once(&["--storage", &with(&url, Some("no_such_role_here"), None)]);
    assert!(err.contains(r#"role "no_such_role_here" does not exist"#), "{err}");
}

#[test]
fn a_data_dir_that_cannot_be_used_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A file where the directory should be.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").expect("file");
    let mut cmd = common::bin();
    cmd.arg("serve").args(["--addr", "127.0.0.1:0", "--data-dir"]).arg(&file);
    let out = common::run(cmd, b"", Duration::from_secs(10));
    assert!(!out.ok);
    assert!(out.stderr.contains(&format!("--data-dir {}", file.display())), "{}", out.stderr);
}

#[test]
fn a_plaintext_fallback_under_sslmode_prefer_is_warned_about() {
    // Over the Unix socket no TLS is offered: `sslmode=prefer` (the default) goes plaintext.
    let plaintext = common::pg::plaintext_socket_url();
    let schema = common::pg::schema("start", "prefer");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = common::bin()
        .arg("serve")
        .args(["--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--storage", &plaintext, "--pg-schema", &schema])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let warned = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("sslmode=prefer and the server offered no TLS") => break true,
            Ok(line) if line.contains("listening") => break false,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(warned, "no warning before listening; the log said: {seen:#?}");
}

#[test]
fn bucket_settings_without_a_bucket_are_refused_naming_the_flag() {
    // Each accepted alone, the node would run as a plain local node while the operator believes
    // writes survive the loss of its disk.
    for args in [
        &["--ack-mode", "bucket"][..],
        &["--ship-interval", "2s"][..],
        &["--bucket-ack-timeout", "3s"][..],
        &["--cache-max-bytes", "1G"][..],
    ] {
        let err = fails_at_once(args);
        assert!(err.contains("--object-store"), "{args:?}: {err}");
    }
    // The environment variables as well.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::bin();
    cmd.arg("serve").args(["--addr", "127.0.0.1:0", "--data-dir"]).arg(dir.path()).env("ONCELOG_ACK_MODE", "bucket");
    let out = common::run(cmd, b"", Duration::from_secs(10));
    assert!(!out.ok && out.stderr.contains("--object-store"), "{}", out.stderr);
}

#[test]
fn passwords_given_to_serve_are_never_printed() {
    // A key=value connection string is refused (serve takes PostgreSQL URLs): the refusal quotes
    // it, without its password.
    let err = fails_at_once(&["--storage", "host=db.example password=hunter22 user=u"]);
    assert!(err.contains("unknown storage") && err.contains("password=***"), "{err}");
    assert!(!err.contains("hunter22"), "{err}");
    // An S3 endpoint with credentials in it that cannot be reached: the object store's errors
    // quote the request URL.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::bin();
    cmd.arg("serve")
        .args(["--addr", "127.0.0.1:0", "--object-store", "s3://bucket/prefix", "--data-dir"])
        .arg(dir.path())
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ENDPOINT_URL", "http://key:s3cretpw@127.0.0.1:1")
        .env("AWS_ACCESS_KEY_ID", "key")
        .env("AWS_SECRET_ACCESS_KEY", "topsecretkey")
        .env("AWS_REGION", "us-east-1");
    let out = common::run(cmd, b"", Duration::from_secs(30));
    assert!(!out.ok && out.stderr.contains("127.0.0.1:1"), "{}", out.stderr);
    assert!(!out.stderr.contains("s3cretpw") && !out.stderr.contains("topsecretkey"), "{}", out.stderr);
}

#[test]
fn an_address_in_use_is_named_before_the_data_directory_is_touched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut cmd = common::bin();
    cmd.arg("serve").args(["--addr", &addr, "--data-dir"]).arg(&data);
    let out = common::run(cmd, b"", Duration::from_secs(10));
    assert!(!out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("--addr {addr}")) && out.stderr.contains("another process listens there"),
        "{}",
        out.stderr
    );
    // Bound first: the data directory was neither created nor recovered.
    assert!(!data.exists(), "the data directory was opened before the address was bound");
}

/// `serve --object-store s3://bucket/prefix` with the `AWS_*` variables of `env` and none of
/// this process's own (a machine's keys must not make a no-credentials test pass or fail).
fn serve_s3(env: &[(&str, &str)]) -> common::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::bin();
    cmd.arg("serve")
        .args(["--addr", "127.0.0.1:0", "--object-store", "s3://bucket/prefix", "--data-dir"])
        .arg(dir.path());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("AWS_")) {
            cmd.env_remove(name);
        }
    }
    cmd.envs(env.iter().copied());
    common::run(cmd, b"", Duration::from_secs(30))
}

#[test]
fn an_http_s3_endpoint_without_aws_allow_http_is_refused_naming_the_variable() {
    // Today's alternative is object_store's "HTTP error: builder error" at the first request.
    let endpoint = ("AWS_ENDPOINT_URL", "http://key:s3cretpw@127.0.0.1:1");
    let keys = [("AWS_ACCESS_KEY_ID", "key"), ("AWS_SECRET_ACCESS_KEY", "topsecretkey")];
    for allow in [None, Some("false")] {
        let mut env = vec![endpoint, keys[0], keys[1]];
        env.extend(allow.map(|v| ("AWS_ALLOW_HTTP", v)));
        let out = serve_s3(&env);
        assert!(!out.ok, "{allow:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("AWS_ALLOW_HTTP=true") && out.stderr.contains("http://key:***@127.0.0.1:1"),
            "{allow:?}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("s3cretpw") && !out.stderr.contains("builder error"), "{}", out.stderr);
    }
}

/// A loopback HTTP server that answers `403 Forbidden` to every request; answers its address and
/// the request lines it has seen.
fn forbidding_server() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            log.lock().expect("log").push(line.trim_end().to_owned());
            // The rest of the head; the requests answered here carry no body.
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {}
            let _ = conn.write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (addr, seen)
}

#[test]
fn an_s3_bucket_without_credentials_says_so() {
    // No keys nor any other source configured: object_store asks the instance metadata service
    // (here the stub, which refuses as an address without a role does); the refusal is named
    // as what it means.
    let (stub, seen) = forbidding_server();
    let base = [
        ("AWS_ENDPOINT_URL", stub.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_METADATA_ENDPOINT", stub.as_str()),
        ("AWS_REGION", "us-east-1"),
    ];
    let out = serve_s3(&base);
    assert!(!out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("object store s3://bucket/prefix: no credentials found (")
            && out.stderr.contains("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
            && out.stderr.contains(&format!("instance metadata service at {stub}")),
        "{}",
        out.stderr
    );
    let asked = seen.lock().expect("seen").clone();
    assert!(asked.iter().any(|l| l.contains("/latest/api/token")), "the metadata service was not asked: {asked:?}");
    // With keys, a 403 is the store's own refusal of them, and is not called missing credentials.
    let mut env = base.to_vec();
    env.extend([("AWS_ACCESS_KEY_ID", "key"), ("AWS_SECRET_ACCESS_KEY", "secret")]);
    let out = serve_s3(&env);
    assert!(!out.ok, "{}", out.stderr);
    assert!(out.stderr.contains("403") && !out.stderr.contains("no credentials found"), "{}", out.stderr);
}
