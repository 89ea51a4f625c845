//! The stored forms of the engine-neutral state — stream metadata ([`stream_meta`]), producer
//! states ([`producer`]), idempotency key entries ([`key_entry`]), retention time marks
//! ([`marks`]) — and the small field encoder both of Oncelog's engines build their on-disk
//! records with (subscriptions' stored forms, built with it too, are in the
//! `oncelog-subscriptions` crate's `codec`).
//!
//! Every value starts with a one-byte tag that names its type *and* version; a decoder refuses a
//! tag it does not know rather than guessing. Integers are little-endian fixed width inside
//! values (engines that need byte-ordered keys encode those big-endian themselves).
//!
//! Hand-written rather than serde-derived: the format is an on-disk contract, and a derive would
//! let a field rename silently change it.

pub mod key_entry;
pub mod marks;
pub mod producer;
pub mod stream_meta;

pub use producer::ProducerRecord;

impl From<DecodeError> for crate::engine::StorageError {
    fn from(e: DecodeError) -> Self {
        crate::engine::StorageError::Corrupt(std::sync::Arc::new(e))
    }
}

impl From<DecodeError> for crate::engine::LookupError {
    fn from(e: DecodeError) -> Self {
        crate::engine::LookupError::Storage(e.into())
    }
}

/// A stored value that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown record tag {0:#04x}")]
    UnknownTag(u8),
    #[error("record truncated")]
    Truncated,
    #[error("record has trailing bytes")]
    TrailingBytes,
    #[error("record holds invalid UTF-8")]
    InvalidUtf8,
    #[error("record holds an invalid enum value")]
    InvalidValue,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(v: u64) {
            let mut e = Encoder::default();
            e.varint(v);
            prop_assert!(e.0.len() <= 10);
            let mut d = Decoder(&e.0);
            prop_assert_eq!(d.varint(), Ok(v));
            prop_assert!(d.finish().is_ok());
        }
    }

    #[test]
    fn overlong_varints_are_refused() {
        assert_eq!(Decoder(&[0xff; 11]).varint(), Err(DecodeError::InvalidValue));
        assert_eq!(Decoder(&[0x80]).varint(), Err(DecodeError::Truncated));
    }
}

/// Appends fields to a value.
#[derive(Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// LEB128 variable-length integer: 7 bits per byte, low first; small numbers take one byte.
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
    /// Length-prefixed (u32) bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(&v[..len as usize]);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads fields from a value, failing on truncation.
pub struct Decoder<'a>(pub &'a [u8]);

impl<'a> Decoder<'a> {
    /// The next `n` raw bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(b))
    }
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f).checked_shl(shift).ok_or(DecodeError::InvalidValue)?;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    return Err(DecodeError::InvalidValue);
                }
                return Ok(v);
            }
        }
        Err(DecodeError::InvalidValue)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        self.take(u32::from_le_bytes(b) as usize)
    }
    pub fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::InvalidUtf8)
    }
    /// Reads the leading tag byte and refuses any other than `expected`.
    pub fn tag(&mut self, expected: u8) -> Result<(), DecodeError> {
        match self.u8()? {
            t if t == expected => Ok(()),
            t => Err(DecodeError::UnknownTag(t)),
        }
    }
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::InvalidValue),
        }
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.0.len()
    }
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}
