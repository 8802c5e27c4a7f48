//! One trait over the three candidates.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::own::{Own, OwnConfig};

pub trait Engine {
    fn put(&mut self, k: &[u8], v: &[u8]);
    fn get(&mut self, k: &[u8]) -> Option<Vec<u8>>;
    fn delete(&mut self, k: &[u8]);
    /// Deletes every key that starts with `p`.
    fn delete_prefix(&mut self, p: &[u8]);
    /// Calls `f` for each key with prefix `p`, in key order; returns the number of keys.
    fn scan_prefix(&mut self, p: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize;
    /// Makes everything written so far durable as a checkpoint. Returns an id if the engine
    /// has a notion of one.
    fn checkpoint(&mut self) -> String;
    /// A one-line description of the engine's state (run counts, memory accounting).
    fn describe(&mut self) -> String;
    /// How delete_prefix is done.
    fn delete_prefix_kind(&self) -> &'static str;
    /// Called at the end of a workload.
    fn close(&mut self) {}
    /// Reads `k` as of the checkpoint before the latest one, read-only.
    fn read_at_previous_checkpoint(&mut self, _k: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Err("not implemented".into())
    }
}

/// Tracks the files under a directory between checkpoints: new files, files grown in place,
/// files removed.
pub struct DirTracker {
    root: PathBuf,
    seen: HashMap<PathBuf, u64>,
}

#[derive(Debug, Default, Clone)]
pub struct DirDelta {
    pub new_files: usize,
    pub new_bytes: u64,
    /// Files that existed and changed size (appended or rewritten in place).
    pub changed_files: usize,
    pub changed_bytes: u64,
    pub removed_files: usize,
    pub removed_bytes: u64,
    pub total_files: usize,
    pub total_bytes: u64,
    /// New bytes per top-level subdirectory (relative path's first component).
    pub new_by_dir: Vec<(String, u64)>,
}

pub fn walk(root: &Path) -> HashMap<PathBuf, u64> {
    let mut out = HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path(), md.len());
            }
        }
    }
    out
}

pub fn dir_bytes(root: &Path) -> u64 {
    walk(root).values().sum()
}

impl DirTracker {
    pub fn new(root: &Path) -> DirTracker {
        DirTracker { root: root.to_path_buf(), seen: walk(root) }
    }
    pub fn delta(&mut self) -> DirDelta {
        let now = walk(&self.root);
        let mut d = DirDelta::default();
        let mut by: HashMap<String, u64> = HashMap::new();
        for (p, &len) in &now {
            match self.seen.get(p) {
                None => {
                    d.new_files += 1;
                    d.new_bytes += len;
                    let rel = p.strip_prefix(&self.root).unwrap_or(p);
                    let top = rel
                        .parent()
                        .map(|x| x.to_string_lossy().to_string())
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| ".".into());
                    *by.entry(top).or_default() += len;
                }
                Some(&old) if old != len => {
                    d.changed_files += 1;
                    d.changed_bytes += len.saturating_sub(old);
                }
                _ => {}
            }
        }
        for (p, &len) in &self.seen {
            if !now.contains_key(p) {
                d.removed_files += 1;
                d.removed_bytes += len;
            }
        }
        d.total_files = now.len();
        d.total_bytes = now.values().sum();
        let mut v: Vec<(String, u64)> = by.into_iter().collect();
        v.sort();
        d.new_by_dir = v;
        self.seen = now;
        d
    }
}

// ---------------------------------------------------------------- own

pub struct OwnEngine(pub Own);

impl Engine for OwnEngine {
    fn put(&mut self, k: &[u8], v: &[u8]) {
        self.0.put(k, v)
    }
    fn get(&mut self, k: &[u8]) -> Option<Vec<u8>> {
        self.0.get(k)
    }
    fn delete(&mut self, k: &[u8]) {
        self.0.delete(k)
    }
    fn delete_prefix(&mut self, p: &[u8]) {
        self.0.delete_prefix(p)
    }
    fn scan_prefix(&mut self, p: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        self.0.scan_prefix(p, f)
    }
    fn checkpoint(&mut self) -> String {
        let names = self.0.checkpoint();
        format!("{} runs", names.len())
    }
    fn describe(&mut self) -> String {
        format!(
            "runs={} accounted_mem={}MiB compactions={} compaction_s={:.1}",
            self.0.run_count(),
            self.0.mem_bytes() >> 20,
            self.0.compactions,
            self.0.compaction_secs
        )
    }
    fn delete_prefix_kind(&self) -> &'static str {
        "range tombstone (memtable keys removed; tombstone kept only if a run may hold the prefix)"
    }
}

