//! `own`: a minimal prototype of "the project's own sorted runs".
//!
//! * memtable: `BTreeMap<Vec<u8>, Option<Vec<u8>>>` (a tombstone is `None`), flushed to an
//!   immutable run file once its accounted size passes `memtable_bytes`;
//! * run file: data blocks of ~`block_bytes` of records `klen u16, vlen u32 (u32::MAX =
//!   tombstone), key, value`, then the block index, the bloom filter, the range tombstones
//!   and a 40-byte footer. The index (first key + offset + length per block) and the bloom
//!   filter (~10 bits per key, or per key prefix of `bloom_prefix` bytes) stay in memory;
//! * point lookup: memtable, then runs newest first (bloom, index binary search, one pread);
//! * prefix scan: a k-way merge over the memtable and every run (newest wins, tombstones hide);
//! * `delete_prefix(P)`: removes P's keys from the memtable and records a range tombstone
//!   that hides P's keys in every older run; it travels with the run the memtable becomes and
//!   is dropped when a compaction reaches the oldest run;
//! * compaction: once there are more than `max_runs` runs, merge runs into one — either all
//!   of them (`full`) or a size-tiered suffix: the newest runs, leaving out each oldest run
//!   that is larger than all newer ones together (`tiered`);
//! * checkpoint: flush the memtable (fsync) and write a manifest naming the live runs. The run
//!   files written since the previous checkpoint are what an incremental checkpoint uploads.
//!
//! Memory: memtable (accounted key + value + 64 bytes per entry) + indexes + blooms + an
//! optional block cache of `cache_bytes` (FIFO).

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: u64 = 0x534c_5549_4345_5231; // "SLUICER1"
const TOMB: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct OwnConfig {
    pub memtable_bytes: usize,
    pub block_bytes: usize,
    pub bloom_bits_per_key: usize,
    /// Bloom over the first N bytes of each key (a prefix bloom, usable by prefix scans whose
    /// prefix has at least N bytes), or over whole keys when None.
    pub bloom_prefix: Option<usize>,
    pub max_runs: usize,
    pub tiered: bool,
    pub cache_bytes: usize,
}

fn hash64(b: &[u8]) -> u64 {
    // A small multiply-xorshift hash over 8-byte words (keys here are <= 32 bytes).
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ (b.len() as u64);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        h = (h ^ w).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 32;
    }
    let mut last = [0u8; 8];
    let r = chunks.remainder();
    last[..r.len()].copy_from_slice(r);
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^= h >> 29;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

struct Bloom {
    bits: Vec<u64>,
    nbits: u64,
    k: u32,
}

impl Bloom {
    fn new(n: usize, bits_per_key: usize) -> Bloom {
        let nbits = ((n.max(1) * bits_per_key) as u64).max(64);
        let words = nbits.div_ceil(64) as usize;
        Bloom { bits: vec![0; words], nbits: words as u64 * 64, k: 7 }
    }
    fn add(&mut self, key: &[u8]) {
        let h = hash64(key);
        let (mut a, b) = (h, (h >> 33) | 1);
        for _ in 0..self.k {
            let bit = a % self.nbits;
            self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
            a = a.wrapping_add(b);
        }
    }
    fn may_contain(&self, key: &[u8]) -> bool {
        let h = hash64(key);
        let (mut a, b) = (h, (h >> 33) | 1);
        for _ in 0..self.k {
            let bit = a % self.nbits;
            if self.bits[(bit / 64) as usize] & (1 << (bit % 64)) == 0 {
                return false;
            }
            a = a.wrapping_add(b);
        }
        true
    }
}

/// Range tombstones: key prefixes, looked up by each distinct prefix length.
#[derive(Default)]
struct Tombs {
    set: BTreeSet<Vec<u8>>,
    lens: BTreeSet<usize>,
}

