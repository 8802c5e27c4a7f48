//! The values of COUNT(DISTINCT x) in one group, shared by every COUNT(DISTINCT) of the
//! same argument column (its FILTERed variants: NEXMark q15 and q16 count the distinct
//! bidders, and the distinct auctions, each under four filters).
//!
//! A hash set of values in the key encoding ([`sluice_types::key`]), looked up by the
//! hash the key encoder computed for each value: a row updates, in one lookup, the
//! *members* (the COUNT(DISTINCT)s of the column) whose FILTER holds. A member's result
//! is the number of its values, kept as they change (the caller holds it in the
//! member's accumulator). Each value is an entry of the hash table itself, its bytes
//! inline when short (every integer, date and timestamp), so a lookup reads the table's
//! control bytes and one entry. A set has at most [`MEMBERS_MAX`] members; the group
//! aggregate gives a column with more COUNT(DISTINCT)s several sets.
//!
//! - Over an updating input ([`DistinctValues::counted`]) each value has one weighted
//!   count per member; a member counts the values of positive count, and a value whose
//!   counts are all 0 is dropped.
//! - Over an append-only input ([`DistinctValues::seen`]) nothing is ever retracted, so
//!   each value keeps only which members saw it (a bit each), as Flink does for
//!   append-only input. NEXMark q16 holds millions of such values (its 10,004 channels
//!   each count their own bidders and auctions), so they are packed by size:
//!   - a value the key encoding writes as an i64 (tag `0x02`: integers, dates,
//!     timestamps, times and intervals) of 60 bits or fewer: in 8 bytes with its
//!     members ([`SeenInt`]), hashed by its value alone (this table is never persisted,
//!     so its hash is free to be another than the key hash); while every such value of
//!     the set takes 28 bits or fewer (ids below 134 million: NEXMark's bidders and
//!     auctions), in 4 bytes ([`IntTable::Narrow`]), the table widened at the first
//!     value that does not fit;
//!   - any other value of up to 15 bytes: in 16 bytes with its members ([`SeenShort`],
//!     64 with counts);
//!   - a longer one boxed in a table of its own.
//!
//! **Changes.** While the aggregate keeps changes for delta snapshots, a
//! [`DistinctSet`] logs each value that changed since the previous snapshot, in the
//! table's own entry layout (8 bytes a new integer), the value's state after the change:
//! a snapshot writes one record per logged value, not the whole set. A set whose log
//! outgrows twice its values (an updating input churning a few values), or that started
//! over (its group's rows all retracted), is written whole instead (`SetLog::rewrite`).

use hashbrown::HashTable;

use super::super::table_hash;
use crate::bytes::ShortBytes;
use crate::same_bytes;
use sluice_types::SluiceError;

/// The most members one set serves.
pub(super) const MEMBERS_MAX: usize = 4;

/// One distinct value and its weighted count per member.
#[derive(Debug, Clone)]
pub(super) struct Counted {
    value: ShortBytes,
    counts: [i64; MEMBERS_MAX],
}

/// The longest value a [`SeenShort`] holds.
const SEEN_SHORT: usize = 15;

/// A distinct value of at most [`SEEN_SHORT`] bytes and the members that saw it (bit
/// `m` for member `m`), in 16 bytes: the value, zero-padded, then one byte holding its
/// length (low 4 bits) and its members (high 4 bits).
#[derive(Debug, Clone, Copy)]
pub(super) struct SeenShort([u8; SEEN_SHORT + 1]);

const _: () = assert!(MEMBERS_MAX <= 4, "a SeenShort keeps its members in 4 bits");

impl SeenShort {
    fn new(value: &[u8]) -> SeenShort {
        let mut bytes = [0u8; SEEN_SHORT + 1];
        bytes[..value.len()].copy_from_slice(value);
        bytes[SEEN_SHORT] = value.len() as u8;
        SeenShort(bytes)
    }

    fn value(&self) -> &[u8] {
        &self.0[..usize::from(self.0[SEEN_SHORT] & 0x0F)]
    }

    fn members(&self) -> u8 {
        self.0[SEEN_SHORT] >> 4
    }

    fn set_members(&mut self, members: u8) {
        self.0[SEEN_SHORT] = (self.0[SEEN_SHORT] & 0x0F) | (members << 4);
    }
}

/// The tag of an integer in the key encoding ([`sluice_types::key`]), then its 8 bytes.
const TAG_SIGNED: u8 = 0x02;

/// An integer value of 60 bits (two's complement) and the members that saw it, in 8
/// bytes: the value shifted left by 4, its members in the low 4 bits.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeenInt(u64);

impl SeenInt {
    /// `value` (of 60 bits or fewer) seen by `members`.
    fn new(value: i64, members: u8) -> SeenInt {
        SeenInt(((value as u64) << 4) | u64::from(members))
    }

    /// The integer of an encoded `value` if it is one a [`SeenInt`] holds.
    fn of(value: &[u8]) -> Option<i64> {
        let (&TAG_SIGNED, bytes) = value.split_first()? else { return None };
        let value = i64::from_le_bytes(bytes.try_into().ok()?);
        SeenInt::fits(value).then_some(value)
    }

    /// Whether `value` takes 60 bits or fewer.
    fn fits(value: i64) -> bool {
        (value << 4) >> 4 == value
    }

    fn value(self) -> i64 {
        (self.0 as i64) >> 4
    }

    fn members(self) -> u8 {
        (self.0 & 0x0F) as u8
    }

    fn set_members(&mut self, members: u8) {
        self.0 = (self.0 & !0x0F) | u64::from(members);
    }

