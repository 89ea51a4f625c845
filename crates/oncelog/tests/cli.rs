//! The client subcommands end to end: the real `oncelog` binary against an in-process server.

mod common;

use std::time::Duration;

use common::{bin, run, Harness};
use oncelog_server::auth::token::{TokenAuth, TokenConfig};

const LIMIT: Duration = Duration::from_secs(20);

/// `oncelog ARGS --url` the harness's server.
fn against(h: &Harness, args: &[&str]) -> std::process::Command {
    let mut c = bin();
    c.args(args).args(["--url", &h.base]);
    c
}

#[test]
fn create_append_read_tail_head_close_delete() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);

    let out = run(cmd(&["create", "logs/app"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let lines: String = (0..500).map(|i| format!("line {i}\n")).collect();
    let out = run(cmd(&["append", "logs/app", "--linger-ms", "1"]), lines.as_bytes(), LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let appended_to = out.stdout.trim().to_owned();

    let out = run(cmd(&["read", "logs/app", "--print-offset"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout, lines);
    assert_eq!(out.stderr.trim(), appended_to, "the resume offset is where the append ended");

    // Resume from an offset.
    let mid = run(cmd(&["append", "logs/app"]), b"more\n", LIMIT).stdout.trim().to_owned();
    let out = run(cmd(&["read", "logs/app", "--from", &appended_to]), b"", LIMIT);
    assert_eq!(out.stdout, "more\n");

    let out = run(cmd(&["head", "logs/app"]), b"", LIMIT);
    assert!(out.stdout.contains("content-type: text/plain") && out.stdout.contains(&format!("next-offset: {mid}")));
    assert!(out.stdout.contains("closed: false"));

    // `tail` follows live output until the stream is closed, in both modes.
    let mut tails = Vec::new();
    for mode in ["sse", "long-poll"] {
        let c = cmd(&["tail", "logs/app", "--from", &mid, "--mode", mode]);
        tails.push(std::thread::spawn(move || run(c, b"", LIMIT)));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(run(cmd(&["append", "logs/app"]), b"live 1\nlive 2\n", LIMIT).ok);
    let out = run(cmd(&["close", "logs/app", "--data", "bye\n"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    for t in tails {
        let out = t.join().expect("tail thread");
        assert!(out.ok, "{}", out.stderr);
        assert_eq!(out.stdout, "live 1\nlive 2\nbye\n", "tail ends at EOF");
    }
    let out = run(cmd(&["append", "logs/app"]), b"late\n", LIMIT);
    assert!(!out.ok && out.stderr.contains("closed"), "{}", out.stderr);
    let out = run(cmd(&["head", "logs/app"]), b"", LIMIT);
    assert!(out.stdout.contains("closed: true"));

    assert!(run(cmd(&["delete", "logs/app"]), b"", LIMIT).ok);
    let out = run(cmd(&["head", "logs/app"]), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("not found"), "{}", out.stderr);
}

#[test]
fn json_streams_take_json_values_and_print_one_message_per_line() {
    let h = Harness::start();
    let cmd = |args: &[&str]| {
        let mut c = bin();
        c.args(args).env("ONCELOG_URL", &h.base);
        c
    };
    assert!(run(cmd(&["create", "events", "--json"]), b"", LIMIT).ok);
    // Whitespace between values is dropped; a value's own text, spread over lines or not, is kept.
    let input = b"{\"id\": 1}\n{\"id\": 2} [3, 4]\n\"five\"\n{\n  \"id\": 6\n}\n";
    let out = run(cmd(&["append", "events", "--close"]), input, LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cmd(&["read", "events"]), b"", LIMIT);
    assert_eq!(out.stdout, "{\"id\": 1}\n{\"id\": 2}\n[3, 4]\n\"five\"\n{\n  \"id\": 6\n}\n");
    let out = run(cmd(&["append", "events"]), b"{not json", LIMIT);
    assert!(!out.ok && out.stderr.contains("JSON"), "{}", out.stderr);
}

/// JSON values whose text a parse-and-serialise round trip would change: key order, number
/// spellings (a trailing zero, an integer beyond 64 bits, exponents, minus zero), escapes
/// (`\u00e9`, `\/`, a surrogate pair) and whitespace inside a value.
const EXACT_JSON: [&str; 6] = [
    r#"{"z":1, "a": 2.50, "big": 12345678901234567890123}"#,
    r#"{"s":"tab\there \u00e9 \/ \"q\" \\ \ud83d\ude00 é", "e": 1E+2, "n": -0.0, "f": 1.000000000000000000001}"#,
    "[ 1 ,\t2 ]",
    "\"x\"",
    "{\n  \"nested\": {\"k\": [true, null, {}]}\n}",
    "12345678901234567890123",
];

#[test]
fn json_values_go_through_append_and_read_byte_for_byte() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "exact", "--json"]), b"", LIMIT).ok);
    // Through the producer (values separated by any whitespace), then as one keyed append.
    let input = format!(
        "{}\n{}  {}\t{}\n\n{}{}\n",
        EXACT_JSON[0], EXACT_JSON[1], EXACT_JSON[2], EXACT_JSON[3], EXACT_JSON[4], EXACT_JSON[5]
    );
    let out = run(cmd(&["append", "exact", "--linger-ms", "1"]), input.as_bytes(), LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cmd(&["append", "exact", "--idempotency-key", "k1"]), input.as_bytes(), LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let expected: String = EXACT_JSON.iter().chain(EXACT_JSON.iter()).map(|v| format!("{v}\n")).collect();
    let out = run(cmd(&["read", "exact"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout, expected);

    // `--offsets`: each message's offset, a tab, the message; reading from one starts there.
    let out = run(cmd(&["read", "exact", "--offsets"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let mut records = Vec::new();
    let mut rest = out.stdout.as_str();
    for v in EXACT_JSON.iter().chain(EXACT_JSON.iter()) {
        let (offset, tail) = rest.split_once('\t').expect("OFFSET<TAB>");
        let tail = tail.strip_prefix(*v).unwrap_or_else(|| panic!("{v} expected at {offset}: {tail}"));
        rest = tail.strip_prefix('\n').expect("newline after each message");
        records.push(offset.to_owned());
    }
    assert!(rest.is_empty(), "{rest}");
    // A message's offset is where it starts: its text and one `,` take the offset space.
    let position =
        |token: &str| token.split_once('_').and_then(|(_, p)| p.parse::<usize>().ok()).expect("an Oncelog offset");
    let mut at = 0;
    for (record, v) in records.iter().zip(EXACT_JSON.iter().chain(EXACT_JSON.iter())) {
        assert_eq!(position(record), at, "{v}");
        at += v.len() + 1;
    }
    // Where an append began (the keyed append's first message), a read can start.
    let second_half = run(cmd(&["read", "exact", "--from", &records[EXACT_JSON.len()]]), b"", LIMIT);
    assert!(second_half.ok, "{}", second_half.stderr);
    assert_eq!(second_half.stdout, expected[expected.len() / 2..]);
    // `tail` prints the same bytes, in both live modes.
    assert!(run(cmd(&["close", "exact"]), b"", LIMIT).ok);
    for mode in ["sse", "long-poll"] {
        let out = run(cmd(&["tail", "exact", "--from", "-1", "--mode", mode]), b"", LIMIT);
        assert!(out.ok, "{}", out.stderr);
        assert_eq!(out.stdout, expected, "tail --mode {mode}");
    }
}

#[test]
fn a_byte_stream_with_tabs_cr_and_invalid_utf8_round_trips() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "raw", "--content-type", "application/octet-stream"]), b"", LIMIT).ok);
    let data: &[u8] = b"a\tb\r\n\xff\xfe not utf-8 \xc3\x28\n\x00nul\r\r\n\nno newline at the end";
    let out = run(cmd(&["append", "raw"]), data, LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cmd(&["read", "raw"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout_bytes, data);
    // Closed, so that a tail from the start ends at EOF.
    assert!(run(cmd(&["close", "raw"]), b"", LIMIT).ok);
    for mode in ["sse", "long-poll"] {
        let out = run(cmd(&["tail", "raw", "--from", "-1", "--mode", mode]), b"", LIMIT);
        assert!(out.ok, "{}", out.stderr);
        assert_eq!(out.stdout_bytes, data, "tail --mode {mode}");
    }
    // `--offsets` on a byte stream: one record per line (newline kept), a last piece without a
    // newline gets one.
    let out = run(cmd(&["read", "raw", "--offsets"]), b"", LIMIT);
    let mut expected = Vec::new();
    let mut at = 0usize;
    for line in data.split_inclusive(|&b| b == b'\n') {
        expected.extend_from_slice(format!("0000000000000000_{at:016}\t").as_bytes());
        expected.extend_from_slice(line);
        at += line.len();
    }
    expected.push(b'\n');
    assert_eq!(String::from_utf8_lossy(&out.stdout_bytes), String::from_utf8_lossy(&expected));
    assert_eq!(out.stdout_bytes, expected);
}

/// The server's authentication hook, with one fixed token.
struct RequireToken;

impl oncelog_server::Authorize for RequireToken {
    fn authorize(
        &self,
        req: &axum::http::request::Parts,
        _now_ms: i64,
    ) -> Result<oncelog_server::Access, oncelog_server::AuthError> {
        match req.headers.get("authorization").and_then(|v| v.to_str().ok()) {
            Some("Bearer s3cret") => Ok(oncelog_server::Access::default()),
            _ => Err(oncelog_server::AuthError::Unauthenticated { why: oncelog_server::auth::Why::BadSignature }),
        }
    }
}

#[test]
fn the_auth_header_comes_from_a_flag_or_the_environment() {
    let h = Harness::start_with(std::sync::Arc::new(RequireToken));
    let out = run(
        {
            let mut c = bin();
            c.args(["create", "private", "--url", &h.base]);
            c
        },
        b"",
        LIMIT,
    );
    assert!(!out.ok && out.stderr.contains("401"), "{}", out.stderr);
    // The server's reason is printed, by stream commands and subscription commands alike.
    assert!(out.stderr.contains("the token's signature does not verify"), "{}", out.stderr);
    let mut c = bin();
    c.args(["sub", "list", "--url", &h.base, "--auth", "Bearer wrong"]);
    let out = run(c, b"", LIMIT);
    assert!(!out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("401 UNAUTHORIZED") && out.stderr.contains("the token's signature does not verify"),
        "{}",
        out.stderr
    );
    let mut c = bin();
    c.args(["create", "private", "--url", &h.base, "--auth", "Bearer s3cret"]);
    assert!(run(c, b"", LIMIT).ok);
    let mut c = bin();
    c.args(["append", "private"]).env("ONCELOG_URL", &h.base).env("ONCELOG_AUTH", "Bearer s3cret");
    let out = run(c, b"hello\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let mut c = bin();
    c.args(["read", "private", "--url", &h.base, "-H", "Authorization: Bearer s3cret"]);
    assert_eq!(run(c, b"", LIMIT).stdout, "hello\n");
}

#[test]
fn a_conditional_append_writes_at_the_named_tail_and_exits_3_elsewhere() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "doc"]), b"", LIMIT).ok);
    let start = run(cmd(&["head", "doc"]), b"", LIMIT).stdout;
    let start = start.lines().find_map(|l| l.strip_prefix("next-offset: ")).expect("next-offset").to_owned();
    // All of stdin as one append at the tail read.
    let out = run(cmd(&["append", "doc", "--if-match", &start]), b"one\ntwo\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let after = out.stdout.trim().to_owned();
    // Again at the old tail: refused, nothing written, the tail on stderr, status 3.
    let out = run(cmd(&["append", "doc", "--if-match", &start]), b"three\n", LIMIT);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("precondition failed") && out.stderr.contains(&after), "{}", out.stderr);
    let out = run(cmd(&["append", "doc", "--if-match", &after]), b"three\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(run(cmd(&["read", "doc"]), b"", LIMIT).stdout, "one\ntwo\nthree\n");
    // A producer cannot be combined with it.
    let out = run(cmd(&["append", "doc", "--if-match", &after, "--producer-id", "p"]), b"x\n", LIMIT);
    assert!(!out.ok && out.code != Some(3), "{}", out.stderr);
}

#[test]
fn an_append_with_an_expected_offset_lands_only_at_that_tail_and_exits_3_elsewhere() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    let start = run(cmd(&["create", "doc"]), b"", LIMIT).stdout.trim().to_owned();
    // All of stdin as one append at exactly that tail.
    let out = run(cmd(&["append", "doc", "--expected-offset", &start]), b"one\ntwo\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let after = out.stdout.trim().to_owned();
    assert_ne!(after, start);
    // Again at the old tail: the server's 409, nothing written, the current tail on stderr,
    // status 3 as for --if-match.
    let out = run(cmd(&["append", "doc", "--expected-offset", &start]), b"three\n", LIMIT);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("expected offset conflict") && out.stderr.contains(&after), "{}", out.stderr);
    let out = run(cmd(&["append", "doc", "--expected-offset", &after, "--close"]), b"three\n", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(run(cmd(&["read", "doc"]), b"", LIMIT).stdout, "one\ntwo\nthree\n");
    // A closed stream is a plain conflict (status 1), not a lost race; so is a producer with it.
    let tail = out.stdout.trim().to_owned();
    let out = run(cmd(&["append", "doc", "--expected-offset", &tail]), b"late\n", LIMIT);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("closed"), "{}", out.stderr);
    let out = run(cmd(&["append", "doc", "--expected-offset", &tail, "--producer-id", "p"]), b"x\n", LIMIT);
    assert!(!out.ok && out.code != Some(3), "{}", out.stderr);
}

#[test]
fn delete_purge_frees_the_path_a_fork_keeps_reserved() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "src"]), b"", LIMIT).ok);
    assert!(run(cmd(&["append", "src"]), b"old\n", LIMIT).ok);
    // Someone forks it (the CLI has no fork command; the client does it).
    h.rt.block_on(async {
        let mut fork = oncelog_client::CreateOptions::default();
        fork.headers.insert("stream-forked-from", "/v1/stream/src".parse().expect("value"));
        h.client().stream("fork").create(fork).await.expect("fork");
    });
    // A plain delete leaves the path reserved for the fork: it cannot be created again.
    assert!(run(cmd(&["delete", "src"]), b"", LIMIT).ok);
    let out = run(cmd(&["create", "src"]), b"", LIMIT);
    assert!(!out.ok, "{}", out.stdout);
    // --purge frees it at once; the fork reads on, and the new stream is a new one.
    let out = run(cmd(&["delete", "src", "--purge"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cmd(&["create", "src"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(run(cmd(&["read", "src"]), b"", LIMIT).stdout, "");
    assert_eq!(run(cmd(&["read", "fork"]), b"", LIMIT).stdout, "old\n");
    // On a stream without forks it is a plain delete.
    assert!(run(cmd(&["delete", "src", "--purge"]), b"", LIMIT).ok);
    let out = run(cmd(&["head", "src"]), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("not found"), "{}", out.stderr);
}

#[test]
fn a_keyed_append_run_twice_is_written_once() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "orders"]), b"", LIMIT).ok);
    let first = run(cmd(&["append", "orders", "--idempotency-key", "order-17"]), b"paid\n", LIMIT);
    assert!(first.ok, "{}", first.stderr);
    // The same command again (a retried script): answered from the first, same offset.
    let again = run(cmd(&["append", "orders", "--idempotency-key", "order-17"]), b"paid\n", LIMIT);
    assert!(again.ok, "{}", again.stderr);
    assert_eq!(again.stdout, first.stdout);
    // Other bytes under the key: refused.
    let changed = run(cmd(&["append", "orders", "--idempotency-key", "order-17"]), b"refunded\n", LIMIT);
    assert!(!changed.ok && changed.stderr.contains("different body"), "{}", changed.stderr);
    // No value: a fresh UUIDv7, shown on stderr.
    let auto = run(cmd(&["append", "orders", "--idempotency-key"]), b"shipped\n", LIMIT);
    assert!(auto.ok && auto.stderr.contains("idempotency-key: "), "{}", auto.stderr);
    assert_eq!(run(cmd(&["read", "orders"]), b"", LIMIT).stdout, "paid\nshipped\n");
}