impl Tombs {
    fn insert(&mut self, p: Vec<u8>) {
        self.lens.insert(p.len());
        self.set.insert(p);
    }
    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
    fn len(&self) -> usize {
        self.set.len()
    }
    /// Some tombstone is a prefix of `key`.
    fn covers(&self, key: &[u8]) -> bool {
        !self.set.is_empty() && self.lens.iter().any(|&l| l <= key.len() && self.set.contains(&key[..l]))
    }
    /// Tombstones longer than `p` that start with `p`.
    fn under<'a>(&'a self, p: &'a [u8]) -> impl Iterator<Item = &'a Vec<u8>> + 'a {
        self.set.range(p.to_vec()..).take_while(move |t| t.starts_with(p)).filter(move |t| t.len() > p.len())
    }
}

struct Run {
    id: u64,
    file: File,
    path: PathBuf,
    /// (first key, offset, length) per block.
    index: Vec<(Vec<u8>, u64, u32)>,
    bloom: Bloom,
    /// Range tombstones: prefixes whose keys in OLDER runs are deleted.
    range_tombs: Tombs,
    bytes: u64,
    nkeys: u64,
}

impl Run {
    fn mem_bytes(&self) -> usize {
        self.index.iter().map(|(k, _, _)| k.len() + 40).sum::<usize>()
            + self.bloom.bits.len() * 8
            + self.range_tombs.set.iter().map(|p| p.len() + 48).sum::<usize>()
    }
    /// The block that may hold `key` (the last block whose first key <= key).
    fn block_for(&self, key: &[u8]) -> usize {
        let p = self.index.partition_point(|(k, _, _)| k.as_slice() <= key);
        p.saturating_sub(1)
    }
    fn covered(&self, key: &[u8]) -> bool {
        self.range_tombs.covers(key)
    }
}

/// Records of one block, parsed lazily.
fn parse_block(buf: &[u8], mut f: impl FnMut(&[u8], Option<&[u8]>) -> bool) {
    let mut i = 0;
    while i + 6 <= buf.len() {
        let kl = u16::from_le_bytes([buf[i], buf[i + 1]]) as usize;
        let vl = u32::from_le_bytes(buf[i + 2..i + 6].try_into().unwrap());
        i += 6;
        let key = &buf[i..i + kl];
        i += kl;
        let val = if vl == TOMB {
            None
        } else {
            let v = &buf[i..i + vl as usize];
            i += vl as usize;
            Some(v)
        };
        if !f(key, val) {
            return;
        }
    }
}

struct RunWriter {
    w: BufWriter<File>,
    path: PathBuf,
    block: Vec<u8>,
    block_first: Option<Vec<u8>>,
    off: u64,
    index: Vec<(Vec<u8>, u64, u32)>,
    /// Built as keys come, sized for the expected key count (an upper bound).
    bloom: Bloom,
    nkeys: u64,
    last_prefix: Vec<u8>,
    cfg: OwnConfig,
}