pub fn open_own(dir: &Path, budget_mib: usize, bloom_prefix: Option<usize>, tiered: bool) -> OwnEngine {
    // Budget split: memtable 1/2, block cache 1/8; index + blooms take the rest.
    let b = budget_mib << 20;
    OwnEngine(Own::open(
        dir,
        OwnConfig {
            memtable_bytes: b / 2,
            block_bytes: 32 << 10,
            bloom_bits_per_key: 10,
            bloom_prefix,
            max_runs: 8,
            tiered,
            cache_bytes: b / 8,
        },
    ))
}

// ---------------------------------------------------------------- fjall

pub struct FjallEngine {
    pub db: fjall::Database,
    pub ks: fjall::Keyspace,
}

pub fn open_fjall(dir: &Path, budget_mib: u64) -> FjallEngine {
    // Budget split: block cache 5/8, memtable 1/8 (a keyspace may hold one sealed memtable
    // waiting for its flush besides the active one, so 2/8 in the worst case).
    let b = budget_mib << 20;
    let db = fjall::Database::builder(dir)
        .cache_size(b * 5 / 8)
        .open()
        .expect("open fjall");
    let ks = db
        .keyspace("state", || fjall::KeyspaceCreateOptions::default().max_memtable_size(b / 8))
        .expect("keyspace");
    FjallEngine { db, ks }
}

impl Engine for FjallEngine {
    fn put(&mut self, k: &[u8], v: &[u8]) {
        self.ks.insert(k, v).unwrap();
    }
    fn get(&mut self, k: &[u8]) -> Option<Vec<u8>> {
        self.ks.get(k).unwrap().map(|v| v.to_vec())
    }
    fn delete(&mut self, k: &[u8]) {
        self.ks.remove(k).unwrap();
    }
    fn delete_prefix(&mut self, p: &[u8]) {
        // fjall 3 has no range tombstone in its public API: scan + remove each key.
        let keys: Vec<_> = self.ks.prefix(p).map(|g| g.key().unwrap()).collect();
        for k in keys {
            self.ks.remove(k).unwrap();
        }
    }
    fn scan_prefix(&mut self, p: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        let mut n = 0;
        for g in self.ks.prefix(p) {
            let (k, v) = g.into_inner().unwrap();
            f(&k, &v);
            n += 1;
        }
        n
    }
    fn checkpoint(&mut self) -> String {
        // Public API: `persist` fsyncs the journal. To turn the memtable into an immutable
        // table file we also call `rotate_memtable_and_wait` (public but #[doc(hidden)],
        // "used in tests").
        self.ks.rotate_memtable_and_wait().unwrap();
        self.db.persist(fjall::PersistMode::SyncAll).unwrap();
        format!("tables={} l0={} journals={}", self.ks.table_count(), self.ks.l0_table_count(), self.db.journal_count())
    }
    fn describe(&mut self) -> String {
        format!(
            "tables={} l0={} journals={} cache_size={}MiB write_buffer={}MiB compactions={}",
            self.ks.table_count(),
            self.ks.l0_table_count(),
            self.db.journal_count(),
            self.db.cache_size() >> 20,
            self.db.write_buffer_size() >> 20,
            self.db.compactions_completed()
        )
    }
    fn delete_prefix_kind(&self) -> &'static str {
        "scan + remove per key (no public range tombstone)"
    }
    fn read_at_previous_checkpoint(&mut self, _k: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Err("fjall 3 has no checkpoint, backup or read-at-snapshot-after-reopen API; a snapshot lives only in the open process".into())
    }
}

// ---------------------------------------------------------------- slatedb

pub struct SlateEngine {
    pub rt: tokio::runtime::Runtime,
    pub db: slatedb::Db,
    pub path: String,
    pub store: Arc<dyn object_store::ObjectStore>,
    pub checkpoints: Vec<slatedb::CheckpointCreateResult>,
}

pub fn slate_store(dir: &Path) -> Arc<dyn object_store::ObjectStore> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local fs"))
}

