//! Fixed-size entries numbered from 0, appended and never changed, in pages that count
//! in the worker's memory budget and spill beyond it: a join's appended entries
//! (`crate::join::append`, 12 bytes per row: NEXMark q20 keeps about a hundred million
//! of them at 100 M events, more than the rows' bytes that spilled before them).
//!
//! Entries are pushed to the newest page (a page holds a spill chunk's bytes of them, as
//! a [`crate::spill::SpillLog`]'s chunk does: 256 KiB). When a page fills and a new one starts while
//! the [`SpillSpace`] is over its budget, the oldest pages in memory but the newest are
//! written to a spill file ([`SpillFile`]: anonymous, never rewritten) and dropped from
//! memory, as a [`crate::spill::SpillLog`] does with its chunks. An entry of a spilled
//! page is read back with one positioned read of its bytes, which the kernel's page
//! cache serves while it can; the recent entries, the ones a stream reads most, stay in
//! memory. The pages in memory are counted in the space by their capacity.
//!
//! The encoding of a spilled page ([`Fixed`]) lives only in an anonymous file of this
//! process: nothing persisted or sent reads it.

use std::sync::Arc;

use sluice_types::SluiceError;

use crate::counter::LazyCounter;
use crate::pages::PAGE_ENTRIES;
use crate::spill::{SpillFile, SpillSpace, SpilledChunk};

/// An entry [`SpillPages`] can write to its file and read back: `BYTES` bytes (at most
/// [`FIXED_BYTES_MAX`]).
pub(crate) trait Fixed: Copy {
    const BYTES: usize;
    /// Appends the entry's `BYTES` bytes to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// The entry `bytes` (`BYTES` of them) encode.
    fn decode(bytes: &[u8]) -> Self;
}

/// The largest [`Fixed::BYTES`].
const FIXED_BYTES_MAX: usize = 32;

/// A page: in memory, or written whole to the file.
#[derive(Debug)]
enum Page<T> {
    Resident(Vec<T>),
    Spilled(SpilledChunk),
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SpillPages<T> {
    pages: Vec<Page<T>>,
    len: usize,
    page_entries: usize,
    /// None: nothing spills, nothing is counted.
    space: Option<Arc<SpillSpace>>,
    file: SpillFile,
    /// Every page before this one is spilled.
    first_resident: usize,
    /// The capacity of the pages in memory, in bytes, as counted in the space.
    resident: usize,
    /// The bytes of the spilled pages, as counted in the space.
    spilled: usize,
    written: Option<LazyCounter>,
}

impl<T: Fixed> SpillPages<T> {
    /// Pages spilling within `space` (None: all in memory), each the size of the space's
    /// chunks (as a log's: 256 KiB), the bytes written counted in `written`.
    pub(crate) fn new(space: Option<Arc<SpillSpace>>, written: Option<LazyCounter>) -> SpillPages<T> {
        let page_entries = space.as_ref().map_or(PAGE_ENTRIES, |space| (space.chunk_bytes() / size_of::<T>()).max(1));
        SpillPages::with_page_entries(space, written, page_entries)
    }

