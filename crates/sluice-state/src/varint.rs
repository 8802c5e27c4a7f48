//! Unsigned LEB128 varints, as the manifest's postcard body writes them: 7 bits a byte,
//! least significant group first, the high bit set on every byte but the last. A
//! decoder accepts only the shortest form, so every value has one encoding.

/// Appends `value` to `out`.
pub(crate) fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a varint at `*at`, advancing it; `None` when the bytes end first, the value
/// overflows a u64, or the form is not the shortest.
pub(crate) fn get(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        let group = u64::from(byte & 0x7f);
        if shift == 63 && group > 1 {
            return None;
        }
        value |= group << shift;
        if byte & 0x80 == 0 {
            // A last byte of 0 after others is a longer form of a shorter value.
            return (byte != 0 || shift == 0).then_some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_manifests_examples() {
        for (value, bytes) in [(0, vec![0x00]), (127, vec![0x7f]), (128, vec![0x80, 0x01]), (300, vec![0xac, 0x02])] {
            let mut out = Vec::new();
            put(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(get(&bytes, &mut 0), Some(value));
        }
        assert_eq!(get(&[0x80, 0x00], &mut 0), None, "not the shortest form");
        assert_eq!(get(&[0x80], &mut 0), None, "truncated");
        let mut max = Vec::new();
        put(&mut max, u64::MAX);
        assert_eq!(max.len(), 10);
        assert_eq!(get(&max, &mut 0), Some(u64::MAX));
        max[9] = 0x02;
        assert_eq!(get(&max, &mut 0), None, "overflows");
    }

    proptest! {
        #[test]
        fn every_value_round_trips(value: u64) {
            let mut out = Vec::new();
            put(&mut out, value);
            let mut at = 0;
            prop_assert_eq!(get(&out, &mut at), Some(value));
            prop_assert_eq!(at, out.len());
        }

        #[test]
        fn any_bytes_decode_to_one_encoding_or_none(bytes: Vec<u8>) {
            let mut at = 0;
            if let Some(value) = get(&bytes, &mut at) {
                let mut out = Vec::new();
                put(&mut out, value);
                prop_assert_eq!(&out[..], &bytes[..at]);
            }
        }
    }
}