impl RunWriter {
    fn new(path: PathBuf, cfg: &OwnConfig, expected_keys: usize) -> RunWriter {
        let f = File::create(&path).expect("create run");
        RunWriter {
            w: BufWriter::with_capacity(1 << 20, f),
            path,
            block: Vec::with_capacity(cfg.block_bytes + 4096),
            block_first: None,
            off: 0,
            index: Vec::new(),
            bloom: Bloom::new(expected_keys, cfg.bloom_bits_per_key),
            nkeys: 0,
            last_prefix: Vec::new(),
            cfg: cfg.clone(),
        }
    }
    fn add(&mut self, key: &[u8], val: Option<&[u8]>) {
        if self.block_first.is_none() {
            self.block_first = Some(key.to_vec());
        }
        self.block.extend_from_slice(&(key.len() as u16).to_le_bytes());
        match val {
            Some(v) => self.block.extend_from_slice(&(v.len() as u32).to_le_bytes()),
            None => self.block.extend_from_slice(&TOMB.to_le_bytes()),
        }
        self.block.extend_from_slice(key);
        if let Some(v) = val {
            self.block.extend_from_slice(v);
        }
        // Bloom input: whole key or its prefix (each distinct prefix once; keys are sorted).
        let bk = match self.cfg.bloom_prefix {
            Some(n) => &key[..n.min(key.len())],
            None => key,
        };
        if self.cfg.bloom_prefix.is_none() || self.last_prefix != bk {
            self.bloom.add(bk);
            self.nkeys += 1;
            if self.cfg.bloom_prefix.is_some() {
                self.last_prefix.clear();
                self.last_prefix.extend_from_slice(bk);
            }
        }
        if self.block.len() >= self.cfg.block_bytes {
            self.finish_block();
        }
    }
    fn finish_block(&mut self) {
        if let Some(first) = self.block_first.take() {
            self.w.write_all(&self.block).unwrap();
            self.index.push((first, self.off, self.block.len() as u32));
            self.off += self.block.len() as u64;
            self.block.clear();
        }
    }
    /// Writes index, bloom, range tombstones and footer; fsyncs; returns the run.
    fn finish(mut self, id: u64, range_tombs: Tombs) -> Option<Run> {
        self.finish_block();
        if self.index.is_empty() && range_tombs.is_empty() {
            drop(self.w);
            let _ = fs::remove_file(&self.path);
            return None;
        }
        let bloom = std::mem::replace(&mut self.bloom, Bloom::new(0, 1));
        let index_off = self.off;
        let mut meta = Vec::new();
        meta.extend_from_slice(&(self.index.len() as u32).to_le_bytes());
        for (k, off, len) in &self.index {
            meta.extend_from_slice(&(k.len() as u16).to_le_bytes());
            meta.extend_from_slice(k);
            meta.extend_from_slice(&off.to_le_bytes());
            meta.extend_from_slice(&len.to_le_bytes());
        }
        let bloom_off = index_off + meta.len() as u64;
        meta.extend_from_slice(&bloom.nbits.to_le_bytes());
        for w in &bloom.bits {
            meta.extend_from_slice(&w.to_le_bytes());
        }
        let rt_off = index_off + meta.len() as u64;
        meta.extend_from_slice(&(range_tombs.len() as u32).to_le_bytes());
        for p in &range_tombs.set {
            meta.extend_from_slice(&(p.len() as u16).to_le_bytes());
            meta.extend_from_slice(p);
        }
        for x in [index_off, bloom_off, rt_off, self.nkeys, MAGIC] {
            meta.extend_from_slice(&x.to_le_bytes());
        }
        self.w.write_all(&meta).unwrap();
        let file = self.w.into_inner().expect("flush run");
        file.sync_data().unwrap();
        let bytes = index_off + meta.len() as u64;
        drop(file);
        let file = File::open(&self.path).unwrap();
        Some(Run { id, file, path: self.path, index: self.index, bloom, range_tombs, bytes, nkeys: self.nkeys })
    }
}

