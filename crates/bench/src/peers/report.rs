//! The result file (markdown: how the run was made, one table of medians with Oncelog/Electric
//! ratios, remarks, every round's values) and the SVG chart of the headline figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::options::{Config, Scenario, Server};
use super::servers::{ELECTRIC_VERSION, NODE_VERSION};
use super::stats::{fmt_value, ratio, Results};

/// Which way a row is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One table row: a metric of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub scenario: Scenario,
    pub metric: &'static str,
    pub label: String,
    pub better: Better,
}

/// The table's rows, in order (only those of the selected scenarios are shown).
pub fn rows(cfg: &Config) -> Vec<Row> {
    use Better::{Higher as Hi, Lower as Lo};
    use Scenario::*;
    let mb = cfg.catchup_mb;
    let streams = fmt_value(cfg.streams_count as f64);
    let gb = &cfg.recovery_gb;
    let mut rows: Vec<(Scenario, &'static str, String, Better)> = vec![
        (S1, "appends_per_s", "S1 64 producers, 8 streams, 1 KiB: appends/s".into(), Hi),
        (S1, "p50_ms", "S1 p50 ms".into(), Lo),
        (S1, "p99_ms", "S1 p99 ms".into(), Lo),
        (S1, "p999_ms", "S1 p99.9 ms".into(), Lo),
        (S1, "cpu_us_per_append", "S1 server CPU µs per append".into(), Lo),
        (S1, "rss_mb", "S1 server RSS after, MB".into(), Lo),
        (S1, "errors", "S1 errors".into(), Lo),
        (S1Wide, "appends_per_s", "S1 wide 512 producers, 64 streams, 1 KiB: appends/s".into(), Hi),
        (S1Wide, "p99_ms", "S1 wide p99 ms".into(), Lo),
        (S1Wide, "p999_ms", "S1 wide p99.9 ms".into(), Lo),
        (S1Wide, "cpu_us_per_append", "S1 wide server CPU µs per append".into(), Lo),
        (S1Wide, "rss_mb", "S1 wide server RSS after, MB".into(), Lo),
        (S1Wide, "errors", "S1 wide errors".into(), Lo),
        (Inflight1, "appends_per_s", "1 producer, 1 in flight: appends/s".into(), Hi),
        (Inflight5, "appends_per_s", "1 producer, 5 in flight: appends/s".into(), Hi),
        (Inflight5, "conflicts", "1 producer, 5 in flight: 409 answers".into(), Lo),
        (Inflight1, "us_per_append", "1 producer, 1 in flight: µs per append (wall time)".into(), Lo),
        (Inflight1, "cpu_us_per_append", "1 producer, 1 in flight: server CPU µs per append".into(), Lo),
        (Inflight5, "cpu_us_per_append", "1 producer, 5 in flight: server CPU µs per append".into(), Lo),
        (
            Inflight1,
            "disk_allocate_us",
            "bare pwrite + fdatasync of 1 KiB into allocated space, same disk: µs per write".into(),
            Lo,
        ),
        (
            Inflight1,
            "disk_extend_us",
            "bare pwrite + fdatasync of 1 KiB growing the file, same disk: µs per write".into(),
            Lo,
        ),
        (Inflight5, "requests_per_append", "1 producer, 5 in flight: requests per append".into(), Lo),
        (Sse200, "p50_ms", "200 SSE readers: delivery p50 ms".into(), Lo),
        (Sse200, "p99_ms", "200 SSE readers: delivery p99 ms".into(), Lo),
        (Sse200, "writer_per_s", "200 SSE readers: writer messages/s".into(), Hi),
        (Sse200, "readers_complete", "200 SSE readers: readers that got every message".into(), Hi),
        (Sse200, "cpu_us_per_delivery", "200 SSE readers: server CPU µs per delivery".into(), Lo),
        (Sse1000, "p50_ms", "1,000 SSE readers: delivery p50 ms".into(), Lo),
        (Sse1000, "p99_ms", "1,000 SSE readers: delivery p99 ms".into(), Lo),
        (Sse1000, "writer_per_s", "1,000 SSE readers: writer messages/s".into(), Hi),
        (Sse1000, "readers_complete", "1,000 SSE readers: readers that got every message".into(), Hi),
        (Sse1000, "missing", "1,000 SSE readers: deliveries missing".into(), Lo),
        (Sse1000, "cpu_us_per_delivery", "1,000 SSE readers: server CPU µs per delivery".into(), Lo),
        (Sse5000, "p99_ms", "5,000 SSE readers of one stream (default flags): delivery p99 ms".into(), Lo),
        (Sse5000, "writer_per_s", "5,000 SSE readers: writer messages/s".into(), Hi),
        (Sse5000, "readers_complete", "5,000 SSE readers: readers that got every message".into(), Hi),
        (Sse5000, "missing", "5,000 SSE readers: deliveries missing".into(), Lo),
        (Sse5000, "cpu_us_per_delivery", "5,000 SSE readers: server CPU µs per delivery".into(), Lo),
        (Longpoll50, "p50_ms", "50 long-poll readers: delivery p50 ms".into(), Lo),
        (Longpoll50, "p99_ms", "50 long-poll readers: delivery p99 ms".into(), Lo),
        (Longpoll50, "readers_complete", "50 long-poll readers: readers that got every message".into(), Hi),
    ];
    for (sc, size) in [(Catchup4k, "4 KiB"), (Catchup64k, "64 KiB"), (Catchup1m, "1 MiB")] {
        rows.extend([
            (sc, "mb_per_s", format!("catch-up {mb} MB in {size} appends, 4 readers: MB/s"), Hi),
            (sc, "per_request_mb_per_s", format!("catch-up, {size} appends, a connection per request: MB/s"), Hi),
            (sc, "cpu_ms_per_gb", format!("catch-up, {size} appends, keep-alive: server CPU ms per GB read"), Lo),
            (
                sc,
                "per_request_cpu_ms_per_gb",
                format!("catch-up, {size} appends, a connection per request: server CPU ms per GB"),
                Lo,
            ),
            (sc, "python_mb_per_s", format!("catch-up, {size} appends, Python http.client readers: MB/s"), Hi),
            (sc, "python_cpu_ms_per_gb", format!("catch-up, {size} appends, Python readers: server CPU ms per GB"), Lo),
            (sc, "curl_mb_per_s", format!("catch-up, {size} appends, curl once per request: MB/s"), Hi),
            (sc, "curl_cpu_ms_per_gb", format!("catch-up, {size} appends, curl readers: server CPU ms per GB"), Lo),
            (sc, "response_kb", format!("catch-up, {size} appends: KiB per response"), Hi),
            (sc, "write_mb_per_s", format!("catch-up, {size} appends: writing the stream, MB/s"), Hi),
            (sc, "rss_mb", format!("catch-up, {size} appends: server RSS after, MB"), Lo),
        ]);
    }
    rows.extend([
        (Streams, "streams_per_s", format!("{streams} streams, create + 1 append: streams/s"), Hi),
        (Streams, "errors", format!("{streams} streams: errors"), Lo),
        (Streams, "rss_mb", format!("{streams} streams: server RSS after, MB"), Lo),
        (Streams, "restart_ms", format!("{streams} streams: restart after SIGKILL until HEAD answers, ms"), Lo),
        (Recovery, "fill_mb_per_s", format!("recovery: writing {gb} GB (64 KiB appends, 4 streams), MB/s"), Hi),
        (Recovery, "data_mb", "recovery: data dir size, MB".into(), Lo),
        (Recovery, "recovery_ms", format!("recovery of {gb} GB after SIGKILL until HEAD shows every tail, ms"), Lo),
    ]);
    rows.into_iter().map(|(scenario, metric, label, better)| Row { scenario, metric, label, better }).collect()
}

