//! `oncelog sub`: the real binary managing subscriptions on an in-process server.

mod common;

use std::time::Duration;

use common::{bin, run, Harness};

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn sub_create_is_idempotent_refuses_another_config_and_get_list_delete_show_it() {
    let h = Harness::start();
    let cmd = |args: &[&str]| {
        let mut c = bin();
        c.args(args).args(["--url", &h.base]);
        c
    };
    assert!(run(cmd(&["create", "wake", "--json"]), b"", LIMIT).ok);
    assert!(run(cmd(&["create", "jobs/a"]), b"", LIMIT).ok);
    let create = [
        "sub",
        "create",
        "workers",
        "--pattern",
        "jobs/*",
        "--wake-stream",
        "wake",
        "--lease-ttl",
        "30s",
        "--description",
        "the job workers",
    ];

    let out = run(cmd(&create), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let (json, last) = out.stdout.trim_end().rsplit_once('\n').expect("JSON, then a last line");
    assert_eq!(last, "created", "{}", out.stdout);
    let v: serde_json::Value = serde_json::from_str(json).expect("the subscription as JSON");
    assert_eq!((v["id"].as_str(), v["type"].as_str()), (Some("workers"), Some("pull-wake")), "{json}");

    // The same command again (a retried script): confirmed, not created.
    let out = run(cmd(&create), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim_end().lines().last(), Some("existing"), "{}", out.stdout);

    // Another configuration under the id: the server's 409.
    let mut other = create;
    other[8] = "60s";
    let out = run(cmd(&other), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("SUBSCRIPTION_ALREADY_EXISTS"), "{}", out.stderr);
    // Neither --pattern nor --stream: refused before any request.
    let out = run(cmd(&["sub", "create", "x", "--wake-stream", "wake"]), b"", LIMIT);
    assert!(!out.ok, "{}", out.stdout);

    let out = run(cmd(&["sub", "get", "workers"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("get prints JSON");
    let linked: Vec<&str> =
        v["streams"].as_array().expect("streams").iter().filter_map(|l| l["path"].as_str()).collect();
    assert_eq!(linked, ["jobs/a"], "{}", out.stdout);

    // Explicit links, by name.
    assert!(run(cmd(&["create", "manual/b"]), b"", LIMIT).ok);
    let out = run(cmd(&["sub", "link", "workers", "manual/b"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert!(run(cmd(&["sub", "get", "workers"]), b"", LIMIT).stdout.contains("\"manual/b\""));
    let out = run(cmd(&["sub", "unlink", "workers", "manual/b"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    assert!(!run(cmd(&["sub", "get", "workers"]), b"", LIMIT).stdout.contains("\"manual/b\""));

    let out = run(cmd(&["sub", "list"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let fields: Vec<&str> = out.stdout.trim_end().split('\t').collect();
    assert_eq!(fields[..3], ["workers", "pull-wake", "jobs/*"], "{}", out.stdout);
    assert!(fields[3].parse::<u64>().is_ok(), "{}", out.stdout);

    let out = run(cmd(&["sub", "delete", "workers"]), b"", LIMIT);
    assert!(out.ok, "{}", out.stderr);
    let out = run(cmd(&["sub", "get", "workers"]), b"", LIMIT);
    assert!(!out.ok && out.stderr.contains("SUBSCRIPTION_NOT_FOUND"), "{}", out.stderr);
    assert_eq!(run(cmd(&["sub", "list"]), b"", LIMIT).stdout, "");
}