    /// The value in the key encoding.
    fn encoded(self) -> [u8; 9] {
        SeenInt::encode(self.value())
    }

    /// An integer in the key encoding.
    fn encode(value: i64) -> [u8; 9] {
        let mut bytes = [TAG_SIGNED; 9];
        bytes[1..].copy_from_slice(&value.to_le_bytes());
        bytes
    }
}

/// Whether `value` takes 28 bits or fewer (a narrow entry's).
fn fits_narrow(value: i64) -> bool {
    (value << 36) >> 36 == value
}

/// A narrow entry: a value of 28 bits shifted left by 4, its members in the low 4 bits.
fn narrow(value: i64, members: u8) -> u32 {
    ((value as u32) << 4) | u32::from(members)
}

fn narrow_value(entry: u32) -> i64 {
    i64::from((entry as i32) >> 4)
}

/// The integers of a seen set: 4 bytes each while they all fit 28 bits, else 8.
#[derive(Debug, Clone)]
pub(super) enum IntTable {
    Narrow(HashTable<u32>),
    Wide(HashTable<SeenInt>),
}

impl IntTable {
    fn len(&self) -> usize {
        match self {
            IntTable::Narrow(table) => table.len(),
            IntTable::Wide(table) => table.len(),
        }
    }

    /// Every value as a wide entry.
    fn iter(&self) -> Box<dyn Iterator<Item = SeenInt> + '_> {
        match self {
            IntTable::Narrow(table) => Box::new(table.iter().map(|&e| SeenInt::new(narrow_value(e), (e & 0x0F) as u8))),
            IntTable::Wide(table) => Box::new(table.iter().copied()),
        }
    }

    /// Whether `value` (of 60 bits or fewer) is held.
    fn holds(&self, value: i64) -> bool {
        let hash = int_hash(value);
        match self {
            IntTable::Narrow(table) => fits_narrow(value) && table.find(hash, |&e| narrow_value(e) == value).is_some(),
            IntTable::Wide(table) => table.find(hash, |e| e.value() == value).is_some(),
        }
    }

    /// The members of `value` (of 60 bits or fewer), the value added with none if new.
    fn members_of(&mut self, value: i64) -> Members<'_> {
        if matches!(self, IntTable::Narrow(_)) && !fits_narrow(value) {
            let mut wide = HashTable::with_capacity(self.len() + 1);
            for entry in self.iter() {
                wide.insert_unique(int_hash(entry.value()), entry, |e: &SeenInt| int_hash(e.value()));
            }
            *self = IntTable::Wide(wide);
        }
        let hash = int_hash(value);
        match self {
            IntTable::Narrow(table) => {
                let entry = table.entry(hash, |&e| narrow_value(e) == value, |&e| int_hash(narrow_value(e)));
                Members::Narrow(entry.or_insert_with(|| narrow(value, 0)).into_mut())
            }
            IntTable::Wide(table) => {
                let entry = table.entry(hash, |entry| entry.value() == value, |entry| int_hash(entry.value()));
                Members::Int(entry.or_insert_with(|| SeenInt::new(value, 0)).into_mut())
            }
        }
    }
}

/// The table hash of an integer: a full mix of its bits (ids that differ only in their
/// high bits must not share buckets).
fn int_hash(value: i64) -> u64 {
    let mut hash = value as u64;
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// The members of a value seen by the `counted` members too (bit `m` for member `m`),
/// each member new to it adding 1 to its `positive`.
fn see(mut seen: u8, counted: &[bool], positive: &mut [i64]) -> u8 {
    for (member, (counted, positive)) in counted.iter().zip(positive.iter_mut()).enumerate() {
        if *counted && seen & (1 << member) == 0 {
            seen |= 1 << member;
            *positive += 1;
        }
    }
    seen
}

/// A value as [`DistinctValues::entries`] lists it: the set's bytes, or an integer's
/// encoding.
#[derive(Debug, Clone, Copy)]
pub(super) enum Listed<'a> {
    Bytes(&'a [u8]),
    Int([u8; 9]),
}

impl Listed<'_> {
    pub(super) fn get(&self) -> &[u8] {
        match self {
            Listed::Bytes(bytes) => bytes,
            Listed::Int(bytes) => bytes,
        }
    }
}

/// A longer distinct value and the members that saw it.
#[derive(Debug, Clone)]
pub(super) struct SeenLong {
    value: Box<[u8]>,
    members: u8,
}

/// A group's set of one shared column, and what changed in it since the previous
/// snapshot (None: nothing, or changes are not kept).
#[derive(Debug, Clone)]
pub(super) struct DistinctSet {
    pub(super) values: DistinctValues,
    pub(super) log: Option<Box<SetLog>>,
    /// Over an append-only input, once values of the set were spilled beyond the memory
    /// budget: the range they span (None: every value is in `values`).
    pub(super) spilled: Option<Box<SpilledRange>>,
}

/// The range of the values a set spilled ([`DistinctSet::spill`]): a value outside it
/// was never spilled, so only one inside it is looked for in the spilled runs. Integers
/// (of 60 bits) by their value, others by their encoding's bytes.
#[derive(Debug, Clone, Default)]
pub(super) struct SpilledRange {
    ints: Option<(i64, i64)>,
    bytes: Option<BytesRange>,
}

/// The lowest and highest encodings of a range.
type BytesRange = (Box<[u8]>, Box<[u8]>);

