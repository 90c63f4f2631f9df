//! A PostgreSQL database of its own for a test (`SETTLE_TEST_PG_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`), dropped after it.

pub fn admin_url() -> String {
    std::env::var("SETTLE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

pub async fn admin(sql: &str) {
    let (client, conn) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL must be reachable for this test (see .ci/run)");
    let task = tokio::spawn(conn);
    client.batch_execute(sql).await.unwrap();
    drop(client);
    let _ = task.await;
}

/// A database that exists for one test.
pub struct Database {
    name: String,
}

impl Database {
    pub async fn create() -> Database {
        let name = format!(
            "settle_it_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                % 1_000_000_000
        );
        admin(&format!("CREATE DATABASE {name}")).await;
        Database { name }
    }
    pub fn url(&self) -> String {
        let base = admin_url();
        let (prefix, _) = base.rsplit_once('/').unwrap();
        format!("{prefix}/{}", self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // Drop may run outside a runtime (or during a panic): use a thread with its own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(admin(&format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
        })
        .join();
    }
}
