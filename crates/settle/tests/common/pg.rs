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
    /// Waits until no session is connected to this database: a killed
    /// client's backend has then finished what it was doing (a COMMIT it
    /// had received is done, anything else rolled back). At most 60 s.
    pub async fn await_no_sessions(&self) {
        let (client, conn) = tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL must be reachable for this test (see .ci/run)");
        let task = tokio::spawn(conn);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&self.name],
                )
                .await
                .unwrap()
                .get(0);
            if n == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} sessions still connected to {}",
                self.name
            );
            // Polls the server's own view until the session is gone.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        drop(client);
        let _ = task.await;
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