impl SpilledRange {
    fn add(&mut self, value: &[u8]) {
        if let Some(int) = SeenInt::of(value) {
            self.ints = Some(self.ints.map_or((int, int), |(low, high)| (low.min(int), high.max(int))));
            return;
        }
        match self.bytes.as_mut() {
            None => self.bytes = Some((value.into(), value.into())),
            Some((low, high)) => {
                if value < &low[..] {
                    *low = value.into();
                } else if value > &high[..] {
                    *high = value.into();
                }
            }
        }
    }

    fn holds_int(&self, value: i64) -> bool {
        self.ints.is_some_and(|(low, high)| low <= value && value <= high)
    }

    fn holds(&self, value: &[u8]) -> bool {
        match SeenInt::of(value) {
            Some(int) => self.holds_int(int),
            None => self.bytes.as_ref().is_some_and(|(low, high)| &low[..] <= value && value <= &high[..]),
        }
    }
}

/// The values of a set that changed since the previous snapshot, each as its entry
/// after the change (a later entry of a value overrides an earlier one; a counted value
/// whose counts are all 0 is gone). `rewrite`: the set is to be written whole.
#[derive(Debug, Clone, Default)]
pub(super) struct SetLog {
    ints: Vec<SeenInt>,
    short: Vec<SeenShort>,
    long: Vec<SeenLong>,
    counted: Vec<Counted>,
    pub(super) rewrite: bool,
}

/// A logged value's state: the members that saw it, or its counts (all 0: gone).
#[derive(Debug, Clone, Copy)]
pub(super) enum ValueState<'a> {
    Members(u8),
    Counts(&'a [i64; MEMBERS_MAX]),
}

impl SetLog {
    fn len(&self) -> usize {
        self.ints.len() + self.short.len() + self.long.len() + self.counted.len()
    }

    /// Whether a logged value may be gone (only a counted set's may).
    pub(super) fn has_deletes(&self) -> bool {
        !self.counted.is_empty()
    }

    /// The logged values and their states, in the order they were logged per kind
    /// (a value is always of one kind, so a later entry of it comes later).
    pub(super) fn entries(&self) -> impl Iterator<Item = (Listed<'_>, ValueState<'_>)> {
        let ints = self.ints.iter().map(|e| (Listed::Int(e.encoded()), ValueState::Members(e.members())));
        let short = self.short.iter().map(|e| (Listed::Bytes(e.value()), ValueState::Members(e.members())));
        let long = self.long.iter().map(|e| (Listed::Bytes(&e.value[..]), ValueState::Members(e.members)));
        let counted = self.counted.iter().map(|e| (Listed::Bytes(e.value.get()), ValueState::Counts(&e.counts)));
        ints.chain(short).chain(long).chain(counted)
    }
}

impl DistinctSet {
    pub(super) fn new(values: DistinctValues) -> DistinctSet {
        DistinctSet { values, log: None, spilled: None }
    }

    /// Takes every value out of memory, for the caller to write to the spilled runs, and
    /// widens the spilled range over them. The set is then empty in memory; a value is
    /// read back by its next row ([`DistinctSet::may_be_spilled`], [`DistinctSet::load_seen`]).
    /// Over an append-only input only: a value once seen is never gone, so a spilled copy
    /// is never stale but for members added since, which the newer copy (in memory, or
    /// spilled later) holds.
    pub(super) fn spill(&mut self, members: usize) -> DistinctValues {
        assert!(matches!(self.values, DistinctValues::Seen { .. }), "only an append-only input's set spills");
        assert!(self.may_spill(), "a set to be written whole keeps its values");
        let values = std::mem::replace(&mut self.values, DistinctValues::seen(members));
        let range = self.spilled.get_or_insert_with(Box::default);
        values.each_record(|value, _| range.add(value.get()));
        values
    }

    /// Whether its values may spill: not while the next snapshot is to write it whole
    /// (its log says so: it started over, read back from a cold run while changed),
    /// which takes the values from memory.
    pub(super) fn may_spill(&self) -> bool {
        !self.log.as_ref().is_some_and(|log| log.rewrite)
    }

    /// Whether the encoded `value` (table hash `hash`) may be in the spilled runs: not
    /// in memory, within the spilled range.
    pub(super) fn may_be_spilled(&self, value: &[u8], hash: u64) -> bool {
        self.spilled.as_ref().is_some_and(|range| range.holds(value)) && !self.values.holds(value, hash)
    }

    /// [`DistinctSet::may_be_spilled`] for an integer as a BIGINT column holds it: its
    /// encoding when it may be spilled.
    pub(super) fn may_be_spilled_int(&self, value: i64) -> Option<[u8; 9]> {
        let range = self.spilled.as_ref()?;
        let encoded = SeenInt::encode(value);
        let maybe = if SeenInt::fits(value) {
            range.holds_int(value) && !self.values.holds_int(value)
        } else {
            self.may_be_spilled(&encoded, sluice_types::key::hash(&encoded))
        };
        maybe.then_some(encoded)
    }

    /// Puts back in memory a spilled value and the members that saw it, unlogged (it
    /// is in the checkpoints as it is).
    pub(super) fn load_seen(&mut self, value: &[u8], hash: u64, members: u8) {
        for member in 0..MEMBERS_MAX {
            if members & (1 << member) != 0 {
                self.values.load(member, value, hash, 1);
            }
        }
    }

    /// The set is to be written whole at the next snapshot (it started over).
    pub(super) fn start_over(&mut self) {
        assert!(self.spilled.is_none(), "a set with spilled values never starts over: its input never retracts");
        self.log = Some(Box::new(SetLog { rewrite: true, ..SetLog::default() }));
    }

