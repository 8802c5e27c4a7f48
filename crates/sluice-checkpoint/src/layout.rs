//! Where things live inside a store: the names of manifests and state objects.
//!
//! ```text
//! <store>/manifests/epoch-00000000000000000042.manifest   committed manifest of epoch 42
//! <store>/manifests/epoch-00000000000000000043.tmp        a publish in progress (or abandoned)
//! <store>/state/epoch-42/<name>                            immutable state object written at epoch 42
//! <store>/lease                                             the lease of the run that writes the store
//! ```
//!
//! Manifest names are zero-padded to 20 digits so that the lexical order of a listing is the
//! epoch order; object directories are not padded (they are never sorted by name). Every name
//! has one canonical spelling, so a path maps to exactly one epoch and back: a file whose
//! name is not canonical is not ours and is never touched by garbage collection.

use sluice_types::SluiceError;

/// The directory of manifests, relative to the store root.
pub(crate) const MANIFEST_DIR: &str = "manifests";
/// The directory of state objects, relative to the store root.
pub(crate) const STATE_DIR: &str = "state";
/// The lease object, relative to the store root: outside both directories, so that neither
/// garbage collection nor `clear` touches it.
pub(crate) const LEASE_PATH: &str = "lease";
/// The longest object name a caller may pass to `put_object`.
pub(crate) const OBJECT_NAME_BYTES_MAX: usize = 512;

const MANIFEST_SUFFIX: &str = ".manifest";
const TMP_SUFFIX: &str = ".tmp";

/// The path of the committed manifest of `epoch`.
pub(crate) fn manifest_path(epoch: u64) -> String {
    format!("{MANIFEST_DIR}/epoch-{epoch:020}{MANIFEST_SUFFIX}")
}

/// The path a manifest is staged under before it is published.
pub(crate) fn manifest_tmp_path(epoch: u64) -> String {
    format!("{MANIFEST_DIR}/epoch-{epoch:020}{TMP_SUFFIX}")
}

/// What a file in the manifest directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManifestFile {
    /// A published manifest.
    Committed(u64),
    /// A staged manifest left by a publish that did not finish.
    Leftover(u64),
}

/// Classifies a path relative to the store root; `None` for anything that is not ours.
pub(crate) fn classify_manifest_file(path: &str) -> Option<ManifestFile> {
    let name = path.strip_prefix(MANIFEST_DIR)?.strip_prefix('/')?;
    let stem = name.strip_prefix("epoch-")?;
    if let Some(digits) = stem.strip_suffix(MANIFEST_SUFFIX) {
        let epoch = parse_padded_epoch(digits)?;
        return Some(ManifestFile::Committed(epoch));
    }
    let digits = stem.strip_suffix(TMP_SUFFIX)?;
    parse_padded_epoch(digits).map(ManifestFile::Leftover)
}

fn parse_padded_epoch(digits: &str) -> Option<u64> {
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The directory prefix (with trailing slash) of the objects written at `epoch`.
pub(crate) fn epoch_dir(epoch: u64) -> String {
    format!("{STATE_DIR}/epoch-{epoch}/")
}

/// The path of object `name` written at `epoch`, or why `name` is not acceptable.
pub(crate) fn object_path(epoch: u64, name: &str) -> Result<String, SluiceError> {
    match check_object_name(name) {
        Ok(()) => Ok(format!("{}{name}", epoch_dir(epoch))),
        Err(problem) => Err(SluiceError::internal(
            "checkpoint.object_name",
            format!("state object name {name:?} is not acceptable: {problem}"),
        )
        .with_fix("name state objects with ASCII letters, digits, '-', '_', '.', '=' and '/' between parts")),
    }
}

/// Checks a relative object name: non-empty `/`-separated parts of `[A-Za-z0-9._=-]`, none
/// of them `.` or `..`. These names are the same on every backend (no escaping).
pub(crate) fn check_object_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_string());
    }
    if name.len() > OBJECT_NAME_BYTES_MAX {
        return Err(format!("it is {} bytes long, the limit is {OBJECT_NAME_BYTES_MAX}", name.len()));
    }
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("it has the part {part:?}"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=');
        if let Some(bad) = part.chars().find(|c| !allowed(*c)) {
            return Err(format!("it contains the character {bad:?}"));
        }
    }
    Ok(())
}

/// The epoch of an object path `state/epoch-{e}/{name}` with a valid name; `None` otherwise.
pub(crate) fn epoch_of_object(path: &str) -> Option<u64> {
    let rest = path.strip_prefix(STATE_DIR)?.strip_prefix("/epoch-")?;
    let (digits, name) = rest.split_once('/')?;
    let epoch: u64 = digits.parse().ok()?;
    let canonical = epoch.to_string() == digits;
    (canonical && check_object_name(name).is_ok()).then_some(epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_sort_by_epoch_and_classify_back() {
        assert!(manifest_path(9) < manifest_path(10));
        for epoch in [0, 7, 10, u64::MAX] {
            assert_eq!(classify_manifest_file(&manifest_path(epoch)), Some(ManifestFile::Committed(epoch)));
            assert_eq!(classify_manifest_file(&manifest_tmp_path(epoch)), Some(ManifestFile::Leftover(epoch)));
        }
    }

    #[test]
    fn foreign_manifest_files_are_not_ours() {
        let cases = [
            "manifests/epoch-7.manifest",
            "manifests/epoch-0000000000000000000x.manifest",
            "manifests/epoch-00000000000000000007.manifest.bak",
            "manifests/README",
            "state/epoch-00000000000000000007.manifest",
            "manifests/sub/epoch-00000000000000000007.manifest",
        ];
        for path in cases {
            assert_eq!(classify_manifest_file(path), None, "{path}");
        }
    }

    #[test]
    fn object_paths_map_to_their_epoch() {
        let cases: [(&str, Option<u64>); 8] = [
            ("state/epoch-3/agg/vnode-1", Some(3)),
            ("state/epoch-0/x", Some(0)),
            ("state/epoch-03/x", None),
            ("state/epoch-3/", None),
            ("state/epoch-3", None),
            ("state/epoch-+3/x", None),
            ("state/epoch-3/../x", None),
            ("other/epoch-3/x", None),
        ];
        for (path, expected) in cases {
            assert_eq!(epoch_of_object(path), expected, "{path}");
        }
    }

    #[test]
    fn object_names_are_checked() {
        let cases: [(&str, bool); 9] = [
            ("agg/vnode-0001", true),
            ("a.b=c_d-e", true),
            ("", false),
            ("/abs", false),
            ("a//b", false),
            ("a/../b", false),
            ("a/./b", false),
            ("with space", false),
            ("x#1", false),
        ];
        for (name, ok) in cases {
            assert_eq!(check_object_name(name).is_ok(), ok, "{name:?}");
        }
        assert_eq!(object_path(4, "op/v-1").ok().as_deref(), Some("state/epoch-4/op/v-1"));
        let error = object_path(4, "a b").err().map(|e| e.code);
        assert_eq!(error, Some("checkpoint.object_name"));
    }
}
