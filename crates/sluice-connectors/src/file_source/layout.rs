//! The layout of a file source, recorded in every checkpoint: its files, each file's
//! identity, and the byte range of every lane.
//!
//! A resumed run lays its lanes out as the checkpoint recorded, whatever the thread
//! count, and first checks that every file is the one the positions refer to:
//!
//! - **unchanged** (same size, same first and last bytes): the recorded ranges as they
//!   are;
//! - **grown by appending** (larger; its first bytes and the bytes that ended it are
//!   where they were, and it ended with a line break): the last range of the file
//!   stretches to the new end, so the lane that read its end goes on with the appended
//!   rows, and no row at a lane boundary is read twice;
//! - **anything else** (shorter, rewritten, a file that appeared or disappeared in a
//!   directory, a grown file whose last line was incomplete): refused, naming the file,
//!   what changed and the fix, because the checkpoint's positions would point at other
//!   rows.
//!
//! A file's identity is its size, its modification time (shown in messages only: an
//! append changes it) and the XXH3-64 hash ([`sluice_types::key::hash`]) of its first and
//! of its last [`EDGE_BYTES`] bytes (of the whole file when it is shorter).
//!
//! # Encoding, layout version 1 ([`LAYOUT_VERSION`])
//!
//! All integers little-endian: `u32 version`, `u32 files`, per file `u32 length` + the
//! path's UTF-8 bytes (as resolved by the first run), `u64 size`, `i64 modified`
//! (nanoseconds since the Unix epoch, 0 when unknown), `u64 head hash`, `u64 tail hash`;
//! then `u32 ranges`, per range `u32 file`, `u64 start`, `u64 end`. Decoding checks
//! every length against the bytes left and every range against the files.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sluice_types::SluiceError;

use super::{LaneRange, read_error};

/// The layout encoding this build writes and reads.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes hashed at each end of a file to tell it is the same file.
pub const EDGE_BYTES: u64 = 4096;

/// What tells a file is the one a checkpoint read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub path: PathBuf,
    pub size: u64,
    pub modified_ns: i64,
    /// Hash of the first `min(EDGE_BYTES, size)` bytes.
    pub head: u64,
    /// Hash of the last `min(EDGE_BYTES, size)` bytes.
    pub tail: u64,
}

/// A source's files and lanes, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub files: Vec<Identity>,
    pub ranges: Vec<LaneRange>,
}

/// The hash of `length` bytes of `file` from `offset`.
fn hash_at(file: &mut File, offset: u64, length: u64) -> std::io::Result<u64> {
    let mut bytes = vec![0u8; length as usize];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut bytes)?;
    Ok(sluice_types::key::hash(&bytes))
}

/// The identity of `path`, taken as its first `size` bytes (the whole file, or the part
/// a checkpoint recorded).
fn identity_at(path: &Path, size: u64) -> std::io::Result<Identity> {
    let mut file = File::open(path)?;
    let modified_ns = file
        .metadata()?
        .modified()
        .ok()
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |since| i64::try_from(since.as_nanos()).unwrap_or(i64::MAX));
    let edge = size.min(EDGE_BYTES);
    let head = hash_at(&mut file, 0, edge)?;
    let tail = hash_at(&mut file, size - edge, edge)?;
    Ok(Identity { path: path.to_path_buf(), size, modified_ns, head, tail })
}

/// The identities of `files` of `sizes` (streaming files, with no size, have none).
pub(crate) fn identify(files: &[PathBuf], sizes: &[Option<u64>]) -> Result<Vec<Identity>, SluiceError> {
    files
        .iter()
        .zip(sizes)
        .map(|(path, size)| match size {
            Some(size) => identity_at(path, *size).map_err(|error| read_error(path, &error)),
            None => Ok(Identity { path: path.clone(), size: u64::MAX, modified_ns: 0, head: 0, tail: 0 }),
        })
        .collect()
}

fn changed(source: &str, path: &Path, what: &str) -> SluiceError {
    SluiceError::user(
        "source.input_changed",
        format!(
            "source `{source}`: {} {what} since the checkpoint, whose positions point into the file as it was",
            path.display()
        ),
    )
    .with_fix("restore the input as it was (appending rows to a file is fine), or start over with --from-scratch")
}

/// The ranges a resumed run reads: the recorded ones, checked against the files now
/// (`files`, with `sizes`); a file grown by appending stretches its last range.
pub(crate) fn resume(
    source: &str,
    recorded: &Layout,
    files: &[PathBuf],
    sizes: &[Option<u64>],
) -> Result<Vec<LaneRange>, SluiceError> {
    for path in files {
        if !recorded.files.iter().any(|identity| &identity.path == path) {
            return Err(changed(source, path, "appeared in the source's directory"));
        }
    }
    let mut ranges = recorded.ranges.clone();
    for (index, identity) in recorded.files.iter().enumerate() {
        let Some(now) = files.iter().position(|path| path == &identity.path) else {
            return Err(changed(source, &identity.path, "was removed"));
        };
        let Some(size) = sizes[now] else {
            return Err(changed(source, &identity.path, "is no longer a regular file"));
        };
        let grown = check_file(source, identity, size)?;
        for range in ranges.iter_mut().filter(|range| range.file == index) {
            range.file = now;
            if grown && range.end == identity.size {
                range.end = size;
            }
        }
    }
    Ok(ranges)
}

