//! `[checkpoint]`: when present, the pipeline takes checkpoints.

use std::time::Duration;

use crate::model::{CheckpointSection, Compression, Guarantee};
use crate::reader::{Ctx, Section};

const KEYS: &[&str] = &["interval", "store", "guarantee", "retain", "max_failed_checkpoints", "timeout", "compression"];

/// Default checkpoint interval.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);
/// Default store, relative to the pipeline file's directory.
pub const DEFAULT_CHECKPOINT_STORE: &str = "file://./sluice-state";
/// Default number of committed checkpoints kept.
pub const DEFAULT_RETAIN: u32 = 3;
/// Default consecutive failed checkpoints before the pipeline fails.
pub const DEFAULT_MAX_FAILED_CHECKPOINTS: u32 = 3;
/// Default time a checkpoint's barrier may take to be acknowledged by every thread (as
/// Flink's `execution.checkpointing.timeout`).
pub const DEFAULT_CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// Reads `[checkpoint]`.
pub(crate) fn parse_checkpoint(ctx: &mut Ctx<'_>, sec: &Section<'_>) -> Option<CheckpointSection> {
    ctx.check_keys(sec, KEYS, &[]);
    let interval =
        ctx.duration(sec, "interval", false, "e.g. interval = \"10s\" (the default)").or(DEFAULT_CHECKPOINT_INTERVAL);
    let store = ctx.string(
        sec,
        "store",
        "an object-store URL",
        "e.g. store = \"file://./sluice-state\" (the default), \"s3://bucket/prefix\"",
        |s| s.starts_with("file://") || s.starts_with("s3://") || s.starts_with("gs://") || s.starts_with("az://"),
    );
    let store = store.map(|s| s.value).or_else(|| DEFAULT_CHECKPOINT_STORE.to_owned());
    let guarantee = ctx
        .choice(
            sec,
            "guarantee",
            &[("exactly-once", Guarantee::ExactlyOnce), ("at-least-once", Guarantee::AtLeastOnce)],
        )
        .or(Guarantee::ExactlyOnce);
    let retain = ctx
        .integer(sec, "retain", 1..=1000, "set retain to how many committed checkpoints to keep, e.g. retain = 3")
        .or(DEFAULT_RETAIN);
    let max_failed = ctx
        .integer(
            sec,
            "max_failed_checkpoints",
            1..=1000,
            "set max_failed_checkpoints to how many failures in a row stop the pipeline, e.g. 3",
        )
        .or(DEFAULT_MAX_FAILED_CHECKPOINTS);
    let timeout = ctx
        .duration(
            sec,
            "timeout",
            false,
            "set how long every thread may take to acknowledge a checkpoint, e.g. timeout = \"10m\" (the default)",
        )
        .or(DEFAULT_CHECKPOINT_TIMEOUT);
    let choices = [("lz4-merged", Compression::Lz4Merged), ("lz4", Compression::Lz4), ("none", Compression::None)];
    let compression = ctx.choice(sec, "compression", &choices).or(Compression::Lz4Merged);
    Some(CheckpointSection {
        interval: interval?,
        timeout: timeout?,
        store: store?,
        guarantee: guarantee?,
        retain: retain?,
        max_failed_checkpoints: max_failed?,
        compression: compression?,
    })
}