    /// The log to add a change to, when changes are kept (`tracking`) and the set is
    /// not to be written whole anyway.
    fn log_of(log: &mut Option<Box<SetLog>>, tracking: bool) -> Option<&mut SetLog> {
        if !tracking {
            return None;
        }
        let log = log.get_or_insert_with(Box::default);
        (!log.rewrite).then_some(&mut **log)
    }

    /// A log longer than twice the set's values (and a floor) gives way to a rewrite;
    /// not a set with spilled values, whose rewrite would need them all (over an
    /// append-only input a value is logged at most once per member, so its log holds
    /// no more than four entries per value changed since the previous snapshot).
    fn bound_log(&mut self) {
        if self.spilled.is_some() {
            return;
        }
        let Some(log) = self.log.as_mut() else { return };
        if log.len() > 2 * self.values.len() + 1024 {
            **log = SetLog { rewrite: true, ..SetLog::default() };
        }
    }

    /// [`DistinctValues::update`], logged when `tracking`.
    pub(super) fn update(
        &mut self,
        value: &[u8],
        hash: u64,
        counted: &[bool],
        weight: i64,
        positive: &mut [i64],
        tracking: bool,
    ) {
        let log = DistinctSet::log_of(&mut self.log, tracking);
        self.values.update(value, hash, counted, weight, positive, log);
        self.bound_log();
    }

    /// [`DistinctValues::update_int`], logged when `tracking`.
    pub(super) fn update_int(
        &mut self,
        value: i64,
        counted: &[bool],
        weight: i64,
        positive: &mut [i64],
        tracking: bool,
    ) {
        let log = DistinctSet::log_of(&mut self.log, tracking);
        self.values.update_int(value, counted, weight, positive, log);
        self.bound_log();
    }
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub(super) enum DistinctValues {
    Counted(HashTable<Counted>),
    Seen { ints: IntTable, short: HashTable<SeenShort>, long: HashTable<SeenLong> },
}

/// The members of one value of a [`DistinctValues::Seen`] set, where they are kept.
enum Members<'a> {
    Narrow(&'a mut u32),
    Int(&'a mut SeenInt),
    Short(&'a mut SeenShort),
    Long(&'a mut u8),
}

impl Members<'_> {
    fn get(&self) -> u8 {
        match self {
            Members::Narrow(entry) => (**entry & 0x0F) as u8,
            Members::Int(entry) => entry.members(),
            Members::Short(entry) => entry.members(),
            Members::Long(members) => **members,
        }
    }

    fn set(&mut self, members: u8) {
        match self {
            Members::Narrow(entry) => **entry = (**entry & !0x0F) | u32::from(members),
            Members::Int(entry) => entry.set_members(members),
            Members::Short(entry) => entry.set_members(members),
            Members::Long(held) => **held = members,
        }
    }
}

/// The members of `value` (table hash `table`) in a seen set, the value added with none
/// if new.
fn seen_members<'a>(
    ints: &'a mut IntTable,
    short: &'a mut HashTable<SeenShort>,
    long: &'a mut HashTable<SeenLong>,
    value: &[u8],
    table: u64,
) -> Members<'a> {
    if let Some(int) = SeenInt::of(value) {
        ints.members_of(int)
    } else if value.len() <= SEEN_SHORT {
        let eq = |entry: &SeenShort| same_bytes(entry.value(), value);
        let entry = short.entry(table, eq, |entry| table_hash(sluice_types::key::hash(entry.value())));
        Members::Short(entry.or_insert_with(|| SeenShort::new(value)).into_mut())
    } else {
        let eq = |entry: &SeenLong| same_bytes(&entry.value, value);
        let entry = long.entry(table, eq, |entry| table_hash(sluice_types::key::hash(&entry.value)));
        Members::Long(&mut entry.or_insert_with(|| SeenLong { value: value.into(), members: 0 }).into_mut().members)
    }
}

/// The table hash of an entry's value, when the table grows (lookups use the hash the
/// key encoder computed, the same).
fn rehash(value: &ShortBytes) -> u64 {
    table_hash(sluice_types::key::hash(value.get()))
}

impl DistinctValues {
    /// A set for `members` COUNT(DISTINCT)s over an input that may retract.
    pub(super) fn counted(members: usize) -> DistinctValues {
        assert!(members <= MEMBERS_MAX, "at most {MEMBERS_MAX} COUNT(DISTINCT)s share one set");
        DistinctValues::Counted(HashTable::new())
    }

    /// A set for `members` COUNT(DISTINCT)s over an append-only input.
    pub(super) fn seen(members: usize) -> DistinctValues {
        assert!(members <= MEMBERS_MAX, "at most {MEMBERS_MAX} COUNT(DISTINCT)s share one set");
        DistinctValues::Seen {
            ints: IntTable::Narrow(HashTable::new()),
            short: HashTable::new(),
            long: HashTable::new(),
        }
    }

