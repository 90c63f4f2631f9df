//! Throwaway PostgreSQL clusters (initdb + pg_ctl, spare port, temporary
//! directory) that a test may crash, kill, restart, replicate and promote.
//! The shared cluster on 5432 is never touched.
//!
//! As root the server programs run as the `postgres` OS user (initdb
//! refuses root), through `runuser`. The binaries are found in
//! `SETTLE_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`, else
//! `pg_config --bindir`. When they cannot be used, [`Pg::find`] says why and
//! the test skips with that message.
#![allow(clippy::print_stderr)] // test support reports what it waits for
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The server programs, and the OS user to run them as.
#[derive(Clone, Debug)]
pub struct Pg {
    bin: PathBuf,
    /// (name, uid, gid) of the user to run as, when we are root.
    run_as: Option<(String, u32, u32)>,
}

fn output(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("{cmd:?}: {e}"))
}

fn id(args: &[&str]) -> Option<u32> {
    let o = Command::new("id").args(args).output().ok()?;
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}

impl Pg {
    pub fn find() -> Result<Pg, String> {
        let bin = match std::env::var_os("SETTLE_PG_BINDIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
                    .map(|rd| {
                        rd.filter_map(|e| e.ok())
                            .map(|e| e.path().join("bin"))
                            .filter(|p| p.join("initdb").exists())
                            .collect()
                    })
                    .unwrap_or_default();
                // Versions sort numerically: 9.6 < 15 < 16.
                dirs.sort_by_key(|p| {
                    p.parent()
                        .and_then(|v| v.file_name())
                        .and_then(|v| v.to_str())
                        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
                        .unwrap_or(0)
                });
                match dirs.pop() {
                    Some(d) => d,
                    None => {
                        let o = Command::new("pg_config").arg("--bindir").output().map_err(|_| {
                            "no PostgreSQL server binaries (install postgresql, or set SETTLE_PG_BINDIR)"
                                .to_string()
                        })?;
                        PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
                    }
                }
            }
        };
        for tool in ["initdb", "pg_ctl", "pg_basebackup", "postgres"] {
            if !bin.join(tool).exists() {
                return Err(format!("{} has no {tool}", bin.display()));
            }
        }
        let run_as = if id(&["-u"]) == Some(0) {
            let uid = id(&["-u", "postgres"])
                .ok_or("running as root and there is no `postgres` user to run initdb as")?;
            let gid = id(&["-g", "postgres"]).ok_or("no group for the `postgres` user")?;
            Command::new("runuser")
                .arg("--help")
                .output()
                .map_err(|_| "running as root and `runuser` is missing")?;
            Some(("postgres".to_string(), uid, gid))
        } else {
            None
        };
        Ok(Pg { bin, run_as })
    }

    fn cmd(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        match &self.run_as {
            Some((user, _, _)) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let o = output(self.cmd(tool).args(args))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{tool} {args:?}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    }

    /// A fresh directory the server user owns.
    fn temp_dir(&self, name: &str) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "settle-pgc-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((_, uid, gid)) = &self.run_as {
            std::os::unix::fs::chown(&dir, Some(*uid), Some(*gid)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }
}

/// A port nobody listens on right now.
pub fn spare_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One throwaway cluster. Dropping it stops it (immediately) and removes
/// its directory.
pub struct Cluster {
    pg: Pg,
    pub name: String,
    pub dir: PathBuf,
    pub data: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// initdb, the settings every cluster here gets plus `conf`, and start.
    pub fn create(pg: &Pg, name: &str, conf: &[&str]) -> Cluster {
        Cluster::create_with(pg, name, conf, |_| {})
    }

