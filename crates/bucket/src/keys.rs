//! Object names under a bucket prefix (docs/design/issue-35-plan.md, "Bucket layout").
//! Numbers are zero-padded so a listing's order is the numbers' order.

/// The folder of the manifests.
pub const MANIFESTS: &str = "manifest";

/// The folder of the takeovers' claims.
pub const CLAIMS: &str = "claim";

/// The claim of the takeover that will be writer epoch `epoch` ([`crate::Bucket::take_over`]):
/// the writer of the epoch before it yields when it finds it.
pub fn claim(epoch: u64) -> String {
    format!("{CLAIMS}/{epoch:020}")
}

/// Manifest number `n`.
pub fn manifest(n: u64) -> String {
    format!("{MANIFESTS}/{n:020}")
}

/// The number of a manifest from the last part of its name (`None`: not a manifest's name).
pub fn manifest_number(name: &str) -> Option<u64> {
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.parse().ok()).flatten()
}

/// Bytes `[pos, end)` of segment `segment` shipped by the writer of `epoch`. The epoch keeps
/// a fenced writer's objects apart from its successor's for the same range. Why the end is in
/// the name: a PUT whose answer was lost may have stored the object, and the next round ships
/// from the same position with more bytes; under its own name (synced bytes never change
/// within an epoch) a name always means one content, and a second create of it is the same
/// object again.
pub fn range(epoch: u64, segment: u64, pos: u64, end: u64) -> String {
    format!("epoch-{epoch:010}/seg-{segment:020}-{pos:012}-{end:012}")
}

/// The checkpoint as of `lsn` with CRC32C `crc`, shipped by the writer of `epoch` (the CRC in
/// the name for the reason of [`range`]'s end: two checkpoints as of one LSN may differ in their
/// clock readings).
pub fn checkpoint(epoch: u64, lsn: u64, crc: u32) -> String {
    format!("epoch-{epoch:010}/ckp-{lsn:020}-{crc:08x}")
}

/// The segment table (docs in [`crate::manifest`]) of segments `first..=last` with CRC32C
/// `crc`, written by the writer of `epoch` (named by its content, as [`range`]).
pub fn table(epoch: u64, first: u64, last: u64, crc: u32) -> String {
    format!("epoch-{epoch:010}/tab-{first:020}-{last:020}-{crc:08x}")
}

/// Whether `key` is one of the log's objects (a range, a checkpoint or a segment table of some
/// epoch), the only objects a sweep may delete.
pub fn is_log_object(key: &str) -> bool {
    let Some((epoch, name)) = key.split_once('/') else { return false };
    epoch.strip_prefix("epoch-").is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
        && (name.starts_with("seg-") || name.starts_with("ckp-") || name.starts_with("tab-"))
        && !name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_as_their_numbers_and_read_back() {
        assert_eq!(manifest(7), "manifest/00000000000000000007");
        assert_eq!(manifest_number(&manifest(u64::MAX)[MANIFESTS.len() + 1..]), Some(u64::MAX));
        assert_eq!(manifest_number("0000000000000000007"), None);
        assert_eq!(manifest_number("0000000000000000000x"), None);
        assert!(manifest(9) < manifest(10));
        assert!(range(1, 2, 99, 120) < range(1, 2, 100, 101) && range(1, 2, 100, 200) < range(1, 3, 0, 1));
        assert_ne!(range(1, 2, 100, 150), range(1, 2, 100, 151));
        assert_eq!(claim(2), "claim/00000000000000000002");
        assert!(!is_log_object(&claim(2)), "a sweep never deletes a claim");
        assert_eq!(checkpoint(3, 12, 0xab), "epoch-0000000003/ckp-00000000000000000012-000000ab");
        assert!(is_log_object(&range(1, 2, 3, 4)) && is_log_object(&checkpoint(5, 6, 7)));
        assert!(is_log_object(&table(1, 2, 3, 4)));
        for other in [manifest(1).as_str(), "epoch-/seg-1", "epoch-1x/seg-1", "epoch-1/other", "epoch-1/seg-1/x", "x"] {
            assert!(!is_log_object(other), "{other}");
        }
    }
}
