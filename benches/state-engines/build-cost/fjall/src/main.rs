fn main() {
    let dir = std::env::temp_dir().join("cost-fjall");
    let db = fjall::Database::builder(&dir).temporary(true).open().unwrap();
    let ks = db.keyspace("k", fjall::KeyspaceCreateOptions::default).unwrap();
    ks.insert("a", "b").unwrap();
    println!("{:?}", ks.get("a").unwrap().map(|v| v.to_vec()));
}