fn load_run(path: &Path, id: u64) -> Run {
    let file = File::open(path).expect("open run");
    let len = file.metadata().unwrap().len();
    let mut foot = [0u8; 40];
    file.read_exact_at(&mut foot, len - 40).unwrap();
    let w = |i: usize| u64::from_le_bytes(foot[i * 8..i * 8 + 8].try_into().unwrap());
    let (index_off, bloom_off, rt_off, nkeys, magic) = (w(0), w(1), w(2), w(3), w(4));
    assert_eq!(magic, MAGIC, "{} is not a run file", path.display());
    let mut meta = vec![0u8; (len - 40 - index_off) as usize];
    file.read_exact_at(&mut meta, index_off).unwrap();
    let mut i = 0usize;
    let rd = |i: &mut usize, n: usize| -> &[u8] {
        let s = &meta[*i..*i + n];
        *i += n;
        s
    };
    let n = u32::from_le_bytes(rd(&mut i, 4).try_into().unwrap()) as usize;
    let mut index = Vec::with_capacity(n);
    for _ in 0..n {
        let kl = u16::from_le_bytes(rd(&mut i, 2).try_into().unwrap()) as usize;
        let k = rd(&mut i, kl).to_vec();
        let off = u64::from_le_bytes(rd(&mut i, 8).try_into().unwrap());
        let l = u32::from_le_bytes(rd(&mut i, 4).try_into().unwrap());
        index.push((k, off, l));
    }
    debug_assert_eq!(i as u64, bloom_off - index_off);
    let nbits = u64::from_le_bytes(rd(&mut i, 8).try_into().unwrap());
    let bits = (0..nbits / 64)
        .map(|_| u64::from_le_bytes(rd(&mut i, 8).try_into().unwrap()))
        .collect();
    debug_assert_eq!(i as u64, rt_off - index_off);
    let nr = u32::from_le_bytes(rd(&mut i, 4).try_into().unwrap()) as usize;
    let mut range_tombs = Tombs::default();
    for _ in 0..nr {
        let l = u16::from_le_bytes(rd(&mut i, 2).try_into().unwrap()) as usize;
        range_tombs.insert(rd(&mut i, l).to_vec());
    }
    Run {
        id,
        file,
        path: path.to_path_buf(),
        index,
        bloom: Bloom { bits, nbits, k: 7 },
        range_tombs,
        bytes: len,
        nkeys,
    }
}

/// A FIFO block cache bounded in bytes.
struct BlockCache {
    cap: usize,
    used: usize,
    map: HashMap<(u64, u32), Arc<Vec<u8>>>,
    order: VecDeque<(u64, u32)>,
}

impl BlockCache {
    fn get(&self, k: (u64, u32)) -> Option<Arc<Vec<u8>>> {
        self.map.get(&k).cloned()
    }
    fn put(&mut self, k: (u64, u32), b: Arc<Vec<u8>>) {
        if self.cap == 0 || b.len() > self.cap {
            return;
        }
        self.used += b.len();
        if let Some(old) = self.map.insert(k, b) {
            self.used -= old.len();
        } else {
            self.order.push_back(k);
        }
        while self.used > self.cap {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(b) = self.map.remove(&old) {
                self.used -= b.len();
            }
        }
    }
}

pub struct Own {
    dir: PathBuf,
    cfg: OwnConfig,
    mem: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    mem_bytes: usize,
    /// Range tombstones made since the last flush (apply to all runs).
    mem_range_tombs: Tombs,
    /// Newest first.
    runs: Vec<Run>,
    next_id: u64,
    cache: BlockCache,
    pub compactions: u64,
    pub compaction_secs: f64,
}

impl Own {
    /// Opens (or creates) a store in `dir`, loading the runs its MANIFEST names.
    pub fn open(dir: &Path, cfg: OwnConfig) -> Own {
        fs::create_dir_all(dir).unwrap();
        let mut runs = Vec::new();
        let mut next_id = 1;
        if let Ok(m) = fs::read_to_string(dir.join("MANIFEST")) {
            for line in m.lines().filter(|l| !l.is_empty()) {
                let id: u64 = line.trim_end_matches(".run").parse().unwrap();
                runs.push(load_run(&dir.join(line), id));
                next_id = next_id.max(id + 1);
            }
        }
        let cache = BlockCache { cap: cfg.cache_bytes, used: 0, map: HashMap::new(), order: VecDeque::new() };
        Own {
            dir: dir.to_path_buf(),
            cfg,
            mem: BTreeMap::new(),
            mem_bytes: 0,
            mem_range_tombs: Tombs::default(),
            runs,
            next_id,
            cache,
            compactions: 0,
            compaction_secs: 0.0,
        }
    }

