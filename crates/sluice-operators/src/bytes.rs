//! Encoded keys and values as state holds them: compared without the system's `memcmp`
//! for empty ones, and stored inline when short.

/// Whether two byte strings (encoded keys) are equal. Strings of up to 16 bytes (every
/// encoded integer, date or timestamp key) are compared inline, in two overlapping words,
/// instead of through a call to the system's `memcmp` (9% of NEXMark q5, which groups
/// by an auction id per row and window). An empty one is never handed to `memcmp`
/// either: its vectorised version reads through the pointer with a masked load even for
/// zero bytes, and an empty slice's dangling pointer turns that load into a slow
/// processor assist (it took an eighth of NEXMark q7's time in the window aggregate
/// without keys).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    let word = |bytes: &[u8], at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let half = |bytes: &[u8], at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    match n {
        0 => true,
        1..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=8 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        9..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

/// Bytes held inline up to this length.
const INLINE: usize = 22;

/// A short byte string held inline (no allocation, no pointer to follow when compared),
/// a longer one boxed.
#[derive(Debug, Clone)]
pub(crate) enum SmallBytes {
    Inline { length: u8, bytes: [u8; INLINE] },
    Boxed(Box<[u8]>),
}

impl SmallBytes {
    pub(crate) fn new(value: &[u8]) -> SmallBytes {
        if value.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..value.len()].copy_from_slice(value);
            SmallBytes::Inline { length: value.len() as u8, bytes }
        } else {
            SmallBytes::Boxed(value.into())
        }
    }

    pub(crate) fn get(&self) -> &[u8] {
        match self {
            SmallBytes::Inline { length, bytes } => &bytes[..*length as usize],
            SmallBytes::Boxed(bytes) => bytes,
        }
    }
}

/// Bytes held inline up to this length by [`ShortBytes`].
const SHORT: usize = 14;

/// A byte string in 16 bytes: inline up to 14 bytes (every encoded integer, float, date
/// and timestamp), behind one pointer if longer. For values held by the million.
#[derive(Debug, Clone)]
pub(crate) enum ShortBytes {
    Inline { length: u8, bytes: [u8; SHORT] },
    Boxed(Box<Box<[u8]>>),
}

impl ShortBytes {
    pub(crate) fn new(value: &[u8]) -> ShortBytes {
        if value.len() <= SHORT {
            let mut bytes = [0u8; SHORT];
            bytes[..value.len()].copy_from_slice(value);
            ShortBytes::Inline { length: value.len() as u8, bytes }
        } else {
            ShortBytes::Boxed(Box::new(value.into()))
        }
    }

    pub(crate) fn get(&self) -> &[u8] {
        match self {
            ShortBytes::Inline { length, bytes } => &bytes[..*length as usize],
            ShortBytes::Boxed(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_compares_empty_and_other_strings() {
        assert!(same_bytes(&[], &[]));
        assert!(!same_bytes(&[], &[0]));
        assert!(same_bytes(&[1, 2], &[1, 2]) && !same_bytes(&[1, 2], &[1, 3]));
        // Every length up to past the inline cases, differing at every position.
        for length in 1..40usize {
            let a: Vec<u8> = (0..length as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "{length}");
            for at in 0..length {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!same_bytes(&a, &b), "{length} bytes, differing at {at}");
            }
            assert!(!same_bytes(&a, &a[..length - 1]));
        }
    }

    #[test]
    fn short_bytes_are_inline_and_long_ones_boxed() {
        for length in [0, 1, SHORT, SHORT + 1, INLINE, INLINE + 1, 100] {
            let value: Vec<u8> = (0..length as u8).collect();
            let small = SmallBytes::new(&value);
            assert_eq!(small.get(), value.as_slice());
            assert_eq!(matches!(small, SmallBytes::Inline { .. }), length <= INLINE);
            let short = ShortBytes::new(&value);
            assert_eq!(short.get(), value.as_slice());
            assert_eq!(matches!(short, ShortBytes::Inline { .. }), length <= SHORT);
        }
        assert_eq!(std::mem::size_of::<ShortBytes>(), 16);
    }
}