    /// Adds `weight` to the count of `value` (of hash `hash`) of each member whose
    /// `counted` is true, and adds to each member's `positive` the change in its number
    /// of values (-1, 0 or 1). Over an append-only input `weight` is positive.
    /// Each value that changed is pushed to `log`, as its entry after the change.
    pub(super) fn update(
        &mut self,
        value: &[u8],
        hash: u64,
        counted: &[bool],
        weight: i64,
        positive: &mut [i64],
        log: Option<&mut SetLog>,
    ) {
        if weight == 0 || !counted.iter().any(|c| *c) {
            return;
        }
        let table = table_hash(hash);
        match self {
            DistinctValues::Counted(entries) => {
                let eq = |entry: &Counted| same_bytes(entry.value.get(), value);
                let new = || Counted { value: ShortBytes::new(value), counts: [0; MEMBERS_MAX] };
                let mut entry = entries.entry(table, eq, |entry| rehash(&entry.value)).or_insert_with(new);
                let counts = &mut entry.get_mut().counts;
                for ((count, counted), positive) in counts.iter_mut().zip(counted).zip(positive.iter_mut()) {
                    if *counted {
                        let before = *count > 0;
                        *count += weight;
                        *positive += i64::from(*count > 0) - i64::from(before);
                    }
                }
                let gone = counts.iter().all(|count| *count == 0);
                if let Some(log) = log {
                    log.counted.push(entry.get().clone());
                }
                if gone {
                    entry.remove();
                }
            }
            DistinctValues::Seen { ints, short, long } => {
                assert!(weight > 0, "the planner declared this aggregate's input append-only");
                let mut members = seen_members(ints, short, long, value, table);
                let (before, after) = (members.get(), see(members.get(), counted, positive));
                members.set(after);
                if let Some(log) = log.filter(|_| after != before) {
                    match members {
                        Members::Narrow(&mut entry) => log.ints.push(SeenInt::new(narrow_value(entry), after)),
                        Members::Int(entry) => log.ints.push(*entry),
                        Members::Short(entry) => log.short.push(*entry),
                        Members::Long(_) => log.long.push(SeenLong { value: value.into(), members: after }),
                    }
                }
            }
        }
    }

    /// [`Self::update`] for the integer `value` of a BIGINT column, without its encoding
    /// unless it needs more than 60 bits (over an append-only input only).
    pub(super) fn update_int(
        &mut self,
        value: i64,
        counted: &[bool],
        weight: i64,
        positive: &mut [i64],
        log: Option<&mut SetLog>,
    ) {
        let DistinctValues::Seen { ints, .. } = self else {
            panic!("integers are read as they are only over an append-only input")
        };
        assert!(weight > 0, "the planner declared this aggregate's input append-only");
        // A value no member counts (every FILTER false) is not kept, as in `update`.
        if !counted.iter().any(|c| *c) {
            return;
        }
        if !SeenInt::fits(value) {
            let encoded = SeenInt::encode(value);
            return self.update(&encoded, sluice_types::key::hash(&encoded), counted, weight, positive, log);
        }
        let mut members = ints.members_of(value);
        let (before, after) = (members.get(), see(members.get(), counted, positive));
        members.set(after);
        if let Some(log) = log.filter(|_| after != before) {
            log.ints.push(SeenInt::new(value, after));
        }
    }

    /// The values of `member` with their counts (over an append-only input, 1: it saw
    /// them), in increasing byte order.
    #[cfg(test)]
    pub(super) fn entries(&self, member: usize) -> Vec<(Listed<'_>, i64)> {
        let mut entries: Vec<(Listed<'_>, i64)> = match self {
            DistinctValues::Counted(entries) => entries
                .iter()
                .map(|entry| (Listed::Bytes(entry.value.get()), entry.counts[member]))
                .filter(|(_, count)| *count != 0)
                .collect(),
            DistinctValues::Seen { ints, short, long } => {
                let seen = |members: u8| members & (1 << member) != 0;
                let ints = ints.iter().filter(|e| seen(e.members())).map(|e| (Listed::Int(e.encoded()), 1));
                let short = short.iter().filter(|e| seen(e.members())).map(|e| (Listed::Bytes(e.value()), 1));
                let long = long.iter().filter(|e| seen(e.members)).map(|e| (Listed::Bytes(&e.value[..]), 1));
                ints.chain(short).chain(long).collect()
            }
        };
        entries.sort_unstable_by(|a, b| a.0.get().cmp(b.0.get()));
        entries
    }

    /// Sets the count of `value` (of hash `hash`) of `member`, as read from a snapshot
    /// (over an append-only input, any positive count means seen); false if it was set
    /// already (a value twice) or is negative where nothing can retract.
    pub(super) fn load(&mut self, member: usize, value: &[u8], hash: u64, count: i64) -> bool {
        let table = table_hash(hash);
        match self {
            DistinctValues::Counted(entries) => {
                let eq = |entry: &Counted| same_bytes(entry.value.get(), value);
                let new = || Counted { value: ShortBytes::new(value), counts: [0; MEMBERS_MAX] };
                let mut entry = entries.entry(table, eq, |entry| rehash(&entry.value)).or_insert_with(new);
                let stored = &mut entry.get_mut().counts[member];
                let fresh = *stored == 0;
                if fresh {
                    *stored = count;
                }
                fresh
            }
            DistinctValues::Seen { ints, short, long } => {
                if count < 0 {
                    return false;
                }
                let mut members = seen_members(ints, short, long, value, table);
                let seen = members.get();
                members.set(seen | 1 << member);
                seen & (1 << member) == 0
            }
        }
    }

    /// Calls `f` with every value and its state, in no order, without gathering them.
    pub(super) fn each_record<'a>(&'a self, mut f: impl FnMut(Listed<'a>, ValueState<'a>)) {
        match self {
            DistinctValues::Counted(entries) => {
                entries.iter().for_each(|e| f(Listed::Bytes(e.value.get()), ValueState::Counts(&e.counts)))
            }
            DistinctValues::Seen { ints, short, long } => {
                ints.iter().for_each(|e| f(Listed::Int(e.encoded()), ValueState::Members(e.members())));
                short.iter().for_each(|e| f(Listed::Bytes(e.value()), ValueState::Members(e.members())));
                long.iter().for_each(|e| f(Listed::Bytes(&e.value[..]), ValueState::Members(e.members)));
            }
        }
    }

