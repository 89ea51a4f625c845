//! Object names under a bucket prefix (docs/design/issue-35-plan.md, "Bucket layout").
//! Numbers are zero-padded so a listing's order is the numbers' order.

/// The folder of the manifests.
pub const MANIFESTS: &str = "manifest";

/// Manifest number `n`.
pub fn manifest(n: u64) -> String {
    format!("{MANIFESTS}/{n:020}")
}

/// The number of a manifest from the last part of its name (`None`: not a manifest's name).
pub fn manifest_number(name: &str) -> Option<u64> {
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.parse().ok()).flatten()
}

/// A range of segment `segment` shipped from byte `pos` by the writer of `epoch`. The epoch
/// keeps a fenced writer's objects apart from its successor's for the same range.
pub fn range(epoch: u64, segment: u64, pos: u64) -> String {
    format!("epoch-{epoch:010}/seg-{segment:020}-{pos:012}")
}

/// The checkpoint as of `lsn`, shipped by the writer of `epoch`.
pub fn checkpoint(epoch: u64, lsn: u64) -> String {
    format!("epoch-{epoch:010}/ckp-{lsn:020}")
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
        assert!(range(1, 2, 99) < range(1, 2, 100) && range(1, 2, 100) < range(1, 3, 0));
        assert_eq!(checkpoint(3, 12), "epoch-0000000003/ckp-00000000000000000012");
    }
}
