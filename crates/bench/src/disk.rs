//! `oncelog-bench disk`: the physical limit of one durable append on this disk — a bare loop of
//! `pwrite` + `fdatasync` of `--bytes` at the end of a file in `--dir`, one at a time, for
//! `--seconds`. A server acknowledging one append at a time cannot beat this; the ratio of its
//! time per append to this loop's is what the server itself costs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use oncelog_log::fs::{File, Fs, RealFs};

use crate::common::{json_f64, json_str, summary_line};

#[derive(clap::Args, Debug)]
pub struct DiskArgs {
    /// Where the scratch file goes (removed at the end): the disk the servers write to.
    #[arg(long)]
    pub dir: PathBuf,
    /// Bytes per write.
    #[arg(long, default_value_t = 1024)]
    pub bytes: usize,
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// How the file's space is prepared: `extend` (each write grows the file, so each
    /// `fdatasync` also flushes a new size), `allocate` (`fallocate` of 64 MiB first, as the log
    /// engine's segments are), or `zeroed` (64 MiB of zeros written and synced first).
    #[arg(long, value_enum, default_value_t = Space::Extend)]
    pub space: Space,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Extend,
    Allocate,
    Zeroed,
}

/// Space prepared ahead by `--space allocate|zeroed`.
const PREPARED: u64 = 64 << 20;

/// The log engine's own file calls (`oncelog_log::fs`), so `allocate` is exactly what a new
/// segment gets.
fn prepare(file: &dyn File, space: Space) -> Result<(), String> {
    match space {
        Space::Extend => return Ok(()),
        Space::Allocate => file.allocate(PREPARED).map_err(|e| format!("fallocate: {e}"))?,
        Space::Zeroed => {
            let zeros = vec![0u8; 1 << 20];
            for i in 0..PREPARED / zeros.len() as u64 {
                file.write_all_at(&zeros, i * zeros.len() as u64).map_err(|e| format!("write zeros: {e}"))?;
            }
        }
    }
    file.sync_data().map_err(|e| format!("fdatasync: {e}"))
}

pub fn run(args: DiskArgs) -> Result<(), String> {
    let name = format!("oncelog-bench-disk-{}", std::process::id());
    let path = args.dir.join(&name);
    let file = RealFs::new(&args.dir).open(&name, true).map_err(|e| format!("create {}: {e}", path.display()))?;
    let buf = vec![0x5a_u8; args.bytes.max(1)];
    if let Err(e) = prepare(&*file, args.space) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    let (start, limit) = (Instant::now(), Duration::from_secs(args.seconds.max(1)));
    let (mut writes, mut at) = (0u64, 0u64);
    let result = (|| {
        while start.elapsed() < limit {
            file.write_all_at(&buf, at).map_err(|e| format!("pwrite: {e}"))?;
            file.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
            at += buf.len() as u64;
            writes += 1;
        }
        Ok::<(), String>(())
    })();
    let _ = std::fs::remove_file(&path);
    result?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        summary_line(&[
            ("bench", json_str("disk")),
            ("space", json_str(&format!("{:?}", args.space).to_lowercase())),
            ("bytes", buf.len().to_string()),
            ("writes", writes.to_string()),
            ("writes_per_s", json_f64(writes as f64 / secs, 1)),
            ("us_per_write", json_f64(secs * 1e6 / writes.max(1) as f64, 1)),
        ])
    );
    Ok(())
}
