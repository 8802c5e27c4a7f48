//! A lane's position in checkpoints, versioned: during the snapshot (with the slot's
//! consistent point, from which a restart streams the changes on top of a new snapshot,
//! see the module's note) or in the stream (the end LSN of the last whole transaction
//! returned, and how many changes of the next one were already returned when it was cut
//! in pieces).
//!
//! Layout of version 2: `[2, 0, consistent point: u64 BE]` for lane 0 in the snapshot,
//! `[2, 0]` for a snapshot lane that has not read its part (it names no point: its
//! position is never read back); `[2, 1, lsn: u64 BE, changes: u64 BE]` in the stream;
//! `[2, 2, consistent point: u64 BE]` for a snapshot lane that read its part of the
//! snapshot of that point. Version 1 (read, never written) is version 2 without the
//! snapshot's consistent point: `[1, 0]`, `[1, 1, …]`, `[1, 2, …]`.

use sluice_types::SluiceError;

/// The version written.
const VERSION: u8 = 2;
/// The version before: its snapshot position names no consistent point.
const VERSION_1: u8 = 1;

/// Where a lane is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Reading the snapshot taken when the slot's confirmed position was
    /// `consistent_point` (None: not recorded, a snapshot lane's or a version 1 position).
    Snapshot { consistent_point: Option<u64> },
    /// Streaming: every transaction ending at or before `lsn` was returned, and the
    /// first `changes` changes of the next one.
    Stream { lsn: u64, changes: u64 },
    /// A snapshot lane's part of the snapshot at `consistent_point` was returned.
    SnapshotDone { consistent_point: u64 },
}

impl Position {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Position::Snapshot { consistent_point } => {
                let mut bytes = vec![VERSION, 0];
                if let Some(point) = consistent_point {
                    bytes.extend_from_slice(&point.to_be_bytes());
                }
                bytes
            }
            Position::Stream { lsn, changes } => {
                let mut bytes = vec![VERSION, 1];
                bytes.extend_from_slice(&lsn.to_be_bytes());
                bytes.extend_from_slice(&changes.to_be_bytes());
                bytes
            }
            Position::SnapshotDone { consistent_point } => {
                let mut bytes = vec![VERSION, 2];
                bytes.extend_from_slice(&consistent_point.to_be_bytes());
                bytes
            }
        }
    }

    pub fn decode(source: &str, bytes: &[u8]) -> Result<Position, SluiceError> {
        let bad = || {
            SluiceError::user(
                "source.postgres_cdc.position",
                format!(
                    "source `{source}`: the checkpoint's position ({} bytes) is not a postgres-cdc position \
                     of version {VERSION_1} or {VERSION}",
                    bytes.len()
                ),
            )
            .with_fix("restore a checkpoint written by this source, or start the pipeline without its checkpoints")
        };
        let eight = |bytes: &[u8]| u64::from_be_bytes(bytes.try_into().expect("eight bytes"));
        match bytes {
            [VERSION_1 | VERSION, 0] => Ok(Position::Snapshot { consistent_point: None }),
            [VERSION, 0, rest @ ..] if rest.len() == 8 => {
                Ok(Position::Snapshot { consistent_point: Some(eight(rest)) })
            }
            [VERSION_1 | VERSION, 1, rest @ ..] if rest.len() == 16 => {
                Ok(Position::Stream { lsn: eight(&rest[..8]), changes: eight(&rest[8..]) })
            }
            [VERSION_1 | VERSION, 2, rest @ ..] if rest.len() == 8 => {
                Ok(Position::SnapshotDone { consistent_point: eight(rest) })
            }
            _ => Err(bad()),
        }
    }

    /// The LSN the slot may confirm: that of the last whole transaction returned.
    pub fn lsn(&self) -> Option<u64> {
        match self {
            Position::Snapshot { .. } | Position::SnapshotDone { .. } => None,
            Position::Stream { lsn, .. } => Some(*lsn),
        }
    }
}

/// An LSN as PostgreSQL writes it: `16/B374D848`.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// An LSN written as PostgreSQL writes it.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    let high = u32::from_str_radix(high, 16).ok()?;
    let low = u32::from_str_radix(low, 16).ok()?;
    Some(u64::from(high) << 32 | u64::from(low))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_bad_bytes_are_refused() {
        for position in [
            Position::Snapshot { consistent_point: None },
            Position::Snapshot { consistent_point: Some(0x16_B374_D848) },
            Position::Stream { lsn: 0x16_B374_D848, changes: 3 },
            Position::SnapshotDone { consistent_point: 9 },
        ] {
            assert_eq!(Position::decode("s", &position.encode()).unwrap(), position);
        }
        for bad in [&[][..], &[3, 0], &[2, 1, 0], &[2, 2], &[2, 0, 1], &[1, 0, 0, 0, 0, 0, 0, 0, 0, 1], &[2, 3]] {
            assert!(Position::decode("s", bad).is_err(), "{bad:?}");
        }
    }

    /// The bytes each version's positions are, pinned: checkpoints of either version
    /// restore.
    #[test]
    fn golden_vectors_of_both_versions() {
        let written = [
            (
                Position::Snapshot { consistent_point: Some(0x16_B374_D848) },
                &[2, 0, 0, 0, 0, 0x16, 0xB3, 0x74, 0xD8, 0x48][..],
            ),
            (Position::Snapshot { consistent_point: None }, &[2, 0]),
            (Position::Stream { lsn: 1, changes: 2 }, &[2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]),
            (Position::SnapshotDone { consistent_point: 9 }, &[2, 2, 0, 0, 0, 0, 0, 0, 0, 9]),
        ];
        for (position, bytes) in written {
            assert_eq!(position.encode(), bytes, "{position:?}");
            assert_eq!(Position::decode("s", bytes).unwrap(), position);
        }
        let version_1 = [
            (&[1, 0][..], Position::Snapshot { consistent_point: None }),
            (&[1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0], Position::Stream { lsn: 1, changes: 0 }),
            (&[1, 2, 0, 0, 0, 0, 0, 0, 0, 9], Position::SnapshotDone { consistent_point: 9 }),
        ];
        for (bytes, position) in version_1 {
            assert_eq!(Position::decode("s", bytes).unwrap(), position, "{bytes:?}");
        }
    }

    #[test]
    fn lsns_as_postgresql_writes_them() {
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("x"), None);
    }
}