#[test]
fn trim_drops_the_start_and_readers_fail_or_restart_from_the_earliest_offset() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    let out = run(cmd(&["create", "log", "--retention-max-age", "7d", "--retention-max-bytes", "none"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let first = run(cmd(&["append", "log", "--if-match", out.stdout.trim()]), b"old\n", LIMIT).stdout.trim().to_owned();
    assert!(run(cmd(&["append", "log"]), b"new\n", LIMIT).ok);
    let out = run(cmd(&["trim", "log", "--to", &first]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), first, "prints the earliest offset");
    let head = run(cmd(&["head", "log"]), b"", LIMIT).stdout;
    assert!(
        head.contains(&format!("earliest-offset: {first}")) && head.contains("retention-max-age: 604800"),
        "{head}"
    );
    // From the beginning (-1): what is left. From a dropped offset: an error, or a restart.
    assert_eq!(run(cmd(&["read", "log"]), b"", LIMIT).stdout, "new\n");
    let zero = "0000000000000000_0000000000000000";
    let failed = run(cmd(&["read", "log", "--from", zero]), b"", LIMIT);
    assert!(!failed.ok && failed.stderr.contains(&first), "{}", failed.stderr);
    let restarted = run(cmd(&["read", "log", "--from", zero, "--on-trimmed", "restart"]), b"", LIMIT);
    assert!(restarted.ok, "{}", restarted.stderr);
    assert_eq!(restarted.stdout, "new\n");
    let bad = run(cmd(&["create", "other", "--retention-max-bytes", "lots"]), b"", LIMIT);
    assert!(!bad.ok, "{}", bad.stdout);
}

#[test]
fn compact_replaces_a_state_streams_history_with_its_snapshot() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    let out = run(cmd(&["create", "todos", "--json", "--compaction", "state"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert!(run(cmd(&["head", "todos"]), b"", LIMIT).stdout.contains("compaction: state"));
    // Many changes to two entities, one of them deleted at the end: the snapshot is smaller.
    let mut changes: String = (0..20)
        .map(|i| {
            format!(
                "{{\"type\":\"todo\",\"key\":\"{}\",\"value\":\"v{i}\",\"headers\":{{\"operation\":\"upsert\"}}}}\n",
                if i % 2 == 0 { "a" } else { "b" }
            )
        })
        .collect();
    changes.push_str(r#"{"type":"todo","key":"a","headers":{"operation":"delete"}}"#);
    changes.push('\n');
    let tail = run(cmd(&["append", "todos"]), changes.as_bytes(), LIMIT);
    assert!(tail.ok, "{}", tail.stderr);
    // Not a State Protocol message: refused.
    assert!(!run(cmd(&["append", "todos"]), b"{\"just\":\"json\"}\n", LIMIT).ok);
    let out = run(cmd(&["compact", "todos"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), tail.stdout.trim(), "the stream now starts where its history ended");
    let read = run(cmd(&["read", "todos"]), b"", LIMIT).stdout;
    let lines: Vec<&str> = read.lines().collect();
    assert_eq!(lines.len(), 4, "reset, snapshot-start, one insert, snapshot-end: {read}");
    assert!(
        lines[0].contains("\"reset\"") && lines[1].contains("snapshot-start") && lines[3].contains("snapshot-end"),
        "{read}"
    );
    assert!(lines[2].contains("\"key\":\"b\"") && lines[2].contains("\"v19\""), "{read}");
}

#[test]
fn a_backup_of_a_running_server_serves_the_same_streams() {
    let h = Harness::start();
    let cmd = |args: &[&str]| against(&h, args);
    assert!(run(cmd(&["create", "logs/app"]), b"", LIMIT).ok);
    assert!(run(cmd(&["append", "logs/app"]), b"one\ntwo\n", LIMIT).ok);
    let copy = h.dir.path().join("copy");
    let mut backup = bin();
    backup.args(["backup", "--data-dir"]).arg(h.dir.path().join("data")).arg("--to").arg(&copy);
    let out = run(backup, b"", LIMIT);
    assert!(out.ok && out.stdout.starts_with("backed up"), "{} {}", out.stdout, out.stderr);
    // The copy is a data directory of its own.
    let server = common::Server::start(&copy, &[]);
    let mut read = bin();
    read.args(["read", "logs/app", "--url", &format!("{}/v1/stream", server.url)]);
    assert_eq!(run(read, b"", LIMIT).stdout, "one\ntwo\n");
}

#[test]
fn serve_refuses_a_data_directory_of_the_retired_fjall_engine_and_the_fjall_choice() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("keyspaces")).expect("keyspaces");
    let data = dir.path().to_str().expect("utf-8");
    let serve = |extra: &[&str]| {
        let mut c = bin();
        c.args(["serve", "--addr", "127.0.0.1:0", "--data-dir", data]).args(extra);
        run(c, b"", LIMIT)
    };
    let out = serve(&[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("pre-release engine") && out.stderr.contains("no longer reads"), "{}", out.stderr);
    assert!(!dir.path().join("log").exists(), "nothing was written beside it");
    let out = serve(&["--storage", "fjall"]);
    assert!(!out.ok && out.stderr.contains("unknown storage \"fjall\""), "{}", out.stderr);
}

/// `oncelog ls [PREFIX] [--long]` with access control on: the streams a token may read, in path
/// order, across the listing's pages (issue 32, item 7).
#[test]
fn ls_prints_the_streams_a_token_may_read_in_path_order_across_pages() {
    let secrets = tempfile::tempdir().expect("tempdir");
    let secret = secrets.path().join("secret");
    std::fs::write(&secret, "a-long-random-secret\n").expect("secret");
    let auth =
        TokenAuth::load(TokenConfig { secret_file: Some(secret.clone()), ..TokenConfig::default() }).expect("keys");
    let h = Harness::start_with(auth);
    let secret = secret.to_str().expect("utf-8 path").to_owned();
    let mint = |prefix: &str, ops: &str| {
        let mut c = bin();
        c.args(["token", "issue", "--secret-file", &secret, "--prefix", prefix, "--ops", ops, "--expires-in", "1h"]);
        let out = run(c, b"", LIMIT);
        assert!(out.ok, "{}", out.stderr);
        format!("Bearer {}", out.stdout.trim())
    };
    let admin = mint("", "all");
    let reader = mint("a/", "read");
    let ls = |bearer: Option<&str>, args: &[&str]| {
        let mut c = bin();
        c.arg("ls").args(args).args(["--url", &h.base]);
        if let Some(b) = bearer {
            c.args(["--auth", b]);
        }
        run(c, b"", LIMIT)
    };

    // 1,001 streams under `many/` (more than one page of 1,000), created out of order, and a few
    // others.
    let many: Vec<String> = (0..1001).map(|i| format!("many/{i:04}")).collect();
    h.rt.block_on(async {
        let client = oncelog_client::Client::builder(&h.base)
            .default_header("authorization", &admin)
            .expect("header")
            .build()
            .expect("client");
        for p in many.iter().rev().map(String::as_str).chain(["b/1", "a/2", "a/1", "ab"]) {
            client.stream(p).create(oncelog_client::CreateOptions::content_type("text/plain")).await.expect("create");
        }
        client.stream("a/1").append("hello", oncelog_client::AppendOptions::default()).await.expect("append");
        client.stream("a/2").close().await.expect("close");
    });

    let out = ls(Some(&admin), &["many/"]);
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    // Compared whole, reported short (a failure would print 1,001 paths twice).
    assert!(
        lines == many,
        "every stream once, in order, across two pages: {} lines, {:?} .. {:?}",
        lines.len(),
        lines.first(),
        lines.last()
    );
    let out = ls(Some(&admin), &[]);
    assert_eq!(out.stdout.lines().take(4).collect::<Vec<_>>(), ["a/1", "a/2", "ab", "b/1"]);
    assert_eq!(out.stdout.lines().count(), 1005);

    // A token with `read` on `a/` sees `a/…` only, whatever prefix it asks for.
    assert_eq!(ls(Some(&reader), &[]).stdout, "a/1\na/2\n");
    let out = ls(Some(&reader), &["b/"]);
    assert!(out.ok && out.stdout.is_empty(), "{out:?}", out = (out.stdout, out.stderr));

    // --long: path, content type, tail, open or closed, tab-separated.
    let out = ls(Some(&reader), &["--long", "a/"]);
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0][0], lines[0][1], lines[0][3]), ("a/1", "text/plain", "open"));
    assert_eq!((lines[1][0], lines[1][3]), ("a/2", "closed"));
    let mut head = bin();
    head.args(["head", "a/1", "--url", &h.base, "--auth", &admin]);
    assert!(run(head, b"", LIMIT).stdout.contains(&format!("next-offset: {}", lines[0][2])), "the tail HEAD shows");

    // No credentials: the server's 401, exit status 1.
    let out = ls(None, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(out.stderr.contains("401"), "{}", out.stderr);
}
