//! Writing and reading the state blobs operators write at a barrier (window and group aggregates,
//! sessions, TopN, joins, OVER aggregates): every read is bounds-checked, so a damaged blob or one of another
//! plan is a typed `state.corrupt` error naming the state, never a panic. Each
//! operator's module documents its own layout; this is only the cursor over it.

use std::collections::BTreeMap;

use sluice_types::SluiceError;

/// Per-vnode blobs being written, each laid out as `u32 version, u32 entries` (LE) then
/// the entries, in the order they were added: the header the keyed states share.
pub(crate) struct BlobWriter {
    version: u32,
    blobs: BTreeMap<u32, (u32, Vec<u8>)>,
}

impl BlobWriter {
    pub(crate) fn new(version: u32) -> BlobWriter {
        BlobWriter { version, blobs: BTreeMap::new() }
    }

    /// The bytes of `vnode`'s blob with one more entry counted: append the entry to them.
    pub(crate) fn entry(&mut self, vnode: u32) -> &mut Vec<u8> {
        let (count, bytes) = self.blob(vnode);
        *count += 1;
        bytes
    }

    /// Makes room for `additional` more bytes of entries in `vnode`'s blob, which must
    /// then get at least one entry: a blob sized exactly never grows by doubling (a
    /// state of a gigabyte would otherwise take up to two while it is encoded).
    pub(crate) fn reserve(&mut self, vnode: u32, additional: usize) {
        self.blob(vnode).1.reserve_exact(additional);
    }

    /// The blobs of `items`, given in vnode order (within a vnode, in the order its blob
    /// lists them), each written by `encode`. Each vnode's entries are encoded into one
    /// reused buffer, then copied into a blob of exactly their size (a state of a
    /// gigabyte would otherwise take up to two while its blobs grow by doubling), and
    /// each item is dropped once encoded.
    pub(crate) fn encode_by_vnode<T>(
        version: u32,
        items: impl IntoIterator<Item = (u32, T)>,
        mut encode: impl FnMut(T, &mut Vec<u8>) -> Result<(), SluiceError>,
    ) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
        let mut blobs = BlobWriter::new(version);
        let (mut bytes, mut current, mut count) = (Vec::new(), None, 0u32);
        for (vnode, item) in items {
            if current != Some(vnode) {
                assert!(current.is_none_or(|done| done < vnode), "items come in vnode order");
                if let Some(done) = current {
                    blobs.append_entries(done, count, &bytes);
                }
                (current, count) = (Some(vnode), 0);
                bytes.clear();
            }
            count += 1;
            encode(item, &mut bytes)?;
        }
        if let Some(done) = current {
            blobs.append_entries(done, count, &bytes);
        }
        Ok(blobs.finish())
    }

    /// Appends `count` entries already encoded (`bytes`) to `vnode`'s blob, which grows
    /// by exactly their size.
    fn append_entries(&mut self, vnode: u32, count: u32, bytes: &[u8]) {
        let blob = self.blob(vnode);
        blob.0 += count;
        blob.1.reserve_exact(bytes.len());
        blob.1.extend_from_slice(bytes);
    }

    fn blob(&mut self, vnode: u32) -> &mut (u32, Vec<u8>) {
        let version = self.version;
        self.blobs.entry(vnode).or_insert_with(|| {
            let mut bytes = Vec::with_capacity(8);
            bytes.extend_from_slice(&version.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
            (0, bytes)
        })
    }

    /// The (vnode, blob) pairs, by vnode, each with its entry count written.
    pub(crate) fn finish(self) -> Vec<(u32, Vec<u8>)> {
        self.blobs
            .into_iter()
            .map(|(vnode, (count, mut bytes))| {
                bytes[4..8].copy_from_slice(&count.to_le_bytes());
                (vnode, bytes)
            })
            .collect()
    }
}

/// The error of a damaged blob of `state` (e.g. "window aggregate").
pub(crate) fn corrupt(state: &str, what: &str) -> SluiceError {
    SluiceError::internal("state.corrupt", format!("{state} state is damaged or from another plan: {what}"))
}

/// A bounds-checked, little-endian cursor over one blob of `state`.
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
