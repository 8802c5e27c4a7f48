//! Who this process is, and whether another process of this host still runs: the facts the
//! lease records and judges by.
//!
//! Everything comes from Linux's `/proc` where it exists (no `unsafe`, no libc): the host
//! name (`/proc/sys/kernel/hostname`), the boot id (`/proc/sys/kernel/random/boot_id`), the
//! pid namespace (the target of the `/proc/self/ns/pid` link) and a process's start time
//! (field 22 of `/proc/{pid}/stat`, in clock ticks after boot, fixed for the process's
//! life). Elsewhere these are unknown (empty, `None`) and [`probe`] answers
//! [`Probe::Unknown`], so a lease is never judged stale there.

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// What `/proc` says about a pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// No such process, or one that has exited and waits to be reaped (a zombie).
    Gone,
    /// A process with this pid runs; its start time when readable.
    Running { start_ticks: Option<u64> },
    /// This system cannot tell.
    Unknown,
}

/// The host name, or `""` when unknown.
pub(crate) fn host_name() -> String {
    let from_proc = read_trimmed("/proc/sys/kernel/hostname");
    let from_env = || ["HOSTNAME", "COMPUTERNAME"].iter().find_map(|name| std::env::var(name).ok());
    from_proc.or_else(from_env).map(|name| name.trim().to_string()).unwrap_or_default()
}

/// The id of the running kernel's boot, or `""` when unknown.
pub(crate) fn boot_id() -> String {
    read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default()
}

/// The pid namespace of this process (`pid:[4026531836]`), or `""` when unknown.
pub(crate) fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid").map(|target| target.to_string_lossy().into_owned()).unwrap_or_default()
}

/// This process's start time in clock ticks after boot, when known.
pub(crate) fn own_start_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat).and_then(|(_, start_ticks)| start_ticks)
}

/// Whether `pid` runs on this host, and since when.
pub(crate) fn probe(pid: u32) -> Probe {
    if std::fs::metadata("/proc/self/stat").is_err() {
        return Probe::Unknown;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match parse_stat(&stat) {
            Some(('Z' | 'X', _)) => Probe::Gone,
            Some((_, start_ticks)) => Probe::Running { start_ticks },
            None => Probe::Running { start_ticks: None },
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Probe::Gone,
        Err(_) => Probe::Unknown,
    }
}

/// The state (field 3) and start time (field 22) of a `/proc/{pid}/stat` line. The command
/// name (field 2) is in parentheses and may itself contain spaces and parentheses, so the
/// fields are counted after the last `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<(char, Option<u64>)> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 21 come before the start time.
    let start_ticks = fields.nth(18).and_then(|field| field.parse().ok());
    Some((state, start_ticks))
}

/// 32 hex digits, unique to one acquisition: the keys of std's `RandomState` (seeded from the
/// operating system's randomness once per thread) hashed with the time and the pid. Not a
/// secret: fencing needs only that two acquisitions never share an id.
pub(crate) fn random_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    let word = |index: u8| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.write_u8(index);
        hasher.finish()
    };
    format!("{:016x}{:016x}", word(0), word(1))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
}

fn read_trimmed(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let trimmed = text.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_and_start_time() {
        let fields_4_to_21 = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18";
        let cases = [
            (format!("42 (sluice) S {fields_4_to_21} 987654 rest"), Some(('S', Some(987654)))),
            (format!("42 (a) b (c) R {fields_4_to_21} 7 rest"), Some(('R', Some(7)))),
            (format!("42 (zombie) Z {fields_4_to_21} 5"), Some(('Z', Some(5)))),
            ("42 (short) S 1 2".to_string(), Some(('S', None))),
            ("no parenthesis".to_string(), None),
        ];
        for (stat, expected) in cases {
            assert_eq!(parse_stat(&stat), expected, "{stat}");
        }
    }

    #[test]
    fn run_ids_are_32_hex_digits_and_differ() {
        let (first, second) = (random_run_id(), random_run_id());
        assert_eq!(first.len(), 32);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()), "{first}");
        assert_ne!(first, second);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_running_with_its_own_start_time() {
        let start_ticks = own_start_ticks();
        assert!(start_ticks.is_some());
        assert_eq!(probe(std::process::id()), Probe::Running { start_ticks });
        // Above every Linux pid_max (at most 2^22), so never a process.
        assert_eq!(probe(u32::MAX), Probe::Gone);
        assert!(!boot_id().is_empty() && pid_namespace().starts_with("pid:"));
    }
}