    pub fn mem_bytes(&self) -> usize {
        self.mem_bytes + self.runs.iter().map(Run::mem_bytes).sum::<usize>() + self.cache.used
    }
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    fn mem_insert(&mut self, k: &[u8], v: Option<&[u8]>) {
        let add = k.len() + v.map_or(0, |v| v.len()) + 64;
        match self.mem.get_mut(k) {
            Some(slot) => {
                self.mem_bytes -= slot.as_ref().map_or(0, |v| v.len());
                self.mem_bytes += v.map_or(0, |v| v.len());
                *slot = v.map(|v| v.to_vec());
            }
            None => {
                self.mem.insert(k.to_vec(), v.map(|v| v.to_vec()));
                self.mem_bytes += add;
            }
        }
        if self.mem_bytes >= self.cfg.memtable_bytes {
            self.flush();
        }
    }

    pub fn put(&mut self, k: &[u8], v: &[u8]) {
        self.mem_insert(k, Some(v));
    }
    pub fn delete(&mut self, k: &[u8]) {
        self.mem_insert(k, None);
    }

    pub fn delete_prefix(&mut self, p: &[u8]) {
        let keys: Vec<Vec<u8>> = self.mem.range(p.to_vec()..).take_while(|(k, _)| k.starts_with(p)).map(|(k, _)| k.clone()).collect();
        for k in keys {
            let v = self.mem.remove(&k).unwrap();
            self.mem_bytes -= k.len() + v.map_or(0, |v| v.len()) + 64;
        }
        // A range tombstone is needed only if some run may hold keys with this prefix.
        let needed = self.runs.iter().any(|r| self.run_may_have_prefix(r, p));
        if needed {
            self.mem_bytes += p.len() + 48;
            self.mem_range_tombs.insert(p.to_vec());
        }
    }

    fn run_may_have_prefix(&self, r: &Run, p: &[u8]) -> bool {
        if let Some(n) = self.cfg.bloom_prefix
            && p.len() >= n
            && !r.bloom.may_contain(&p[..n])
        {
            return false;
        }
        // Key range check against the index: first key of the block holding p and after.
        if r.index.is_empty() {
            return false;
        }
        true
    }

    fn mem_covered(&self, key: &[u8]) -> bool {
        self.mem_range_tombs.covers(key)
    }

    fn read_block(&mut self, ri: usize, bi: usize) -> Arc<Vec<u8>> {
        let r = &self.runs[ri];
        let ck = (r.id, bi as u32);
        if let Some(b) = self.cache.get(ck) {
            return b;
        }
        let (_, off, len) = r.index[bi];
        let mut buf = vec![0u8; len as usize];
        r.file.read_exact_at(&mut buf, off).unwrap();
        let b = Arc::new(buf);
        self.cache.put(ck, b.clone());
        b
    }

    pub fn get(&mut self, k: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.mem.get(k) {
            return v.clone();
        }
        if self.mem_covered(k) {
            return None;
        }
        for ri in 0..self.runs.len() {
            let r = &self.runs[ri];
            let bk = match self.cfg.bloom_prefix {
                Some(n) => &k[..n.min(k.len())],
                None => k,
            };
            if !r.index.is_empty() && r.bloom.may_contain(bk) {
                let bi = r.block_for(k);
                let block = self.read_block(ri, bi);
                let mut found: Option<Option<Vec<u8>>> = None;
                parse_block(&block, |key, val| {
                    if key == k {
                        found = Some(val.map(|v| v.to_vec()));
                        return false;
                    }
                    key < k
                });
                if let Some(v) = found {
                    return v;
                }
            }
            if self.runs[ri].covered(k) {
                return None;
            }
        }
        None
    }

