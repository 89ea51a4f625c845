//! Offsets: opaque to clients, a byte position in the logical stream to us.
//!
//! An offset is rendered as `GGGGGGGGGGGGGGGG_PPPPPPPPPPPPPPPP`: two zero-padded 16-digit decimal
//! fields, so that the lexicographic order of tokens equals the numeric order of positions
//! (protocol section 8, property 2). `G` is a log generation, always 0 in this version and
//! reserved for retention or compaction that renumbers positions; `P` is the byte position. The
//! shape matches the reference implementation's, so clients that hard-code the start token
//! `0000000000000000_0000000000000000` work. A token never contains `,`, `&`, `=`, `?` or `/`,
//! and can never be one of the sentinels `-1` or `now`.
//!
//! The position counts bytes of the stream's *stored* form. For byte streams that is the body
//! bytes; for JSON streams it is the stored framing (see [`crate::json`]), so positions are always
//! message boundaries there.

use std::fmt;

/// A position in a stream: the number of stored bytes before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

/// Why an `offset` token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    #[error("offset must be -1, now, or a token returned by this server")]
    Malformed,
}

impl Offset {
    /// Digits per field.
    const FIELD: usize = 16;
    /// The largest position a token can carry (10^16 - 1 bytes, about 8.9 PiB).
    pub const MAX: Offset = Offset(9_999_999_999_999_999);
    pub const ZERO: Offset = Offset(0);

    /// Parses a token previously produced by [`Offset`]'s `Display`.
    pub fn parse(token: &str) -> Result<Offset, OffsetError> {
        let (generation, position) = token.split_once('_').ok_or(OffsetError::Malformed)?;
        let digits = |s: &str| s.len() == Self::FIELD && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(generation) || !digits(position) || generation.bytes().any(|b| b != b'0') {
            return Err(OffsetError::Malformed);
        }
        position.parse::<u64>().map(Offset).map_err(|_| OffsetError::Malformed)
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0000000000000000_{:016}", self.0)
    }
}

/// The value of a read request's `offset` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetParam {
    /// `-1` or no parameter: the beginning of the stream.
    Start,
    /// `now`: the tail at the time the request is processed.
    Now,
    /// A concrete position.
    At(Offset),
}

impl OffsetParam {
    /// Parses the query parameter; `None` (absent) means the beginning.
    pub fn parse(raw: Option<&str>) -> Result<OffsetParam, OffsetError> {
        match raw {
            None | Some("-1") => Ok(OffsetParam::Start),
            Some("now") => Ok(OffsetParam::Now),
            Some(token) => Offset::parse(token).map(OffsetParam::At),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sentinels_and_tokens() {
        assert_eq!(OffsetParam::parse(None), Ok(OffsetParam::Start));
        assert_eq!(OffsetParam::parse(Some("-1")), Ok(OffsetParam::Start));
        assert_eq!(OffsetParam::parse(Some("now")), Ok(OffsetParam::Now));
        assert_eq!(OffsetParam::parse(Some("0000000000000000_0000000000000042")), Ok(OffsetParam::At(Offset(42))));
        for bad in [
            "",
            "-2",
            "abc",
            "42",
            "0000000000000000_000000000000004,",
            "0000000000000000_+000000000000042",
            "0000000000000001_0000000000000042",
            "0000000000000000_00000000000000042",
            "-1\n",
        ] {
            assert_eq!(OffsetParam::parse(Some(bad)), Err(OffsetError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn max_offset_round_trips() {
        let o = Offset::MAX;
        assert_eq!(Offset::parse(&o.to_string()), Ok(o));
    }

    proptest! {
        #[test]
        fn tokens_sort_as_positions(a in 0..=Offset::MAX.0, b in 0..=Offset::MAX.0) {
            let (ta, tb) = (Offset(a).to_string(), Offset(b).to_string());
            prop_assert_eq!(ta.cmp(&tb), a.cmp(&b));
            prop_assert_eq!(Offset::parse(&ta), Ok(Offset(a)));
            prop_assert!(!ta.contains([',', '&', '=', '?', '/']));
            prop_assert!(ta != "-1" && ta != "now");
        }
    }
}