/// The rows that also go into the chart, in chart order.
pub const HEADLINE: [(Scenario, &str); 9] = [
    (Scenario::S1, "appends_per_s"),
    (Scenario::S1, "p99_ms"),
    (Scenario::S1, "cpu_us_per_append"),
    (Scenario::Inflight5, "appends_per_s"),
    (Scenario::Sse200, "p99_ms"),
    (Scenario::Longpoll50, "p99_ms"),
    (Scenario::Catchup64k, "mb_per_s"),
    (Scenario::Streams, "streams_per_s"),
    (Scenario::Recovery, "recovery_ms"),
];

/// How the run was made: what the file's head says.
#[derive(Clone, Debug, Default)]
pub struct Header {
    /// `2026-11-28 09:44 UTC`, when the report was written.
    pub when: String,
    /// The run's stamp (`20261128T092511Z`).
    pub stamp: String,
    pub command_line: String,
    pub git_head: String,
    pub git_dirty: bool,
    pub cpus: String,
    /// `uname -sr`
    pub kernel: String,
    /// The first three fields of /proc/loadavg before the first scenario.
    pub load_before: String,
    pub target_dir: String,
    pub oncelog_extra: Vec<String>,
    pub max_read_bytes: Option<String>,
    /// The installed Node server's version, if any.
    pub node_installed: Option<String>,
    /// `node --version`, if it answered.
    pub node_runtime: Option<String>,
    pub run_dir: String,
}

