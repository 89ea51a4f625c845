//! Ready: after a restart, poll HEAD of the streams in a manifest until each answers 200 with
//! the tail recorded before the crash. Reports the time until the first answer of any kind and
//! until every stream was back, measured from `--since-unix-ns` (when the caller started the
//! server) or from this command's own start.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{self, json_f64, json_str};

#[derive(clap::Args, Debug)]
pub struct ReadyArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// NAME<TAB>TAIL lines, as written by `streams` or `fill`.
    #[arg(long)]
    pub manifest: PathBuf,
    /// Wall-clock time (ns since the Unix epoch, as from `date +%s%N`) the server was started;
    /// times are reported from then. Without it, from this command's start.
    #[arg(long)]
    pub since_unix_ns: Option<u128>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// A stream answering 200 with another tail is polled this long more before it counts
    /// as a mismatch (lost or extra data), in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub mismatch_grace_ms: u64,
    /// Pause between two polls, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub poll_ms: u64,
}

pub async fn run(args: ReadyArgs) -> Result<(), String> {
    let target = args.target.resolve()?;
    let entries = common::read_manifest(&args.manifest)?;
    let start = Instant::now();
    // How long before `start` the server was started.
    let head_start = match args.since_unix_ns {
        Some(ns) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_err(|e| format!("system clock before 1970: {e}"))?
                .as_nanos();
            Duration::from_nanos(u64::try_from(now.saturating_sub(ns)).unwrap_or(u64::MAX))
        }
        None => Duration::ZERO,
    };
    let since = |at: Instant| (head_start + at.duration_since(start)).as_secs_f64() * 1000.0;
    let deadline = start + Duration::from_secs(args.timeout.max(1));
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let grace = Duration::from_millis(args.mismatch_grace_ms);
    let client = common::client(Duration::from_secs(5))?;

    let mut first_answer: Option<Instant> = None;
    let mut mismatches = Vec::new();
    let mut missing = 0usize;
    let mut polls = 0u64;
    for (name, tail) in &entries {
        let url = target.stream_url(name);
        let mut wrong_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                missing += 1;
                break;
            }
            polls += 1;
            let answer = common::head_tail(&client, &url).await;
            let now = Instant::now();
            if let Ok((status, got)) = answer {
                first_answer.get_or_insert(now);
                if status == 200 && got.as_deref() == Some(tail.as_str()) {
                    break;
                }
                if status == 200 {
                    let since_wrong = *wrong_since.get_or_insert(now);
                    if now.duration_since(since_wrong) >= grace {
                        mismatches
                            .push(format!("{name}: tail {} instead of {tail}", got.as_deref().unwrap_or("(none)")));
                        break;
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
    }
    let all_done = Instant::now();
    let ready = missing == 0 && mismatches.is_empty();
    let first_ms = first_answer.map(since);
    let ready_ms = since(all_done);

    println!(
        "Ready results: {} streams checked, {} back with the right tail, {} mismatched, {} not answering",
        entries.len(),
        entries.len() - mismatches.len() - missing,
        mismatches.len(),
        missing
    );
    println!("  first answer          {}", first_ms.map_or("never".to_string(), |ms| format!("{ms:.0} ms")));
    println!("  all streams back      {ready_ms:.0} ms ({polls} polls)");
    for m in &mismatches {
        println!("    {m}");
    }
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str("ready")),
            ("streams", entries.len().to_string()),
            ("ready", ready.to_string()),
            ("first_answer_ms", first_ms.map_or("null".into(), |ms| json_f64(ms, 1))),
            ("ready_ms", json_f64(ready_ms, 1)),
            ("mismatches", mismatches.len().to_string()),
            ("missing", missing.to_string()),
            ("polls", polls.to_string()),
        ])
    );
    if ready {
        Ok(())
    } else {
        Err(format!("{} streams with another tail, {} not answering", mismatches.len(), missing))
    }
}
