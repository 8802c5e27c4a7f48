use std::sync::Arc;
fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = std::env::temp_dir().join("cost-slatedb");
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&dir).unwrap());
    rt.block_on(async {
        let db = slatedb::Db::open("db", store).await.unwrap();
        db.put(b"a", b"b").await.unwrap();
        println!("{:?}", db.get(b"a").await.unwrap());
        db.close().await.unwrap();
    });
}