    /// Calls `f` with every value of a seen set and its members in increasing order of
    /// the values' encodings (the order of their records' keys), holding 8 bytes a value
    /// meanwhile; stops at the first error.
    pub(super) fn each_seen_in_order(
        &self,
        mut f: impl FnMut(&[u8], u8) -> Result<(), SluiceError>,
    ) -> Result<(), SluiceError> {
        let DistinctValues::Seen { ints, short, long } = self else { panic!("only a seen set is written in order") };
        // An integer's encoding is its tag, then its bytes little-endian first: in
        // byte order, the value with its bytes swapped.
        let mut ints: Vec<SeenInt> = ints.iter().collect();
        ints.sort_unstable_by_key(|entry| (entry.value() as u64).swap_bytes());
        let mut short: Vec<&SeenShort> = short.iter().collect();
        short.sort_unstable_by(|a, b| a.value().cmp(b.value()));
        let mut long: Vec<&SeenLong> = long.iter().collect();
        long.sort_unstable_by(|a, b| a.value.cmp(&b.value));
        let (mut ints, mut short, mut long) =
            (ints.into_iter().peekable(), short.into_iter().peekable(), long.into_iter().peekable());
        loop {
            let int = ints.peek().map(|entry| entry.encoded());
            let candidates = [
                int.as_ref().map(|bytes| &bytes[..]),
                short.peek().map(|e| e.value()),
                long.peek().map(|e| &e.value[..]),
            ];
            let Some(least) = (0..3).filter(|&i| candidates[i].is_some()).min_by_key(|&i| candidates[i]) else {
                return Ok(());
            };
            match least {
                0 => {
                    let entry = ints.next().expect("peeked");
                    f(&entry.encoded(), entry.members())?;
                }
                1 => {
                    let entry = short.next().expect("peeked");
                    f(entry.value(), entry.members())?;
                }
                _ => {
                    let entry = long.next().expect("peeked");
                    f(&entry.value, entry.members)?;
                }
            }
        }
    }

    /// Every value and its state, in no order (a snapshot writing the set whole).
    pub(super) fn records(&self) -> Vec<(Listed<'_>, ValueState<'_>)> {
        let mut records = Vec::with_capacity(self.len());
        self.each_record(|value, state| records.push((value, state)));
        records
    }

    /// The number of values of `member`.
    pub(super) fn positive(&self, member: usize) -> i64 {
        let count = match self {
            DistinctValues::Counted(entries) => entries.iter().filter(|entry| entry.counts[member] > 0).count(),
            DistinctValues::Seen { ints, short, long } => {
                let seen = |members: u8| members & (1 << member) != 0;
                ints.iter().filter(|e| seen(e.members())).count()
                    + short.iter().filter(|e| seen(e.members())).count()
                    + long.iter().filter(|e| seen(e.members)).count()
            }
        };
        count as i64
    }

    /// About the bytes of memory its values take (tables at their capacity; a value
    /// longer than an entry holds inline counted at 32 bytes more).
    pub(super) fn heap_bytes(&self) -> usize {
        fn table<T>(table: &HashTable<T>) -> usize {
            table.capacity() * (std::mem::size_of::<T>() + 1)
        }
        match self {
            DistinctValues::Counted(entries) => table(entries),
            DistinctValues::Seen { ints, short, long } => {
                let ints = match ints {
                    IntTable::Narrow(narrow) => table(narrow),
                    IntTable::Wide(wide) => table(wide),
                };
                ints + table(short) + table(long) + 32 * long.len()
            }
        }
    }

    /// Whether the encoded `value` (hash `hash`) is held.
    pub(super) fn holds(&self, value: &[u8], hash: u64) -> bool {
        let table = table_hash(hash);
        match self {
            DistinctValues::Counted(entries) => entries.find(table, |e| same_bytes(e.value.get(), value)).is_some(),
            DistinctValues::Seen { ints, short, long } => {
                if let Some(int) = SeenInt::of(value) {
                    ints.holds(int)
                } else if value.len() <= SEEN_SHORT {
                    short.find(table, |e| same_bytes(e.value(), value)).is_some()
                } else {
                    long.find(table, |e| same_bytes(&e.value, value)).is_some()
                }
            }
        }
    }

    /// Whether the integer `value` (of 60 bits or fewer) is held, in a seen set.
    pub(super) fn holds_int(&self, value: i64) -> bool {
        match self {
            DistinctValues::Counted(_) => {
                let encoded = SeenInt::encode(value);
                self.holds(&encoded, sluice_types::key::hash(&encoded))
            }
            DistinctValues::Seen { ints, .. } => ints.holds(value),
        }
    }