    /// Calls `f` for each live key with prefix `p` in key order; returns the count.
    pub fn scan_prefix(&mut self, p: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        // Sources: 0 = memtable, 1 + i = run i (newest first). Each source yields sorted
        // (key, value) for keys with prefix p; a run source is hidden for keys under the range
        // tombstones of the memtable or of newer runs.
        let mut srcs: Vec<Vec<(Vec<u8>, Option<Vec<u8>>)>> = Vec::with_capacity(1 + self.runs.len());
        srcs.push(self.mem.range(p.to_vec()..).take_while(|(k, _)| k.starts_with(p)).map(|(k, v)| (k.clone(), v.clone())).collect());
        // Tombstones that cover the whole prefix p hide every older source at once.
        let mut hidden_from = usize::MAX; // runs with index >= this are fully hidden
        if self.mem_range_tombs.covers(p) {
            hidden_from = 0;
        }
        for ri in 0..self.runs.len() {
            if ri >= hidden_from {
                break;
            }
            let mut out = Vec::new();
            let r = &self.runs[ri];
            let skip = r.index.is_empty() || !self.run_may_have_prefix(r, p);
            if !skip {
                let mut bi = r.block_for(p);
                let nblocks = r.index.len();
                loop {
                    let block = self.read_block(ri, bi);
                    let mut done = false;
                    parse_block(&block, |key, val| {
                        if key < p {
                            return true;
                        }
                        if !key.starts_with(p) {
                            done = true;
                            return false;
                        }
                        out.push((key.to_vec(), val.map(|v| v.to_vec())));
                        true
                    });
                    bi += 1;
                    if done || bi >= nblocks {
                        break;
                    }
                }
            }
            srcs.push(out);
            if self.runs[ri].range_tombs.covers(p) {
                hidden_from = ri + 1;
            }
        }
        // Partial tombstones (longer than p): collected with the source index they hide from.
        let mut partial: Vec<(usize, Vec<u8>)> = Vec::new();
        for t in self.mem_range_tombs.under(p) {
            partial.push((1, t.clone()));
        }
        for (ri, r) in self.runs.iter().enumerate() {
            for t in r.range_tombs.under(p) {
                partial.push((ri + 2, t.clone()));
            }
        }
        // k-way merge; heap of (Reverse(key), Reverse(source)).
        let mut pos = vec![0usize; srcs.len()];
        let mut heap = BinaryHeap::new();
        for (s, v) in srcs.iter().enumerate() {
            if !v.is_empty() {
                heap.push(std::cmp::Reverse((v[0].0.clone(), s)));
            }
        }
        let mut n = 0;
        let mut last: Option<Vec<u8>> = None;
        while let Some(std::cmp::Reverse((key, s))) = heap.pop() {
            let (_, ref val) = srcs[s][pos[s]];
            pos[s] += 1;
            if pos[s] < srcs[s].len() {
                heap.push(std::cmp::Reverse((srcs[s][pos[s]].0.clone(), s)));
            }
            if last.as_deref() == Some(key.as_slice()) {
                continue; // an older version
            }
            last = Some(key.clone());
            if partial.iter().any(|(from, t)| s >= *from && key.starts_with(t)) {
                continue;
            }
            if let Some(v) = val {
                f(&key, v);
                n += 1;
            }
        }
        n
    }

