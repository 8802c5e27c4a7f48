//! A lane's position in checkpoints, versioned: during the snapshot (which a restart
//! reads again, see the module's note) or in the stream (the end LSN of the last whole
//! transaction returned, and how many changes of the next one were already returned when
//! it was cut in pieces).
//!
//! Layout: `[VERSION, 0]` for the snapshot; `[VERSION, 1, lsn: u64 BE, changes: u64 BE]`
//! in the stream; `[VERSION, 2, consistent point: u64 BE]` for a snapshot lane that
//! read its part of the snapshot taken at that slot's consistent point.

use sluice_types::SluiceError;

const VERSION: u8 = 1;

/// Where a lane is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Reading the snapshot.
    Snapshot,
    /// Streaming: every transaction ending at or before `lsn` was returned, and the
    /// first `changes` changes of the next one.
    Stream { lsn: u64, changes: u64 },
    /// A snapshot lane's part of the snapshot at `consistent_point` was returned.
    SnapshotDone { consistent_point: u64 },
}

impl Position {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Position::Snapshot => vec![VERSION, 0],
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
                     of version {VERSION}",
                    bytes.len()
                ),
            )
            .with_fix("restore a checkpoint written by this source, or start the pipeline without its checkpoints")
        };
        match bytes {
            [VERSION, 0] => Ok(Position::Snapshot),
            [VERSION, 1, rest @ ..] if rest.len() == 16 => Ok(Position::Stream {
                lsn: u64::from_be_bytes(rest[..8].try_into().expect("eight bytes")),
                changes: u64::from_be_bytes(rest[8..].try_into().expect("eight bytes")),
            }),
            [VERSION, 2, rest @ ..] if rest.len() == 8 => Ok(Position::SnapshotDone {
                consistent_point: u64::from_be_bytes(rest.try_into().expect("eight bytes")),
            }),
            _ => Err(bad()),
        }
    }

    /// The LSN the slot may confirm: that of the last whole transaction returned.
    pub fn lsn(&self) -> Option<u64> {
        match self {
            Position::Snapshot | Position::SnapshotDone { .. } => None,
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
            Position::Snapshot,
            Position::Stream { lsn: 0x16_B374_D848, changes: 3 },
            Position::SnapshotDone { consistent_point: 9 },
        ] {
            assert_eq!(Position::decode("s", &position.encode()).unwrap(), position);
        }
        assert_eq!(
            Position::Stream { lsn: 1, changes: 0 }.encode(),
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        for bad in [&[][..], &[2, 0], &[1, 1, 0], &[1, 2]] {
            assert!(Position::decode("s", bad).is_err());
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