pub fn open_slate(dir: &Path, budget_mib: u64) -> SlateEngine {
    use slatedb::config::Settings;
    use slatedb::db_cache::moka::{MokaCache, MokaCacheOptions};
    use slatedb::db_cache::SplitCache;
    let b = budget_mib << 20;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = slate_store(dir);
    // Budget split: block cache 3/8, meta cache (index + filters) 1/8, memtable (L0 SST size)
    // 1/8, unflushed bytes before backpressure 2/8 (includes the memtable being flushed).
    let settings = Settings {
        flush_interval: None,
        wal_enabled: false,
        l0_sst_size_bytes: (b / 8) as usize,
        max_unflushed_bytes: (b * 2 / 8) as usize,
        ..Settings::default()
    };
    let cache = Arc::new(
        SplitCache::new()
            .with_block_cache(Some(Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
                max_capacity: b * 3 / 8,
                ..Default::default()
            }))))
            .with_meta_cache(Some(Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
                max_capacity: b / 8,
                ..Default::default()
            }))))
            .build(),
    );
    let path = "db".to_string();
    let db = rt
        .block_on(slatedb::Db::builder(path.clone(), store.clone()).with_settings(settings).with_db_cache(cache, 1).build())
        .expect("open slatedb");
    SlateEngine { rt, db, path, store, checkpoints: Vec::new() }
}

impl Engine for SlateEngine {
    fn put(&mut self, k: &[u8], v: &[u8]) {
        self.rt.block_on(self.db.put(k, v)).unwrap();
    }
    fn get(&mut self, k: &[u8]) -> Option<Vec<u8>> {
        self.rt.block_on(self.db.get(k)).unwrap().map(|b| b.to_vec())
    }
    fn delete(&mut self, k: &[u8]) {
        self.rt.block_on(self.db.delete(k)).unwrap();
    }
    fn delete_prefix(&mut self, p: &[u8]) {
        // slatedb 0.18 has no range delete: scan + delete each key (in one write batch).
        let db = &self.db;
        self.rt.block_on(async {
            let mut it = db.scan_prefix(p, ..).await.unwrap();
            let mut batch = slatedb::WriteBatch::new();
            let mut n = 0;
            while let Some(kv) = it.next().await.unwrap() {
                batch.delete(&kv.key);
                n += 1;
            }
            if n > 0 {
                db.write(batch).await.unwrap();
            }
        });
    }
    fn scan_prefix(&mut self, p: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        let db = &self.db;
        self.rt.block_on(async {
            let mut it = db.scan_prefix(p, ..).await.unwrap();
            let mut n = 0;
            while let Some(kv) = it.next().await.unwrap() {
                f(&kv.key, &kv.value);
                n += 1;
            }
            n
        })
    }
    fn checkpoint(&mut self) -> String {
        use slatedb::config::{CheckpointOptions, CheckpointScope};
        let r = self
            .rt
            .block_on(self.db.create_checkpoint(CheckpointScope::All, &CheckpointOptions::default()))
            .unwrap();
        let s = format!("checkpoint={} manifest={}", r.id, r.manifest_id);
        self.checkpoints.push(r);
        s
    }
    fn describe(&mut self) -> String {
        let m = self.db.manifest();
        let dbg = format!("{m:?}");
        format!("checkpoints={} manifest_debug_len={}", self.checkpoints.len(), dbg.len())
    }
    fn delete_prefix_kind(&self) -> &'static str {
        "scan + delete per key in one WriteBatch (no range delete in 0.18)"
    }
    fn close(&mut self) {
        self.rt.block_on(self.db.close()).unwrap();
    }
    fn read_at_previous_checkpoint(&mut self, k: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let n = self.checkpoints.len();
        if n < 2 {
            return Err("fewer than two checkpoints".into());
        }
        let id = self.checkpoints[n - 2].id;
        let (path, store) = (self.path.clone(), self.store.clone());
        self.rt.block_on(async move {
            let reader = slatedb::DbReader::builder(path, store)
                .with_reader_mode(slatedb::DbReaderMode::Checkpoint(id))
                .build()
                .await
                .map_err(|e| e.to_string())?;
            let v = reader.get(k).await.map_err(|e| e.to_string())?.map(|b| b.to_vec());
            reader.close().await.map_err(|e| e.to_string())?;
            Ok(v)
        })
    }
}
