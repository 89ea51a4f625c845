//! Deliberate defects, for showing that the power-loss simulation notices each broken guarantee
//! (`power_loss.rs`). They exist in test builds only: elsewhere there is no [`Mutant`], and the
//! write path checks for none ([`is_on!`] is the constant `false`, so its branches compile away).

/// A deliberate defect.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    None,
    /// Acknowledge without `fdatasync`.
    SkipSync,
    /// Start segments without syncing the directory.
    SkipDirSync,
    /// Write producer state in its own frame after the data's, as stores that keep it apart do.
    SplitProducer,
    /// Write a compaction's trim in its own frame after its snapshot's.
    CompactInTwoFrames,
    /// Write a transaction's metadata (its Meta records) in its own frame after its appends'.
    SplitTxn,
}

/// Whether the store config `$cfg` runs with mutant `$m` (always `false` outside tests).
macro_rules! is_on {
    ($cfg:expr, $m:ident) => {{
        #[cfg(test)]
        let on = $cfg.mutant == $crate::store::mutant::Mutant::$m;
        #[cfg(not(test))]
        let on = {
            let _ = &$cfg;
            false
        };
        on
    }};
}
pub(crate) use is_on;
