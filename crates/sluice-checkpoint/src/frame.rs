//! The frame around every object this crate encodes (manifests, the lease), and the rule
//! that a body has exactly one encoding.
//!
//! ```text
//! magic (8 bytes) | format version (u32, little-endian) | body | CRC-32 of the body (u32, little-endian)
//! ```
//!
//! The body is postcard (see the `manifest` module doc for the wire rules). A body is
//! accepted only in its canonical form, the one [`encode_body`] writes: postcard itself
//! also accepts varints longer than needed and map entries out of order or repeated, so
//! [`decode_body`] re-encodes what it decoded and refuses a body that differs. Hence
//! encoding and decoding are inverse bijections between values and accepted bytes, which
//! is what the golden vectors in the tests pin down.

use serde::Serialize;
use serde::de::DeserializeOwned;

const VERSION_BYTES: usize = 4;
const CHECKSUM_BYTES: usize = 4;
/// Magic and version.
pub(crate) const HEADER_BYTES: usize = 8 + VERSION_BYTES;
/// The size of a frame around an empty body.
pub(crate) const FRAME_BYTES: usize = HEADER_BYTES + CHECKSUM_BYTES;

/// Why bytes are not a frame of the expected kind and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The bytes do not start with the magic (`found`: their first bytes, escaped).
    Magic { found: String },
    /// Fewer bytes than an empty frame.
    Truncated { len: usize },
    /// Another format version.
    Version { found: u32 },
    /// The checksum does not match the body.
    Checksum { len: usize, stored: u32, computed: u32 },
}

/// Frames `body`.
pub(crate) fn seal(magic: [u8; 8], version: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(FRAME_BYTES + body.len());
    bytes.extend_from_slice(&magic);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bytes
}

/// Checks magic, length, version and checksum (in that order); returns the body.
pub(crate) fn open(bytes: &[u8], magic: [u8; 8], version: u32) -> Result<&[u8], Problem> {
    open_versions(bytes, magic, &[version]).map(|(_, body)| body)
}

/// [`open`] for a frame of any of `versions`; returns the version and the body.
pub(crate) fn open_versions<'a>(bytes: &'a [u8], magic: [u8; 8], versions: &[u32]) -> Result<(u32, &'a [u8]), Problem> {
    let magic_len = magic.len().min(bytes.len());
    if bytes[..magic_len] != magic[..magic_len] {
        return Err(Problem::Magic { found: bytes[..magic_len].escape_ascii().to_string() });
    }
    if bytes.len() < FRAME_BYTES {
        return Err(Problem::Truncated { len: bytes.len() });
    }
    let (header, rest) = bytes.split_at(HEADER_BYTES);
    let found = u32::from_le_bytes(word(&header[magic.len()..]));
    if !versions.contains(&found) {
        return Err(Problem::Version { found });
    }
    let (body, trailer) = rest.split_at(rest.len() - CHECKSUM_BYTES);
    let stored = u32::from_le_bytes(word(trailer));
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(Problem::Checksum { len: bytes.len(), stored, computed });
    }
    Ok((found, body))
}

/// The canonical postcard encoding of `value`.
pub(crate) fn encode_body<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain structs into a vector fails only on allocation failure, which aborts.
    postcard::to_allocvec(value).expect("postcard serializes plain structs into a Vec")
}

/// Decodes a body that must be consumed exactly and be canonical; the error describes why
/// not. Never panics; allocates no more than the input justifies (postcard checks every
/// length against the remaining input, and serde caps pre-allocation).
pub(crate) fn decode_body<T: Serialize + DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((value, [])) if encode_body(&value) == body => Ok(value),
        Ok((_, [])) => Err("it is not in its canonical encoding (a varint longer than needed, or map \
                            entries out of order or repeated)"
            .to_string()),
        Ok((_, rest)) => Err(format!("{} bytes follow the value", rest.len())),
        Err(error) => Err(error.to_string()),
    }
}

fn word(bytes: &[u8]) -> [u8; 4] {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    word
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The bytes of hex fields (one field per element for readable golden vectors; spaces
    /// are ignored).
    pub(crate) fn unhex(fields: &[&str]) -> Vec<u8> {
        let digits: Vec<u8> = fields.concat().bytes().filter(|c| !c.is_ascii_whitespace()).collect();
        assert!(digits.len().is_multiple_of(2), "odd number of hex digits in {fields:?}");
        let value = |digit: u8| char::from(digit).to_digit(16).expect("a hex digit") as u8;
        digits.chunks(2).map(|pair| value(pair[0]) << 4 | value(pair[1])).collect()
    }

    const MAGIC: [u8; 8] = *b"TESTMAGC";

    #[test]
    fn frames_open_to_their_body_and_name_what_is_wrong() {
        let sealed = seal(MAGIC, 3, b"body");
        assert_eq!(sealed.len(), FRAME_BYTES + 4);
        assert_eq!(open(&sealed, MAGIC, 3), Ok(&b"body"[..]));
        let mut flipped = sealed.clone();
        flipped[13] ^= 0x01;
        let cases: [(&[u8], Problem); 5] = [
            (b"", Problem::Truncated { len: 0 }),
            (b"TEST", Problem::Truncated { len: 4 }),
            (b"NOPE\n", Problem::Magic { found: "NOPE\\n".to_string() }),
            (&seal(MAGIC, 4, b"body"), Problem::Version { found: 4 }),
            (
                &flipped,
                Problem::Checksum { len: 20, stored: crc32fast::hash(b"body"), computed: crc32fast::hash(b"bndy") },
            ),
        ];
        for (bytes, problem) in cases {
            assert_eq!(open(bytes, MAGIC, 3), Err(problem), "{bytes:?}");
        }
    }

    #[test]
    fn only_canonical_bodies_decode() {
        use std::collections::BTreeMap;
        let map: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 300)].into();
        let canonical = encode_body(&map);
        assert_eq!(canonical, [2, 1, b'a', 1, 1, b'b', 0xac, 0x02]);
        assert_eq!(decode_body::<BTreeMap<String, u32>>(&canonical), Ok(map));
        let not_canonical: [&[u8]; 4] = [
            &[2, 1, b'b', 0xac, 0x02, 1, b'a', 1],
            &[2, 1, b'a', 1, 1, b'a', 2],
            &[2, 1, b'a', 0x81, 0x00, 1, b'b', 0xac, 0x02],
            &[0x82, 0x00, 1, b'a', 1, 1, b'b', 0xac, 0x02],
        ];
        for body in not_canonical {
            let outcome = decode_body::<BTreeMap<String, u32>>(body);
            assert!(outcome.as_ref().is_err_and(|e| e.contains("canonical")), "{body:?}: {outcome:?}");
        }
        let trailing = decode_body::<BTreeMap<String, u32>>(&[0, 0]);
        assert_eq!(trailing, Err("1 bytes follow the value".to_string()));
    }
}