    /// How many values are held.
    pub(super) fn len(&self) -> usize {
        match self {
            DistinctValues::Counted(entries) => entries.len(),
            DistinctValues::Seen { ints, short, long } => ints.len() + short.len() + long.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(value: &[u8]) -> u64 {
        sluice_types::key::hash(value)
    }

    /// The values of `member`, as [`DistinctValues::entries`] lists them.
    fn listed(set: &DistinctValues, member: usize) -> Vec<(Vec<u8>, i64)> {
        set.entries(member).into_iter().map(|(value, count)| (value.get().to_vec(), count)).collect()
    }

    fn owned(entries: &[(&[u8], i64)]) -> Vec<(Vec<u8>, i64)> {
        entries.iter().map(|(value, count)| (value.to_vec(), *count)).collect()
    }

    /// An integer in the key encoding.
    fn int(value: i64) -> Vec<u8> {
        [&[TAG_SIGNED][..], &value.to_le_bytes()].concat()
    }

    #[test]
    fn integers_of_60_bits_take_8_bytes_and_list_as_their_encoding() {
        assert_eq!(std::mem::size_of::<SeenInt>(), 8);
        let (low, high) = (-(1i64 << 59), (1i64 << 59) - 1);
        for value in [0, 1, -1, 1000, low, high] {
            let mut entry = SeenInt((value as u64) << 4);
            entry.set_members(0b1010);
            assert_eq!((SeenInt::of(&int(value)), entry.value(), entry.members()), (Some(value), value, 0b1010));
            assert_eq!(entry.encoded().to_vec(), int(value));
        }
        for wide in [low - 1, high + 1, i64::MIN, i64::MAX] {
            assert_eq!(SeenInt::of(&int(wide)), None, "{wide} needs more than 60 bits");
        }
        assert_eq!(SeenInt::of(&[0x03, 1, 0, 0, 0, 0, 0, 0, 0]), None, "an unsigned integer");
        let mut set = DistinctValues::seen(2);
        let mut positive = [0i64; 2];
        for value in [5, -3, 5, i64::MAX, high, i64::MAX] {
            set.update(&int(value), hash(&int(value)), &[true, value > 0], 1, &mut positive, None);
        }
        let DistinctValues::Seen { ints, short, .. } = &set else { panic!("a seen set") };
        assert_eq!((ints.len(), short.len(), positive), (3, 1, [4, 3]));
        let expected: Vec<Vec<u8>> = {
            let mut values: Vec<Vec<u8>> = [5, -3, i64::MAX, high].into_iter().map(int).collect();
            values.sort();
            values
        };
        assert_eq!(listed(&set, 0).into_iter().map(|(value, _)| value).collect::<Vec<_>>(), expected);
        let mut restored = DistinctValues::seen(2);
        for (value, count) in listed(&set, 1) {
            assert!(restored.load(1, &value, hash(&value), count));
        }
        assert_eq!((restored.positive(0), restored.positive(1), restored.len()), (0, 3, 3));
    }

    #[test]
    fn integers_of_28_bits_take_4_bytes_until_a_wider_one_comes() {
        let (low, high) = (-(1i64 << 27), (1i64 << 27) - 1);
        for value in [0, 1, -1, low, high] {
            assert!(fits_narrow(value));
            for members in [0u8, 0b1010, 0b1111] {
                let entry = narrow(value, members);
                assert_eq!((narrow_value(entry), (entry & 0x0F) as u8), (value, members));
            }
        }
        assert!(!fits_narrow(low - 1) && !fits_narrow(high + 1));
        let mut set = DistinctValues::seen(2);
        let mut positive = [0i64; 2];
        let mut log = SetLog::default();
        for value in [5, -3, high, low] {
            set.update_int(value, &[true, value > 0], 1, &mut positive, Some(&mut log));
        }
        let DistinctValues::Seen { ints: IntTable::Narrow(_), .. } = &set else { panic!("narrow while all fit") };
        let before = listed(&set, 0);
        // A wider value widens the table; what it held stays, members included.
        set.update_int(high + 1, &[false, true], 1, &mut positive, Some(&mut log));
        set.update_int(-3, &[false, true], 1, &mut positive, Some(&mut log));
        let DistinctValues::Seen { ints: IntTable::Wide(_), .. } = &set else { panic!("wide after a 29-bit value") };
        assert_eq!(positive, [4, 4]);
        assert_eq!(listed(&set, 0), before);
        let mut second: Vec<i64> = [5, -3, high, high + 1].to_vec();
        second.sort_by_key(|v| int(*v));
        assert_eq!(listed(&set, 1), second.into_iter().map(|v| (int(v), 1)).collect::<Vec<_>>());
        // Every change was logged as a wide entry with its members after it.
        let logged: Vec<(i64, u8)> = log.ints.iter().map(|e| (e.value(), e.members())).collect();
        assert_eq!(logged, [(5, 0b11), (-3, 0b01), (high, 0b11), (low, 0b01), (high + 1, 0b10), (-3, 0b11)]);
    }

    #[test]
    fn members_count_their_own_values_through_one_set() {
        let mut set = DistinctValues::counted(2);
        let mut positive = [0i64; 2];
        set.update(b"a", hash(b"a"), &[true, true], 1, &mut positive, None);
        set.update(b"b", hash(b"b"), &[true, false], 1, &mut positive, None);
        set.update(b"a", hash(b"a"), &[true, false], 1, &mut positive, None);
        assert_eq!(positive, [2, 1]);
        assert_eq!(listed(&set, 0), owned(&[(b"a", 2), (b"b", 1)]));
        assert_eq!(listed(&set, 1), owned(&[(b"a", 1)]));
        // Retractions: a value leaves a member at 0, and the set once every count is 0.
        set.update(b"a", hash(b"a"), &[false, true], -1, &mut positive, None);
        assert_eq!(positive, [2, 0]);
        set.update(b"b", hash(b"b"), &[true, false], -1, &mut positive, None);
        assert_eq!(positive, [1, 0]);
        assert_eq!(set.len(), 1);
        // A retraction before its insert is held as a negative count.
        set.update(b"c", hash(b"c"), &[false, true], -1, &mut positive, None);
        assert_eq!((positive, listed(&set, 1)), ([1, 0], owned(&[(b"c", -1)])));
        set.update(b"c", hash(b"c"), &[false, true], 1, &mut positive, None);
        assert_eq!(set.len(), 1, "c is dropped at 0");
        assert_eq!((set.positive(0), set.positive(1)), (1, 0));
    }

    #[test]
    fn over_an_append_only_input_a_value_keeps_only_the_members_that_saw_it() {
        let mut set = DistinctValues::seen(3);
        let mut positive = [0i64; 3];
        set.update(b"a", hash(b"a"), &[true, false, true], 1, &mut positive, None);
        set.update(b"a", hash(b"a"), &[true, true, false], 2, &mut positive, None);
        set.update(b"b", hash(b"b"), &[true, false, false], 1, &mut positive, None);
        assert_eq!(positive, [2, 1, 1]);
        assert_eq!(listed(&set, 0), owned(&[(b"a", 1), (b"b", 1)]), "written as seen once");
        assert_eq!(listed(&set, 1), owned(&[(b"a", 1)]));
        // A value too long for a short entry is kept whole, with its members.
        let long = [7u8; SEEN_SHORT + 1];
        set.update(&long, hash(&long), &[false, true, true], 1, &mut positive, None);
        set.update(&long, hash(&long), &[false, true, false], 1, &mut positive, None);
        assert_eq!(positive, [2, 2, 2]);
        assert_eq!(listed(&set, 2), owned(&[(&long, 1), (b"a", 1)]));
        let mut restored = DistinctValues::seen(3);
        assert!(restored.load(0, b"a", hash(b"a"), 3), "a count of an earlier build reads as seen");
        assert!(!restored.load(0, b"a", hash(b"a"), 1), "a value twice");
        assert!(!restored.load(1, b"c", hash(b"c"), -1), "a retraction where nothing retracts");
        assert_eq!((restored.positive(0), restored.positive(1), restored.len()), (1, 0, 1));
        assert!(restored.load(2, &long, hash(&long), 1) && !restored.load(2, &long, hash(&long), 1));
        assert_eq!((restored.positive(2), restored.len()), (1, 2));
    }

    #[test]
    fn an_integer_read_as_it_is_meets_the_same_integer_encoded() {
        let wide = i64::MAX - 1;
        let mut set = DistinctValues::seen(2);
        let mut positive = [0i64; 2];
        for value in [7, wide, -2] {
            set.update_int(value, &[true, false], 1, &mut positive, None);
        }
        for value in [7, wide, -2, 8] {
            set.update(&int(value), hash(&int(value)), &[true, true], 1, &mut positive, None);
            set.update_int(value, &[false, true], 1, &mut positive, None);
        }
        assert_eq!(positive, [4, 4]);
        assert_eq!((set.len(), listed(&set, 0), listed(&set, 1)), (4, listed(&set, 1), listed(&set, 0)));
        // A value no member counts (every FILTER false) is not kept, read either way.
        set.update_int(9, &[false, false], 1, &mut positive, None);
        set.update(&int(10), hash(&int(10)), &[false, false], 1, &mut positive, None);
        assert_eq!((set.len(), positive), (4, [4, 4]));
    }

    #[test]
    fn a_short_seen_value_is_sixteen_bytes_and_holds_every_length_and_member() {
        assert_eq!(std::mem::size_of::<SeenShort>(), 16);
        for length in 0..=SEEN_SHORT {
            let value: Vec<u8> = (0..length as u8).map(|b| b.wrapping_mul(37) | 0x80).collect();
            let mut entry = SeenShort::new(&value);
            for members in 0..16u8 {
                entry.set_members(members);
                assert_eq!((entry.value(), entry.members()), (&value[..], members));
            }
        }
    }

    #[test]
    fn a_snapshots_entries_load_back_and_a_value_twice_is_refused() {
        let mut set = DistinctValues::counted(2);
        let long = [9u8; 40];
        assert!(set.load(1, &long, hash(&long), 3));
        assert!(set.load(0, b"x", hash(b"x"), -2));
        assert!(set.load(0, &long, hash(&long), 1));
        assert!(!set.load(1, &long, hash(&long), 1));
        assert_eq!((set.positive(0), set.positive(1)), (1, 1));
        assert_eq!(listed(&set, 0), owned(&[(&long, 1), (b"x", -2)]));
    }

    /// A seen set's values come out in the order of their encodings however they are
    /// kept: integers of 28 and 60 bits, wider ones (kept encoded), short and long text.
    #[test]
    fn a_seen_set_lists_its_values_in_the_order_of_their_encodings() {
        let mut set = DistinctValues::seen(2);
        let text = |t: &str| [&[0x06u8][..], t.as_bytes()].concat();
        let mut values: Vec<Vec<u8>> = [-5i64, 0, 3, 256, 1 << 40, -(1 << 50), i64::MAX, i64::MIN, 255]
            .into_iter()
            .map(int)
            .chain([text("a"), text("b"), text(&"long".repeat(10)), text("")])
            .collect();
        for (i, value) in values.iter().enumerate() {
            let counted = [true, i % 2 == 0];
            set.update(value, hash(value), &counted, 1, &mut [0, 0], None);
        }
        let mut listed = Vec::new();
        set.each_seen_in_order(|value, members| {
            listed.push((value.to_vec(), members));
            Ok(())
        })
        .expect("listed");
        values.sort();
        assert_eq!(listed.iter().map(|(value, _)| value.clone()).collect::<Vec<_>>(), values);
        assert!(listed.iter().all(|(_, members)| *members == 0b01 || *members == 0b11));
    }
}