impl Header {
    pub fn label(&self, server: Server) -> String {
        match server {
            Server::Oncelog => "Oncelog".to_string(),
            Server::Electric => format!("Electric {ELECTRIC_VERSION}"),
            Server::Node => format!("Node {}", self.node_installed.as_deref().unwrap_or(NODE_VERSION)),
        }
    }
}

/// Why a server was left out of the run (install or start failed).
pub type Skipped = BTreeMap<Server, String>;

fn cell(results: &Results, skipped: &Skipped, row: &Row, server: Server) -> String {
    match results.median(row.scenario, row.metric, server) {
        Some(m) => fmt_value(m),
        None if skipped.contains_key(&server) => "skipped".to_string(),
        None => "—".to_string(),
    }
}

/// The markdown result file.
pub fn markdown(h: &Header, cfg: &Config, results: &Results, skipped: &Skipped) -> String {
    let mut out = String::new();
    let mut line = |text: &str| {
        out.push_str(text);
        out.push('\n');
    };
    line("# Oncelog side by side with its peers");
    line("");
    line(&format!("- When: {} ({})", h.when, h.stamp));
    line(&format!("- Command: `{}`", h.command_line));
    let dirty = if h.git_dirty { " (with uncommitted changes in the working tree)" } else { "" };
    line(&format!("- git HEAD: `{}`{dirty}", h.git_head));
    line(&format!(
        "- Machine: {} CPUs, {}, load before the run {}; the load generator shares the CPUs with the server",
        h.cpus, h.kernel, h.load_before
    ));
    let catchup_note = match &h.max_read_bytes {
        Some(bytes) if cfg.scenarios.iter().any(|s| s.is_catchup()) => {
            format!("; catch-up with `--max-read-bytes {bytes}`")
        }
        _ => String::new(),
    };
    for server in &cfg.servers {
        line(&match server {
            Server::Oncelog => {
                let extra = if h.oncelog_extra.is_empty() {
                    String::new()
                } else {
                    format!(" with `{}`", h.oncelog_extra.join(" "))
                };
                format!("- Oncelog: `oncelog serve` (release, `{}`){extra}{catchup_note}", h.target_dir)
            }
            Server::Electric => format!(
                "- Electric: crates.io `durable-streams` {ELECTRIC_VERSION}, `durable-streams-server --durability wal`"
            ),
            Server::Node => format!(
                "- Node: npm `@durable-streams/server` {}, file-backed (`scripts/peers/node-server.mjs`), node {}",
                h.node_installed.as_deref().unwrap_or(NODE_VERSION),
                h.node_runtime.as_deref().unwrap_or("?")
            ),
        });
    }
    line(&format!(
        "- Each cell: median of {} round(s); every run on a fresh server and data dir; servers alternate within each scenario",
        cfg.rounds
    ));
    let writer = if cfg.sse_rate == 0 { "closed loop".to_string() } else { format!("{} messages/s", cfg.sse_rate) };
    line(&format!(
        "- Timed scenarios: {} s measured (S1 and in-flight after {} s warm-up); live writer {writer} of ~100 B JSON",
        cfg.duration, cfg.warmup
    ));
    for server in &cfg.servers {
        if let Some(reason) = skipped.get(server) {
            line(&format!("- **{} skipped**: {reason}", h.label(*server)));
        }
    }
    line("");

    let mut head = "| scenario |".to_string();
    let mut rule = "|---|".to_string();
    for server in &cfg.servers {
        let _ = write!(head, " {} |", h.label(*server));
        rule.push_str("---:|");
    }
    line(&format!("{head} Oncelog/Electric |"));
    line(&format!("{rule}---:|"));
    let shown: Vec<Row> = rows(cfg).into_iter().filter(|r| cfg.selected(r.scenario)).collect();
    for row in &shown {
        let arrow = match row.better {
            Better::Higher => " ↑",
            Better::Lower => " ↓",
        };
        let mut text = format!("| {}{arrow} |", row.label);
        for server in &cfg.servers {
            let _ = write!(text, " {} |", cell(results, skipped, row, *server));
        }
        let r = ratio(
            results.median(row.scenario, row.metric, Server::Oncelog),
            results.median(row.scenario, row.metric, Server::Electric),
        );
        line(&format!("{text} {r} |"));
    }
    line("");
    line("↑ higher is better, ↓ lower is better. Ratio = Oncelog / Electric of the medians.");

    let notes = results.notes();
    if !notes.is_empty() {
        line("");
        line("Notes:");
        line("");
        for (scenario, server, text) in notes {
            line(&format!("- {}, {}: {text}", scenario.name(), h.label(server)));
        }
    }
    if cfg.rounds > 1 {
        line("");
        line("All rounds:");
        line("");
        for row in &shown {
            let parts: Vec<String> = cfg
                .servers
                .iter()
                .filter_map(|s| {
                    let values = results.values(row.scenario, row.metric, *s);
                    (!values.is_empty()).then(|| format!(" {}: {}", h.label(*s), values.join(" ")))
                })
                .collect();
            if !parts.is_empty() {
                line(&format!("- {}:{}", row.label, parts.join(";")));
            }
        }
    }
    line("");
    line(&format!("Logs and every generator's output: `{}`", h.run_dir));
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A chart value: whole above 100, one decimal above 10, else two.
fn chart_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The chart: one group of horizontal bars per headline figure that has a value, each bar
/// scaled to the largest value of its group (units differ between groups), labelled with the
/// absolute value. `None` if no headline figure has a value.
pub fn svg(h: &Header, cfg: &Config, results: &Results) -> Option<String> {
    const COLORS: [&str; 3] = ["#2b6cb0", "#dd6b20", "#38a169"];
    const BAR: u32 = 18;
    const GAP: u32 = 4;
    const LEFT: u32 = 170;
    const WIDTH: f64 = 560.0;
    let all_rows = rows(cfg);
    let mut groups: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    for (scenario, metric) in HEADLINE {
        let Some(row) = all_rows.iter().find(|r| r.scenario == scenario && r.metric == metric) else { continue };
        if !cfg.selected(scenario) {
            continue;
        }
        let values: Vec<Option<f64>> = cfg.servers.iter().map(|s| results.median(scenario, row.metric, *s)).collect();
        if values.iter().any(Option::is_some) {
            let way = match row.better {
                Better::Higher => " (higher is better)",
                Better::Lower => " (lower is better)",
            };
            groups.push((format!("{}{way}", row.label), values));
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut body = String::new();
    let mut y: u32 = 60;
    for (label, values) in &groups {
        let max = values.iter().flatten().fold(0.0_f64, |m, v| if *v > m { *v } else { m });
        let _ = writeln!(body, "<text x=\"10\" y=\"{y}\" font-weight=\"bold\">{}</text>", esc(label));
        y += 8;
        for (i, (value, server)) in values.iter().zip(&cfg.servers).enumerate() {
            let yy = y + i as u32 * (BAR + GAP);
            let _ = writeln!(
                body,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
                LEFT - 6,
                yy + 13,
                esc(&h.label(*server))
            );
            let Some(v) = value else {
                let _ = writeln!(body, "<text x=\"{}\" y=\"{}\" fill=\"#888\">no result</text>", LEFT + 4, yy + 13);
                continue;
            };
            let w = if max > 0.0 { v / max * WIDTH } else { 0.0 }.max(1.0);
            let color = COLORS.get(i).copied().unwrap_or("");
            let _ =
                writeln!(body, "<rect x=\"{LEFT}\" y=\"{yy}\" width=\"{w:.1}\" height=\"{BAR}\" fill=\"{color}\"/>");
            let _ = writeln!(
                body,
                "<text x=\"{:.1}\" y=\"{}\">{}</text>",
                f64::from(LEFT) + w + 6.0,
                yy + 13,
                chart_value(*v)
            );
        }
        y += values.len() as u32 * (BAR + GAP) + 28;
    }
    let title = format!("Oncelog and peers, {} (git {})", h.stamp, h.git_head);
    Some(format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"{y}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{}</text>\n\
         {body}</svg>\n",
        esc(&title)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::options::PeersArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        args: PeersArgs,
    }

    fn config(words: &[&str]) -> Config {
        TestCli::try_parse_from(std::iter::once("peers").chain(words.iter().copied())).unwrap().args.validate().unwrap()
    }

    fn header() -> Header {
        Header {
            when: "2026-11-28 12:44 UTC".into(),
            stamp: "20261128T124154Z".into(),
            command_line: "scripts/bench-peers --servers oncelog,electric,node --scenarios s1,catchup4k --rounds 2"
                .into(),
            git_head: "8af6ebfbd6e6".into(),
            git_dirty: true,
            cpus: "2".into(),
            kernel: "Linux 6.18".into(),
            load_before: "1.63 1.91 1.54".into(),
            target_dir: "/work/main/target".into(),
            oncelog_extra: vec!["--hot-tail-mb".into(), "0".into()],
            max_read_bytes: Some("8388608".into()),
            node_installed: None,
            node_runtime: None,
            run_dir: "/c/runs/20261128T124154Z".into(),
        }
    }

    /// Two rounds of S1 and catch-up 4k: Oncelog both rounds, Electric one round of S1 only,
    /// Node skipped.
    fn results() -> (Results, Skipped) {
        let mut r = Results::default();
        let on = Server::Oncelog;
        for v in ["12086.0", "6289.0"] {
            r.record(Scenario::S1, "appends_per_s", on, Some(v));
        }
        for v in ["11.719", "25.112"] {
            r.record(Scenario::S1, "p99_ms", on, Some(v));
        }
        for v in ["64.8", "71.5"] {
            r.record(Scenario::S1, "cpu_us_per_append", on, Some(v));
        }
        for v in ["0", "0"] {
            r.record(Scenario::S1, "errors", on, Some(v));
            r.record(Scenario::S1, "errors", Server::Electric, Some(v));
        }
        r.record(Scenario::S1, "appends_per_s", Server::Electric, Some("6201.0"));
        r.record(Scenario::S1, "p99_ms", Server::Electric, Some("91.705"));
        for v in ["29", "28"] {
            r.record(Scenario::Catchup4k, "rss_mb", on, Some(v));
        }
        r.note(Scenario::S1, Server::Electric, "round 2: generator failed".into());
        let mut skipped = Skipped::new();
        skipped.insert(Server::Node, "install failed (see /c/runs/x/install-node.log)".into());
        (r, skipped)
    }

    #[test]
    fn the_markdown_file() {
        let cfg = config(&["--servers", "oncelog,electric,node", "--scenarios", "s1,catchup4k", "--rounds", "2"]);
        let (results, skipped) = results();
        let md = markdown(&header(), &cfg, &results, &skipped);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "# Oncelog side by side with its peers");
        assert_eq!(lines[2], "- When: 2026-11-28 12:44 UTC (20261128T124154Z)");
        assert_eq!(
            lines[3],
            "- Command: `scripts/bench-peers --servers oncelog,electric,node --scenarios s1,catchup4k --rounds 2`"
        );
        assert_eq!(lines[4], "- git HEAD: `8af6ebfbd6e6` (with uncommitted changes in the working tree)");
        assert_eq!(
            lines[5],
            "- Machine: 2 CPUs, Linux 6.18, load before the run 1.63 1.91 1.54; the load generator shares the CPUs with the server"
        );
        assert_eq!(
            lines[6],
            "- Oncelog: `oncelog serve` (release, `/work/main/target`) with `--hot-tail-mb 0`; catch-up with `--max-read-bytes 8388608`"
        );
        assert_eq!(
            lines[7],
            "- Electric: crates.io `durable-streams` 0.1.5, `durable-streams-server --durability wal`"
        );
        assert_eq!(
            lines[8],
            "- Node: npm `@durable-streams/server` 0.3.7, file-backed (`scripts/peers/node-server.mjs`), node ?"
        );
        assert_eq!(
            lines[9],
            "- Each cell: median of 2 round(s); every run on a fresh server and data dir; servers alternate within each scenario"
        );
        assert_eq!(
            lines[10],
            "- Timed scenarios: 20 s measured (S1 and in-flight after 3 s warm-up); live writer 100 messages/s of ~100 B JSON"
        );
        assert_eq!(lines[11], "- **Node 0.3.7 skipped**: install failed (see /c/runs/x/install-node.log)");
        assert_eq!(lines[12], "");
        assert_eq!(lines[13], "| scenario | Oncelog | Electric 0.1.5 | Node 0.3.7 | Oncelog/Electric |");
        assert_eq!(lines[14], "|---|---:|---:|---:|---:|");
        assert_eq!(lines[15], "| S1 64 producers, 8 streams, 1 KiB: appends/s ↑ | 9,188 | 6,201 | skipped | 1.48 |");
        assert_eq!(lines[16], "| S1 p50 ms ↓ | — | — | skipped | — |");
        assert_eq!(lines[17], "| S1 p99 ms ↓ | 18.4 | 91.7 | skipped | 0.20 |");
        assert!(md.contains("\n| S1 server CPU µs per append ↓ | 68.2 | — | skipped | — |\n"));
        assert!(md.contains("\n| S1 errors ↓ | 0 | 0 | skipped | — |\n"));
        assert!(md.contains("\n| catch-up 500 MB in 4 KiB appends, 4 readers: MB/s ↑ | — | — | skipped | — |\n"));
        assert!(md.contains("\n| catch-up, 4 KiB appends: server RSS after, MB ↓ | 28.5 | — | skipped | — |\n"));
        // 7 rows of S1, 11 of catch-up 4k, nothing of the unselected scenarios.
        assert_eq!(lines.iter().filter(|l| l.starts_with("| ") && l.ends_with(" |")).count(), 1 + 18);
        assert!(!md.contains("S1 wide"));
        let notes = lines.iter().position(|l| *l == "Notes:").unwrap();
        assert_eq!(lines[notes + 2], "- s1, Electric 0.1.5: round 2: generator failed");
        let all = lines.iter().position(|l| *l == "All rounds:").unwrap();
        assert!(all > notes);
        assert_eq!(
            lines[all + 2],
            "- S1 64 producers, 8 streams, 1 KiB: appends/s: Oncelog: 12086.0 6289.0; Electric 0.1.5: 6201.0"
        );
        assert_eq!(lines[all + 3], "- S1 p99 ms: Oncelog: 11.719 25.112; Electric 0.1.5: 91.705");
        assert!(md.contains("\n- S1 errors: Oncelog: 0 0; Electric 0.1.5: 0 0\n"));
        assert!(md.contains("\n- catch-up, 4 KiB appends: server RSS after, MB: Oncelog: 29 28\n"));
        assert_eq!(lines[lines.len() - 2], "");
        assert_eq!(lines[lines.len() - 1], "Logs and every generator's output: `/c/runs/20261128T124154Z`");
        assert!(md.ends_with('\n'));
    }

    #[test]
    fn one_round_has_no_round_list_and_a_clean_head() {
        let cfg = config(&["--servers", "oncelog", "--scenarios", "inflight1", "--sse-rate", "0"]);
        let h = Header { git_dirty: false, oncelog_extra: vec![], max_read_bytes: None, ..header() };
        let md = markdown(&h, &cfg, &Results::default(), &Skipped::new());
        assert!(md.contains("\n- git HEAD: `8af6ebfbd6e6`\n"));
        assert!(md.contains("\n- Oncelog: `oncelog serve` (release, `/work/main/target`)\n"));
        assert!(md.contains("live writer closed loop of ~100 B JSON\n"));
        assert!(md.contains("\n| scenario | Oncelog | Oncelog/Electric |\n|---|---:|---:|\n"));
        assert!(md.contains("\n| 1 producer, 1 in flight: appends/s ↑ | — | — |\n"));
        assert!(!md.contains("All rounds:"));
        assert!(!md.contains("Notes:"));
        assert!(!md.contains("skipped"));
    }

    #[test]
    fn row_labels_carry_the_sizes() {
        let cfg = config(&["--catchup-mb", "20", "--streams-count", "1000000", "--recovery-gb", "2.5"]);
        let labels: Vec<String> = rows(&cfg).into_iter().map(|r| r.label).collect();
        assert_eq!(labels.len(), 81);
        assert!(labels.contains(&"catch-up 20 MB in 64 KiB appends, 4 readers: MB/s".to_string()));
        assert!(labels.contains(&"1,000,000 streams, create + 1 append: streams/s".to_string()));
        assert!(labels.contains(&"recovery of 2.5 GB after SIGKILL until HEAD shows every tail, ms".to_string()));
        // Every headline figure is a row.
        for (sc, metric) in HEADLINE {
            assert!(rows(&cfg).iter().any(|r| r.scenario == sc && r.metric == metric), "{sc:?} {metric}");
        }
    }

    #[test]
    fn the_chart() {
        let cfg = config(&["--servers", "oncelog,electric,node", "--scenarios", "s1,catchup4k", "--rounds", "2"]);
        let (results, _) = results();
        let svg = svg(&header(), &cfg, &results).unwrap();
        let lines: Vec<&str> = svg.lines().collect();
        // Three groups (S1 appends/s, p99, CPU) of three bars: 60 + 3 * (8 + 3 * 22 + 28).
        assert_eq!(
            lines[0],
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"366\" font-family=\"sans-serif\" font-size=\"12\">"
        );
        assert_eq!(
            lines[2],
            "<text x=\"10\" y=\"28\" font-size=\"16\" font-weight=\"bold\">Oncelog and peers, 20261128T124154Z (git 8af6ebfbd6e6)</text>"
        );
        assert_eq!(
            lines[3],
            "<text x=\"10\" y=\"60\" font-weight=\"bold\">S1 64 producers, 8 streams, 1 KiB: appends/s (higher is better)</text>"
        );
        assert_eq!(lines[4], "<text x=\"164\" y=\"81\" text-anchor=\"end\">Oncelog</text>");
        assert_eq!(lines[5], "<rect x=\"170\" y=\"68\" width=\"560.0\" height=\"18\" fill=\"#2b6cb0\"/>");
        assert_eq!(lines[6], "<text x=\"736.0\" y=\"81\">9188</text>");
        assert_eq!(lines[8], "<rect x=\"170\" y=\"90\" width=\"378.0\" height=\"18\" fill=\"#dd6b20\"/>");
        assert_eq!(lines[9], "<text x=\"554.0\" y=\"103\">6201</text>");
        assert_eq!(lines[10], "<text x=\"164\" y=\"125\" text-anchor=\"end\">Node 0.3.7</text>");
        assert_eq!(lines[11], "<text x=\"174\" y=\"125\" fill=\"#888\">no result</text>");
        assert!(svg.contains("S1 server CPU µs per append (lower is better)"));
        assert_eq!(*lines.last().unwrap(), "</svg>");
        // Nothing to draw: no chart.
        let none = config(&["--scenarios", "s1wide"]);
        assert!(super::svg(&header(), &none, &results).is_none());
        assert_eq!(esc("a<b>&c"), "a&lt;b&gt;&amp;c");
    }
}
