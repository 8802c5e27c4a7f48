//! Writing and reading operators' state at a barrier: the records of a snapshot
//! ([`Records`], gathered and then written in `(vnode, key)` order), the bounds-checked
//! cursor every decoder reads with ([`Reader`]), and the check of restored keys against
//! their canonical encoding ([`check_keys`]), so a damaged record or one of another plan
//! is a typed `state.corrupt` error naming the state, never a panic. Each operator's
//! module documents its own layout.

use sluice_types::SluiceError;

/// The error of a damaged record of `state` (e.g. "window aggregate").
pub(crate) fn corrupt(state: &str, what: &str) -> SluiceError {
    SluiceError::internal("state.corrupt", format!("{state} state is damaged or from another plan: {what}"))
}

/// Keys a restore checks per decoding.
const CHECKED_KEYS: usize = 4096;

/// Refuses `keys` unless each is a key of `encoder`'s columns in its canonical encoding
/// (decoded and encoded again, it gives its own bytes): a key of another plan, or one
/// that a later row of the same value would not find. `what` names the keys in errors.
pub(crate) fn check_keys<'k>(
    encoder: &sluice_types::key::KeyEncoder,
    keys: impl Iterator<Item = &'k [u8]>,
    state: &str,
    what: &str,
) -> Result<(), SluiceError> {
    let refused = || corrupt(state, &format!("{what} of another plan"));
    if encoder.types().is_empty() {
        // No key columns: the one key is empty.
        return if keys.into_iter().all(<[u8]>::is_empty) { Ok(()) } else { Err(refused()) };
    }
    let mut chunk: Vec<&[u8]> = Vec::with_capacity(CHECKED_KEYS);
    let mut encoded = sluice_types::key::KeyRows::default();
    let mut keys = keys.peekable();
    while keys.peek().is_some() {
        chunk.clear();
        chunk.extend(keys.by_ref().take(CHECKED_KEYS));
        let columns = encoder.decode(chunk.iter().copied()).map_err(|_| refused())?;
        encoder.encode(&columns, &mut encoded).map_err(|_| refused())?;
        if encoded.len() != chunk.len() || chunk.iter().enumerate().any(|(index, key)| encoded.row(index) != *key) {
            return Err(refused());
        }
    }
    Ok(())
}

/// A bounds-checked, little-endian cursor over one record's key or value of `state`.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    state: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], state: &'static str) -> Reader<'a> {
        Reader { bytes, state }
    }

    /// The bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Refuses bytes after the last value.
    pub(crate) fn finish(&self) -> Result<(), SluiceError> {
        if self.bytes.is_empty() { Ok(()) } else { Err(corrupt(self.state, "trailing bytes")) }
    }

    pub(crate) fn take(&mut self, count: usize) -> Result<&'a [u8], SluiceError> {
        if self.bytes.len() < count {
            return Err(corrupt(self.state, "truncated"));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, SluiceError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, SluiceError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, SluiceError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, SluiceError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn f64(&mut self) -> Result<f64, SluiceError> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A `u32` length, then that many bytes.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], SluiceError> {
        let length = self.u32()? as usize;
        self.take(length)
    }
}

/// Appends `value` as a zigzag varint: `(n << 1) ^ (n >> 63)` in unsigned LEB128 (7 bits
/// a byte, least significant first, the high bit set on every byte but the last), as the
/// manifest's postcard body writes an `i64`. Small magnitudes take one byte.
pub(crate) fn put_signed(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

impl<'a> Reader<'a> {
    /// A zigzag varint ([`put_signed`]) in its shortest form.
    pub(crate) fn signed(&mut self) -> Result<i64, SluiceError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let group = u64::from(byte & 0x7f);
            if shift == 63 && group > 1 {
                return Err(corrupt(self.state, "a varint past 64 bits"));
            }
            value |= group << shift;
            if byte & 0x80 == 0 {
                if byte == 0 && shift > 0 {
                    return Err(corrupt(self.state, "a varint longer than needed"));
                }
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(corrupt(self.state, "a varint past 64 bits"))
    }

    /// A big-endian u64 (the byte order of keys, where byte order is numeric order).
    pub(crate) fn u64_be(&mut self) -> Result<u64, SluiceError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// The bytes not read yet, all of them.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}

/// An i64 as 8 big-endian bytes whose byte order is the numbers' order (the sign bit
/// flipped): times in keys, so that a range of keys is a range of times.
pub(crate) fn ordered_i64(value: i64) -> [u8; 8] {
    ((value as u64) ^ (1 << 63)).to_be_bytes()
}

/// The i64 of [`ordered_i64`]'s bytes.
pub(crate) fn from_ordered_i64(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

pub(crate) use crate::records::Records;

#[cfg(test)]
mod record_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn signed_varints_round_trip(value: i64) {
            let mut out = Vec::new();
            put_signed(&mut out, value);
            let mut reader = Reader::new(&out, "test");
            prop_assert_eq!(reader.signed().expect("decodes"), value);
            prop_assert!(reader.finish().is_ok());
        }

        #[test]
        fn ordered_i64_orders_as_numbers(a: i64, b: i64) {
            prop_assert_eq!(ordered_i64(a).cmp(&ordered_i64(b)), a.cmp(&b));
            prop_assert_eq!(from_ordered_i64(ordered_i64(a)), a);
        }
    }

    #[test]
    fn small_weights_take_one_byte_and_long_forms_are_refused() {
        for (value, bytes) in [(0i64, vec![0u8]), (-1, vec![1]), (1, vec![2]), (63, vec![0x7e]), (-64, vec![0x7f])] {
            let mut out = Vec::new();
            put_signed(&mut out, value);
            assert_eq!(out, bytes, "{value}");
        }
        assert!(Reader::new(&[0x82, 0x00], "test").signed().is_err());
        assert!(Reader::new(&[0x82], "test").signed().is_err());
    }
}
