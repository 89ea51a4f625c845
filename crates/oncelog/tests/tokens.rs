//! `oncelog token issue | sign-url` against a server that checks tokens with the same secret.

mod common;

use std::time::Duration;

use common::{bin, run, Harness};
use oncelog_server::auth::token::{TokenAuth, TokenConfig};

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn issued_tokens_and_signed_urls_work_within_their_grants_only() {
    let secrets = tempfile::tempdir().expect("tempdir");
    let secret = secrets.path().join("secret");
    std::fs::write(&secret, "a-long-random-secret\n").expect("secret");
    let auth =
        TokenAuth::load(TokenConfig { secret_file: Some(secret.clone()), ..TokenConfig::default() }).expect("keys");
    let h = Harness::start_with(auth);
    let secret = secret.to_str().expect("utf-8 path").to_owned();

    let mut issue = bin();
    issue.args([
        "token",
        "issue",
        "--secret-file",
        &secret,
        "--prefix",
        "chats/",
        "--ops",
        "read,append,create",
        "--expires-in",
        "1h",
    ]);
    let out = run(issue, b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let bearer = format!("Bearer {}", out.stdout.trim());

    let client = |args: &[&str]| {
        let mut c = bin();
        c.args(args).args(["--url", &h.base, "--auth", &bearer]);
        c
    };
    assert!(run(client(&["create", "chats/1"]), b"", LIMIT).ok);
    let out = run(client(&["append", "chats/1"]), b"hello\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(client(&["create", "admin/1"]), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("403"), "{}", out.stderr);
    let out = run(client(&["delete", "chats/1"]), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("403"), "{}", out.stderr);

    let mut sign = bin();
    sign.args([
        "token",
        "sign-url",
        "--secret-file",
        &secret,
        &format!("{}/chats/1?offset=-1", h.base),
        "--expires-in",
        "10m",
    ]);
    let out = run(sign, b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let url = out.stdout.trim().to_owned();
    assert!(url.contains("offset=-1&expires=") && url.contains("&sig="), "{url}");
    let body = h.rt.block_on(async { reqwest::get(&url).await.expect("get").text().await.expect("text") });
    assert_eq!(body, "hello\n");

    let mut bad = bin();
    bad.args(["token", "issue", "--secret-file", &secret, "--stream", "x", "--ops", "read,fly", "--expires-in", "1h"]);
    let out = run(bad, b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("fly"), "{}", out.stderr);
}