    /// Pages of `page_entries` entries (tests spill small states).
    pub(crate) fn with_page_entries(
        space: Option<Arc<SpillSpace>>,
        written: Option<LazyCounter>,
        page_entries: usize,
    ) -> SpillPages<T> {
        assert!(T::BYTES <= FIXED_BYTES_MAX && page_entries > 0, "small entries, pages holding some");
        SpillPages {
            pages: Vec::new(),
            len: 0,
            page_entries,
            space,
            file: SpillFile::new(u64::MAX),
            first_resident: 0,
            resident: 0,
            spilled: 0,
            written,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes of the pages in memory (their capacity).
    #[cfg(test)]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.resident
    }

    /// Appends `entry`. Starting a page while the space is over budget first spills the
    /// oldest pages in memory.
    pub(crate) fn push(&mut self, entry: T) -> Result<(), SluiceError> {
        let full = match self.pages.last() {
            Some(Page::Resident(page)) => page.len() == self.page_entries,
            Some(Page::Spilled(_)) | None => true,
        };
        if full {
            // The first page grows from nothing (a small state holds no more than its
            // entries); a later one is reserved whole, its memory faulted in as written.
            let page = if self.pages.is_empty() { Vec::new() } else { Vec::with_capacity(self.page_entries) };
            self.count(page.capacity() * size_of::<T>());
            self.pages.push(Page::Resident(page));
            self.spill_over_budget()?;
        }
        let Some(Page::Resident(page)) = self.pages.last_mut() else { unreachable!("the newest page stays in memory") };
        let capacity = page.capacity();
        page.push(entry);
        let grown = page.capacity() - capacity;
        if grown > 0 {
            self.count(grown * size_of::<T>());
        }
        self.len += 1;
        Ok(())
    }

    fn count(&mut self, bytes: usize) {
        self.resident += bytes;
        if let Some(space) = &self.space {
            space.charge(bytes);
        }
    }

    /// While the space is over budget, spills the oldest page in memory but the newest.
    fn spill_over_budget(&mut self) -> Result<(), SluiceError> {
        let Some(space) = self.space.clone() else { return Ok(()) };
        while space.over_budget() && self.first_resident + 1 < self.pages.len() {
            let Page::Resident(page) = &self.pages[self.first_resident] else {
                unreachable!("pages from the first resident one on are in memory")
            };
            let mut bytes = Vec::with_capacity(page.len() * T::BYTES);
            for entry in page {
                entry.encode(&mut bytes);
            }
            debug_assert_eq!(bytes.len(), page.len() * T::BYTES, "each entry its fixed bytes");
            let capacity = page.capacity() * size_of::<T>();
            let spilled = self.file.write(&space, &bytes)?;
            self.pages[self.first_resident] = Page::Spilled(spilled);
            self.first_resident += 1;
            self.resident -= capacity;
            space.release(capacity);
            self.spilled += bytes.len();
            space.count_spilled(bytes.len(), true);
            if let Some(written) = self.written.as_mut() {
                written.add(bytes.len() as u64);
            }
        }
        Ok(())
    }

    /// Entry `index`, if its page is in memory.
    pub(crate) fn resident(&self, index: usize) -> Option<&T> {
        assert!(index < self.len, "entry {index} of {}", self.len);
        match &self.pages[index / self.page_entries] {
            Page::Resident(page) => Some(&page[index % self.page_entries]),
            Page::Spilled(_) => None,
        }
    }

    /// Entry `index`, from memory or from the file.
    pub(crate) fn get(&self, index: usize) -> Result<T, SluiceError> {
        assert!(index < self.len, "entry {index} of {}", self.len);
        match &self.pages[index / self.page_entries] {
            Page::Resident(page) => Ok(page[index % self.page_entries]),
            Page::Spilled(spilled) => {
                let mut bytes = [0; FIXED_BYTES_MAX];
                let bytes = &mut bytes[..T::BYTES];
                spilled.read_at(index % self.page_entries * T::BYTES, bytes)?;
                Ok(T::decode(bytes))
            }
        }
    }

    /// Calls `each` with the first index and the entries of every page from `range`'s,
    /// a page at a time (a spilled page read whole), newest page first (`newest_first`)
    /// or oldest first.
    pub(crate) fn for_each_page(
        &self,
        range: std::ops::Range<usize>,
        newest_first: bool,
        mut each: impl FnMut(usize, &[T]),
    ) -> Result<(), SluiceError> {
        assert!(range.end <= self.len, "entries {range:?} of {}", self.len);
        if range.is_empty() {
            return Ok(());
        }
        let pages = range.start / self.page_entries..range.end.div_ceil(self.page_entries);
        let mut read = Vec::new();
        let mut visit = |page: usize| -> Result<(), SluiceError> {
            let first = page * self.page_entries;
            let (start, end) = (range.start.max(first) - first, range.end.min(first + self.page_entries) - first);
            match &self.pages[page] {
                Page::Resident(entries) => each(first + start, &entries[start..end]),
                Page::Spilled(spilled) => {
                    let mut bytes = vec![0; (end - start) * T::BYTES];
                    spilled.read_at(start * T::BYTES, &mut bytes)?;
                    read.clear();
                    read.extend(bytes.chunks_exact(T::BYTES).map(T::decode));
                    each(first + start, &read);
                }
            }
            Ok(())
        };
        if newest_first { pages.rev().try_for_each(&mut visit) } else { pages.into_iter().try_for_each(&mut visit) }
    }

    /// A copy of the entries `range`.
    pub(crate) fn copy_range(&self, range: std::ops::Range<usize>) -> Result<Vec<T>, SluiceError> {
        let mut copy = Vec::with_capacity(range.len());
        self.for_each_page(range, false, |_, entries| copy.extend_from_slice(entries))?;
        Ok(copy)
    }
}

impl<T> Drop for SpillPages<T> {
    fn drop(&mut self) {
        if let Some(space) = &self.space {
            space.release(self.resident);
            space.count_spilled(self.spilled, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    impl Fixed for (u32, u64) {
        const BYTES: usize = 12;

        fn encode(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0.to_le_bytes());
            out.extend_from_slice(&self.1.to_le_bytes());
        }

        fn decode(bytes: &[u8]) -> Self {
            let (a, b) = bytes.split_at(4);
            (u32::from_le_bytes(a.try_into().expect("4 bytes")), u64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
    }

    fn entry(i: usize) -> (u32, u64) {
        (i as u32, (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Whatever spilled, every entry, every range and every page walk gives what a
        /// vector holds; the space counts the pages in memory and in the file, and gets
        /// them back when the pages are dropped.
        #[test]
        fn spilled_pages_hold_what_a_vector_holds(
            count in 0usize..700,
            page_entries in 1usize..64,
            budget in prop::sample::select(vec![0usize, 512, 1 << 20]),
            ranges in prop::collection::vec((any::<usize>(), any::<usize>()), 1..8),
        ) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let space = SpillSpace::new(dir.path().to_path_buf(), budget);
            let mut pages = SpillPages::with_page_entries(Some(Arc::clone(&space)), None, page_entries);
            let reference: Vec<_> = (0..count).map(entry).collect();
            for &e in &reference {
                pages.push(e).expect("push");
            }
            prop_assert_eq!(pages.len(), count);
            for (i, e) in reference.iter().enumerate() {
                prop_assert_eq!(pages.get(i).expect("get"), *e);
                if let Some(resident) = pages.resident(i) {
                    prop_assert_eq!(resident, e);
                }
            }
            for (a, b) in ranges {
                let (a, b) = (a % (count + 1), b % (count + 1));
                let range = a.min(b)..a.max(b);
                prop_assert_eq!(&pages.copy_range(range.clone()).expect("copy")[..], &reference[range.clone()]);
                let mut backwards = Vec::new();
                pages.for_each_page(range.clone(), true, |first, entries| {
                    for (offset, e) in entries.iter().enumerate().rev() {
                        backwards.push((first + offset, *e));
                    }
                }).expect("walk");
                let expected: Vec<_> = range.clone().rev().map(|i| (i, reference[i])).collect();
                prop_assert_eq!(backwards, expected);
            }
            prop_assert_eq!(space.resident(), pages.resident_bytes());
            let whole_pages_before_the_newest = count.div_ceil(page_entries).saturating_sub(1);
            match budget {
                // Every page but the newest spilled.
                0 => prop_assert_eq!(space.spilled(), whole_pages_before_the_newest * page_entries * 12),
                // Nothing over the budget, nothing spilled.
                1048576 => prop_assert_eq!(space.spilled(), 0),
                // Within the budget but the newest page (the first grows by doubling).
                _ => prop_assert!(space.resident() <= budget + 2 * page_entries * 16),
            }
            drop(pages);
            prop_assert_eq!((space.resident(), space.spilled()), (0, 0), "a dropped store gives its bytes back");
        }
    }
}