    /// Flushes the memtable to a new run (fsynced); compacts if there are too many runs.
    pub fn flush(&mut self) {
        if self.mem.is_empty() && self.mem_range_tombs.is_empty() {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut w = RunWriter::new(self.dir.join(format!("{id:08}.run")), &self.cfg, self.mem.len());
        let mem = std::mem::take(&mut self.mem);
        for (k, v) in &mem {
            // With no older runs, tombstones need not be written.
            if v.is_none() && self.runs.is_empty() {
                continue;
            }
            w.add(k, v.as_deref());
        }
        drop(mem);
        let rts = std::mem::take(&mut self.mem_range_tombs);
        self.mem_bytes = 0;
        if let Some(run) = w.finish(id, rts) {
            self.runs.insert(0, run);
        }
        if self.runs.len() > self.cfg.max_runs {
            self.compact();
        }
    }

    fn compact(&mut self) {
        let t0 = std::time::Instant::now();
        // Choose the newest runs to merge: all (full), or leave out each oldest run larger
        // than all the newer ones together (tiered).
        let mut n = self.runs.len();
        if self.cfg.tiered {
            while n > 2 {
                let newer: u64 = self.runs[..n - 1].iter().map(|r| r.bytes).sum();
                if self.runs[n - 1].bytes > newer {
                    n -= 1;
                } else {
                    break;
                }
            }
        }
        let bottom = n == self.runs.len();
        let id = self.next_id;
        self.next_id += 1;
        let expected: u64 = self.runs[..n].iter().map(|r| r.nkeys).sum();
        let mut w = RunWriter::new(self.dir.join(format!("{id:08}.run")), &self.cfg, expected as usize);
        // Streaming k-way merge over the chosen runs, one block of each in memory at a time.
        struct Cur {
            block: Vec<(Vec<u8>, Option<Vec<u8>>)>,
            pos: usize,
            bi: usize,
        }
        let mut curs: Vec<Cur> = Vec::new();
        let load = |run: &Run, bi: usize| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
            let (_, off, len) = run.index[bi];
            let mut buf = vec![0u8; len as usize];
            run.file.read_exact_at(&mut buf, off).unwrap();
            let mut v = Vec::new();
            parse_block(&buf, |k, val| {
                v.push((k.to_vec(), val.map(|x| x.to_vec())));
                true
            });
            v
        };
        let mut heap = BinaryHeap::new();
        for (s, r) in self.runs[..n].iter().enumerate() {
            let block = if r.index.is_empty() { Vec::new() } else { load(r, 0) };
            if !block.is_empty() {
                heap.push(std::cmp::Reverse((block[0].0.clone(), s)));
            }
            curs.push(Cur { block, pos: 0, bi: 0 });
        }
        let mut last: Option<Vec<u8>> = None;
        while let Some(std::cmp::Reverse((key, s))) = heap.pop() {
            let c = &mut curs[s];
            let val = std::mem::take(&mut c.block[c.pos].1);
            c.pos += 1;
            if c.pos >= c.block.len() {
                c.bi += 1;
                c.pos = 0;
                c.block = if c.bi < self.runs[s].index.len() { load(&self.runs[s], c.bi) } else { Vec::new() };
            }
            if !c.block.is_empty() {
                heap.push(std::cmp::Reverse((c.block[c.pos].0.clone(), s)));
            }
            if last.as_deref() == Some(key.as_slice()) {
                continue;
            }
            last = Some(key.clone());
            // Hidden by a range tombstone of a newer merged run?
            if self.runs[..s].iter().any(|r| r.covered(&key)) {
                continue;
            }
            if val.is_none() && bottom {
                continue;
            }
            w.add(&key, val.as_deref());
        }
        let mut rts = Tombs::default();
        if !bottom {
            for r in &self.runs[..n] {
                for t in &r.range_tombs.set {
                    rts.insert(t.clone());
                }
            }
        }
        let new = w.finish(id, rts);
        let old: Vec<Run> = self.runs.drain(..n).collect();
        if let Some(r) = new {
            self.runs.insert(0, r);
        }
        // Old files are deleted here; with incremental checkpoints they would instead be
        // garbage-collected once no retained manifest names them.
        for r in old {
            self.cache.map.retain(|(id, _), _| *id != r.id);
            let _ = fs::remove_file(&r.path);
        }
        self.cache.used = self.cache.map.values().map(|b| b.len()).sum();
        self.cache.order.retain(|k| self.cache.map.contains_key(k));
        self.compactions += 1;
        self.compaction_secs += t0.elapsed().as_secs_f64();
    }

    /// Flush + manifest (fsynced). Returns the names of the live run files.
    pub fn checkpoint(&mut self) -> Vec<String> {
        self.flush();
        let names: Vec<String> = self.runs.iter().map(|r| format!("{:08}.run", r.id)).collect();
        let tmp = self.dir.join("MANIFEST.tmp");
        let mut f = File::create(&tmp).unwrap();
        f.write_all(names.join("\n").as_bytes()).unwrap();
        f.sync_data().unwrap();
        fs::rename(&tmp, self.dir.join("MANIFEST")).unwrap();
        names
    }
}
