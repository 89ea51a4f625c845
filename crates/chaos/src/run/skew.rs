//! Clock skew for one node: `skew/skew.c`, a preloaded library that moves `CLOCK_REALTIME` by
//! `ONCELOG_SKEW_MS` (libfaketime's technique, without needing libfaketime installed), built
//! here with the system's C compiler (present wherever Rust links).

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = include_str!("../../skew/skew.c");

#[derive(Debug, thiserror::Error)]
#[error("cannot build the clock-skew library with cc: {0}")]
pub struct SkewError(String);

/// Builds the library into `dir`; its path.
pub fn build(dir: &Path) -> Result<PathBuf, SkewError> {
    let src = dir.join("skew.c");
    let lib = dir.join("libskew.so");
    std::fs::write(&src, SOURCE).map_err(|e| SkewError(e.to_string()))?;
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .map_err(|e| SkewError(e.to_string()))?;
    if !out.status.success() {
        return Err(SkewError(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(lib)
}