    /// As [`Cluster::create`], calling `before_start` between initdb and
    /// the first start (to write files into the data directory).
    pub fn create_with(
        pg: &Pg,
        name: &str,
        conf: &[&str],
        before_start: impl FnOnce(&Cluster),
    ) -> Cluster {
        let dir = pg.temp_dir(name);
        let data = dir.join("data");
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                // Only process crashes are simulated here, never the
                // loss of the page cache: the initial files need no sync.
                "--no-sync",
            ],
        )
        .unwrap_or_else(|e| panic!("initdb failed: {e}"));
        let mut c = Cluster {
            pg: pg.clone(),
            name: name.to_string(),
            dir,
            data,
            port: spare_port(),
        };
        let mut settings = vec![
            format!("port = {}", c.port),
            "listen_addresses = '127.0.0.1'".to_string(),
            format!("unix_socket_directories = '{}'", c.dir.display()),
            "fsync = on".to_string(),
            "synchronous_commit = on".to_string(),
            "max_connections = 60".to_string(),
            "shared_buffers = 16MB".to_string(),
            "wal_level = replica".to_string(),
            "max_wal_senders = 4".to_string(),
        ];
        settings.extend(conf.iter().map(|s| s.to_string()));
        c.append_conf(&settings);
        before_start(&c);
        c.first_start("postgresql.conf");
        c
    }

    /// Writes `file` into the data directory, owned by the server's user
    /// and readable by it alone (as PostgreSQL wants a private key).
    pub fn write_private(&self, file: &str, contents: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.data.join(file);
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        if let Some((_, uid, gid)) = &self.pg.run_as {
            std::os::unix::fs::chown(&path, Some(*uid), Some(*gid)).unwrap();
        }
    }

    /// Puts `lines` first in pg_hba.conf (the first matching line wins).
    pub fn prepend_hba(&self, lines: &[&str]) {
        let path = self.data.join("pg_hba.conf");
        let old = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{}\n{old}", lines.join("\n"))).unwrap();
    }

    /// Starts a new cluster; if another process took its port meanwhile,
    /// moves it to another one (`conf`: the file that sets the port).
    fn first_start(&mut self, conf: &str) {
        for _ in 0..5 {
            match self.try_start() {
                Ok(()) => return,
                Err(e) if self.log_tail().contains("could not bind") => {
                    eprintln!("{}: port {} taken, moving: {e}", self.name, self.port);
                    self.port = spare_port();
                    self.append_to(conf, &[format!("port = {}", self.port)]);
                }
                Err(e) => panic!("{}: could not start: {e}\n{}", self.name, self.log_tail()),
            }
        }
        panic!("{}: no free port\n{}", self.name, self.log_tail());
    }

    fn try_start(&self) -> Result<(), String> {
        self.pg.run(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-l",
                self.log().to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Appends lines to postgresql.conf (later lines win).
    pub fn append_conf(&self, lines: &[String]) {
        self.append_to("postgresql.conf", lines);
    }

    /// Appends lines to a configuration file of the data directory.
    fn append_to(&self, file: &str, lines: &[String]) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join(file))
            .unwrap();
        writeln!(f, "\n# settle test settings").unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Starts and waits until it accepts connections. After a kill -9 of
    /// the postmaster its orphaned backends keep the shared memory for a
    /// moment: starting is retried until they are gone.
    pub fn start(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.try_start() {
                Ok(()) => return,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("{}: start failed, retrying: {e}", self.name);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{}: could not start: {e}\n{}", self.name, self.log_tail()),
            }
        }
    }

    /// `pg_ctl stop -m MODE` (smart, fast, immediate).
    pub fn stop(&self, mode: &str) {
        self.pg
            .run(
                "pg_ctl",
                &[
                    "-D",
                    self.data.to_str().unwrap(),
                    "-m",
                    mode,
                    "-w",
                    "-t",
                    "60",
                    "stop",
                ],
            )
            .unwrap_or_else(|e| panic!("{}: stop -m {mode}: {e}", self.name));
    }

    /// `pg_ctl restart -m MODE`.
    pub fn restart(&self, mode: &str) {
        self.stop(mode);
        self.start();
    }

    pub fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGKILL to the postmaster; its backends notice and exit on their own.
    pub fn kill9_postmaster(&self) {
        let pid = self.postmaster_pid().expect("the postmaster is running");
        kill9(pid);
        // Gone once its pid is; the backends follow within moments.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL to the postmaster and every one of its processes at once: the
    /// machine is gone (no orphaned backend finishes anything).
    pub fn kill9_all(&self) {
        let pid = self.postmaster_pid().expect("the postmaster is running");
        let children: Vec<i32> =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
        kill9(pid);
        for c in children {
            // Some may have exited already.
            let _ = Command::new("kill").args(["-9", &c.to_string()]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn promote(&self) {
        self.pg
            .run(
                "pg_ctl",
                &[
                    "-D",
                    self.data.to_str().unwrap(),
                    "-w",
                    "-t",
                    "60",
                    "promote",
                ],
            )
            .unwrap_or_else(|e| panic!("{}: promote: {e}", self.name));
    }

    /// A streaming standby of `self` (pg_basebackup), started, connecting
    /// as `application_name`.
    pub fn standby(&self, name: &str, application_name: &str) -> Cluster {
        let dir = self.pg.temp_dir(name);
        let data = dir.join("data");
        self.pg
            .run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-D",
                    data.to_str().unwrap(),
                    "-X",
                    "stream",
                    "-R",
                    "-c",
                    "fast",
                ],
            )
            .unwrap_or_else(|e| panic!("pg_basebackup: {e}"));
        let mut c = Cluster {
            pg: self.pg.clone(),
            name: name.to_string(),
            dir,
            data,
            port: spare_port(),
        };
        // postgresql.auto.conf is read last: its primary_conninfo (written
        // by -R) is replaced there.
        c.append_to("postgresql.auto.conf", &[
            format!("port = {}", c.port),
            format!("unix_socket_directories = '{}'", c.dir.display()),
            format!(
                "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={application_name}'",
                self.port
            ),
            "hot_standby = on".to_string(),
        ]);
        c.first_start("postgresql.auto.conf");
        c
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The `postgres` database as `postgres` (trust).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A plain connection (for inspecting or sabotaging from the side).
    pub async fn client(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Waits until a plain connection works and answers.
    pub async fn wait_ready(&self) -> tokio_postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(c) = self.client().await
                && c.simple_query("SELECT 1").await.is_ok()
            {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "{} never became ready\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.postmaster_pid().is_some() {
            let _ = self.pg.run(
                "pg_ctl",
                &[
                    "-D",
                    self.data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
            );
        }
        if std::env::var_os("SETTLE_KEEP_CLUSTERS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGKILL to one process by id.
pub fn kill9(pid: i32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -9 {pid}");
}

/// The tools, or a skip message printed by the caller.
pub fn tools_or_skip(test: &str) -> Option<Pg> {
    match Pg::find() {
        Ok(pg) => Some(pg),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}
