fn main() {
    let dir = std::env::temp_dir().join("cost-rocksdb");
    let db = rocksdb::DB::open_default(&dir).unwrap();
    db.put(b"a", b"b").unwrap();
    println!("{:?}", db.get(b"a").unwrap());
}
