//! The Grafana dashboard (`docs/grafana/oncelog.json`) queries only metrics the code exports: a
//! renamed or removed metric, or a panel typed with a wrong name, leaves an empty panel that
//! nobody notices until the day it is needed. The names the code can export are the metric name
//! literals in the workspace's sources (`"oncelog_…"`, `"process_…"`); a histogram's series add
//! `_bucket`, `_sum` and `_count`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `"oncelog_…"` / `"process_…"` string literal in the `src/` trees of the workspace.
fn exported() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source");
                for piece in text.split('"').skip(1).step_by(2) {
                    if (piece.starts_with("oncelog_") || piece.starts_with("process_"))
                        && piece.len() > "oncelog_".len()
                        && piece.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    {
                        names.insert(piece.to_owned());
                    }
                }
            }
        }
    }
    names
}

/// The metric names one PromQL expression mentions.
fn metrics_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("oncelog_") || w.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

fn known(name: &str, exported: &BTreeSet<String>) -> bool {
    exported.contains(name)
        || ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|base| exported.contains(base)))
}

/// Every query of the dashboard: panel targets and template variables.
fn queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?").to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((title.clone(), target["expr"].as_str().expect("a target's expr").to_owned()));
        }
    }
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = var["definition"].as_str() {
            out.push((format!("variable {}", var["name"]), q.to_owned()));
        }
    }
    out
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let exported = exported();
    assert!(exported.contains("oncelog_appends_total") && exported.len() > 40, "the scan found {exported:?}");
    let text = std::fs::read_to_string(root().join("docs/grafana/oncelog.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() > 30, "{} queries", queries.len());
    let mut unknown = Vec::new();
    for (panel, expr) in &queries {
        let names = metrics_in(expr);
        if names.is_empty() {
            unknown.push(format!("{panel}: no metric in {expr:?}"));
        }
        for name in names.iter().filter(|n| !known(n, &exported)) {
            unknown.push(format!("{panel}: {name}"));
        }
    }
    assert!(unknown.is_empty(), "queries naming metrics the code does not export:\n{}", unknown.join("\n"));
}

#[test]
fn the_dashboard_covers_the_bucket_tier_and_the_sinks() {
    let text = std::fs::read_to_string(root().join("docs/grafana/oncelog.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let named: BTreeSet<String> = queries(&dashboard).iter().flat_map(|(_, e)| metrics_in(e)).collect();
    for metric in [
        "oncelog_bucket_unshipped_bytes",
        "oncelog_bucket_unshipped_seconds",
        "oncelog_bucket_puts_total",
        "oncelog_bucket_gets_total",
        "oncelog_bucket_errors_total",
        "oncelog_bucket_publish_seconds_bucket",
        "oncelog_bucket_cold_read_hits_total",
        "oncelog_bucket_cache_evictions_total",
        "oncelog_bucket_epoch",
        "oncelog_sink_lag_bytes",
        "oncelog_sink_streams_set_aside_total",
        "oncelog_sink_rows_applied_total",
    ] {
        assert!(named.contains(metric), "no panel shows {metric}");
    }
}