/// Whether the file is the recorded one (false) or the recorded one with rows appended
/// (true); an error names anything else.
fn check_file(source: &str, identity: &Identity, size: u64) -> Result<bool, SluiceError> {
    let path = &identity.path;
    if size < identity.size {
        let what = format!("shrank from {} to {size} bytes", identity.size);
        return Err(changed(source, path, &what));
    }
    let then = identity_at(path, identity.size).map_err(|error| read_error(path, &error))?;
    if then.head != identity.head || then.tail != identity.tail {
        let what = if size == identity.size {
            "was rewritten (its size is the same, its bytes are not)".to_string()
        } else {
            format!("was rewritten, not appended to (its first {} bytes differ)", identity.size)
        };
        return Err(changed(source, path, &what));
    }
    if size == identity.size {
        return Ok(false);
    }
    if identity.size > 0 && !ends_with_line_break(path, identity.size)? {
        let what = "grew, and its last line was incomplete when the checkpoint read it";
        return Err(changed(source, path, what));
    }
    Ok(true)
}

fn ends_with_line_break(path: &Path, size: u64) -> Result<bool, SluiceError> {
    let read = || -> std::io::Result<bool> {
        let mut file = File::open(path)?;
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(size - 1))?;
        file.read_exact(&mut last)?;
        Ok(last[0] == b'\n')
    };
    read().map_err(|error| read_error(path, &error))
}

impl Layout {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for file in &self.files {
            let path = file.path.to_string_lossy();
            bytes.extend_from_slice(&(path.len() as u32).to_le_bytes());
            bytes.extend_from_slice(path.as_bytes());
            bytes.extend_from_slice(&file.size.to_le_bytes());
            bytes.extend_from_slice(&file.modified_ns.to_le_bytes());
            bytes.extend_from_slice(&file.head.to_le_bytes());
            bytes.extend_from_slice(&file.tail.to_le_bytes());
        }
        bytes.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for range in &self.ranges {
            bytes.extend_from_slice(&(range.file as u32).to_le_bytes());
            bytes.extend_from_slice(&range.start.to_le_bytes());
            bytes.extend_from_slice(&range.end.to_le_bytes());
        }
        bytes
    }

    /// Decodes a recorded layout; fails on bytes of another version or damaged ones.
    pub(crate) fn decode(source: &str, bytes: &[u8]) -> Result<Layout, SluiceError> {
        let mut reader = Reader { bytes, source };
        let version = reader.u32()?;
        if version != LAYOUT_VERSION {
            return Err(SluiceError::user(
                "source.layout_version",
                format!("source `{source}`: its checkpointed layout has version {version}, this build reads {LAYOUT_VERSION}"),
            )
            .with_fix("run the Sluice build that wrote the checkpoint, or start over with --from-scratch"));
        }
        let mut files = Vec::new();
        for _ in 0..reader.u32()? {
            let length = reader.u32()? as usize;
            let path = std::str::from_utf8(reader.take(length)?).map_err(|_| reader.damaged("a path is not UTF-8"))?;
            let path = PathBuf::from(path);
            let (size, modified_ns, head, tail) = (reader.u64()?, reader.u64()? as i64, reader.u64()?, reader.u64()?);
            files.push(Identity { path, size, modified_ns, head, tail });
        }
        let mut ranges = Vec::new();
        for _ in 0..reader.u32()? {
            let file = reader.u32()? as usize;
            let (start, end) = (reader.u64()?, reader.u64()?);
            if file >= files.len() || start > end {
                return Err(reader.damaged("a range outside its files"));
            }
            ranges.push(LaneRange { file, start, end });
        }
        if !reader.bytes.is_empty() {
            return Err(reader.damaged("bytes after the ranges"));
        }
        Ok(Layout { files, ranges })
    }
}

/// A bounds-checked reader over a recorded layout.
struct Reader<'a> {
    bytes: &'a [u8],
    source: &'a str,
}

impl<'a> Reader<'a> {
    fn damaged(&self, what: &str) -> SluiceError {
        SluiceError::internal(
            "source.layout",
            format!("source `{}`: its checkpointed layout is damaged: {what}", self.source),
        )
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], SluiceError> {
        if self.bytes.len() < count {
            return Err(self.damaged("truncated"));
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, SluiceError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, SluiceError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout is persisted in manifests: its encoding is pinned.
    #[test]
    fn the_encoding_is_pinned_and_round_trips() {
        let layout = Layout {
            files: vec![Identity { path: PathBuf::from("/d/a"), size: 10, modified_ns: -1, head: 2, tail: 3 }],
            ranges: vec![LaneRange { file: 0, start: 0, end: 4 }, LaneRange { file: 0, start: 4, end: 10 }],
        };
        let bytes = layout.encode();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let expected = concat!(
            "01000000",
            "01000000", // version 1, one file
            "04000000",
            "2f642f61", // "/d/a"
            "0a00000000000000",
            "ffffffffffffffff", // size 10, modified -1
            "0200000000000000",
            "0300000000000000", // head, tail hashes
            "02000000",         // two ranges
            "00000000",
            "0000000000000000",
            "0400000000000000",
            "00000000",
            "0400000000000000",
            "0a00000000000000",
        );
        assert_eq!(hex, expected);
        assert_eq!(Layout::decode("s", &bytes).expect("decodes"), layout);
        let mut other_version = bytes.clone();
        other_version[0] = 2;
        assert_eq!(Layout::decode("s", &other_version).expect_err("version").code, "source.layout_version");
    }
}
