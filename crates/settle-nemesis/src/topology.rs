//! The deployment under test, built and torn down by the harness: one
//! network namespace per machine, all on one bridge in a hub namespace
//! (addresses 10.88.0.x/24; no traffic leaves the namespaces the run
//! creates), an nftables table in each for partitions, a PostgreSQL
//! primary and synchronous standby, three `settle serve` processes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A failure setting up or driving the topology.
pub type Result<T> = std::result::Result<T, String>;

/// The machines, with their address's last byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Primary,
    Standby,
    Server(u8),
    Clients,
    Remote,
}

impl Node {
    pub fn ip(self) -> String {
        let last = match self {
            Node::Primary => 11,
            Node::Standby => 12,
            Node::Server(i) => 21 + i,
            Node::Clients => 31,
            Node::Remote => 41,
        };
        format!("10.88.0.{last}")
    }

    fn name(self) -> String {
        match self {
            Node::Primary => "pg1".into(),
            Node::Standby => "pg2".into(),
            Node::Server(i) => format!("s{}", i + 1),
            Node::Clients => "cl".into(),
            Node::Remote => "rm".into(),
        }
    }

    pub const ALL: [Node; 7] = [
        Node::Primary,
        Node::Standby,
        Node::Server(0),
        Node::Server(1),
        Node::Server(2),
        Node::Clients,
        Node::Remote,
    ];
}

/// Runs a command; its stderr is the error.
pub fn sh(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String> {
    sh(Command::new("ip").args(args))
}

/// The namespaces and their links. Dropped: every namespace is deleted
/// (its veth ends and nftables rules with it).
pub struct Net {
    tag: String,
    made: Vec<String>,
}

impl Net {
    /// Builds the namespaces; `tag` prefixes their names (≤ 6 characters,
    /// it also names the veth pairs).
    pub fn create(tag: &str) -> Result<Net> {
        let mut net = Net {
            tag: tag.to_string(),
            made: Vec::new(),
        };
        let hub = net.add("hub")?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for (i, node) in Node::ALL.into_iter().enumerate() {
            let ns = net.add(&node.name())?;
            let (a, b) = (format!("{tag}v{i}a"), format!("{tag}v{i}b"));
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
            ip(&["link", "set", &a, "netns", &hub])?;
            ip(&["link", "set", &b, "netns", &ns])?;
            ip(&["-n", &hub, "link", "set", &a, "master", "br0", "up"])?;
            let cidr = format!("{}/24", node.ip());
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", &b])?;
            ip(&["-n", &ns, "link", "set", &b, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let rules = "table inet nemesis {\n\
                 chain input { type filter hook input priority 0; policy accept; }\n\
                 chain output { type filter hook output priority 0; policy accept; }\n}\n";
            net.nft(node, rules)?;
        }
        Ok(net)
    }

    fn add(&mut self, name: &str) -> Result<String> {
        let ns = format!("{}-{name}", self.tag);
        ip(&["netns", "add", &ns])?;
        self.made.push(ns.clone());
        Ok(ns)
    }

    pub fn ns(&self, node: Node) -> String {
        format!("{}-{}", self.tag, node.name())
    }

    /// A command run in `node`'s namespace.
    pub fn exec(&self, node: Node, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(node), program]);
        c
    }

    fn nft(&self, node: Node, script: &str) -> Result<()> {
        let mut c = self.exec(node, "nft");
        c.args(["-f", "-"]).stdin(Stdio::piped());
        let mut child = c
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("nft: {e}"))?;
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
        let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "nft in {}: {}",
                self.ns(node),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }

    /// Drops what `from` sends to `to` (one way), at `to`'s input.
    pub fn cut(&self, from: Node, to: Node) -> Result<()> {
        self.nft(
            to,
            &format!("add rule inet nemesis input ip saddr {} drop\n", from.ip()),
        )
    }

    /// Removes every partition.
    pub fn heal(&self) -> Result<()> {
        for node in Node::ALL {
            self.nft(node, "flush chain inet nemesis input\n")?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Waits for `what` to hold, polling every 50 ms, at most `limit`.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let end = Instant::now() + limit;
    while !f() {
        if Instant::now() > end {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// PostgreSQL's programs (the newest installed major version).
pub fn pg_bindir() -> Result<PathBuf> {
    if let Ok(d) = std::env::var("SETTLE_PG_BINDIR") {
        return Ok(PathBuf::from(d));
    }
    let mut versions: Vec<u32> = fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("/usr/lib/postgresql: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let v = versions
        .last()
        .ok_or("no PostgreSQL under /usr/lib/postgresql")?;
    Ok(PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
}

/// A PostgreSQL cluster of the run, in `node`'s namespace. `pg_ctl`
/// refuses root: the programs run as the `postgres` user.
pub struct Cluster {
    pub node: Node,
    pub dir: PathBuf,
    bindir: PathBuf,
    /// Seconds the cluster's clock is off (libfaketime), if any.
    skew_s: Option<i64>,
    /// A postmaster started directly (under libfaketime): this run is its
    /// parent, and reaps it.
    postmaster: std::sync::Mutex<Vec<Child>>,
}

impl Cluster {
    fn as_postgres(&self, net: &Net, tool: &str) -> Command {
        let mut c = net.exec(self.node, "runuser");
        c.args(["-u", "postgres", "--"]);
        c.arg(self.bindir.join(tool));
        c
    }

    /// A new primary in `dir` (owned by `postgres`).
    pub fn primary(net: &Net, bindir: &Path, dir: &Path) -> Result<Cluster> {
        let c = Cluster {
            node: Node::Primary,
            dir: dir.to_path_buf(),
            bindir: bindir.to_path_buf(),
            skew_s: None,
            postmaster: std::sync::Mutex::new(Vec::new()),
        };
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        sh(Command::new("chown").args(["postgres:postgres", &path(dir)]))?;
        let sockets = sockets(dir)?;
        sh(c.as_postgres(net, "initdb").args([
            "-D",
            &path(dir),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]))?;
        append(
            &dir.join("postgresql.conf"),
            &format!(
                "listen_addresses = '{}'\nport = 5432\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\n\
                 fsync = on\nsynchronous_commit = on\nmax_connections = 200\n",
                Node::Primary.ip(),
                path(&sockets)
            ),
        )?;
        append(
            &dir.join("pg_hba.conf"),
            "host all all 10.88.0.0/24 trust\nhost replication all 10.88.0.0/24 trust\n",
        )?;
        c.start(net)?;
        Ok(c)
    }

    /// A standby of `primary` in `dir`, streaming as `standby`; the primary
    /// then requires it to confirm every commit (unless not `synchronous`).
    /// `skew_s`: its clock is that many seconds off (libfaketime), which
    /// becomes the database's clock at a failover.
    pub fn standby(
        net: &Net,
        primary: &Cluster,
        dir: &Path,
        synchronous: bool,
        skew_s: i64,
    ) -> Result<Cluster> {
        let c = Cluster {
            node: Node::Standby,
            dir: dir.to_path_buf(),
            bindir: primary.bindir.clone(),
            skew_s: (skew_s != 0).then_some(skew_s),
            postmaster: std::sync::Mutex::new(Vec::new()),
        };
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        sh(Command::new("chown").args(["postgres:postgres", &path(dir)]))?;
        sh(Command::new("chmod").args(["700", &path(dir)]))?;
        let sockets = sockets(dir)?;
        sh(c.as_postgres(net, "pg_basebackup").args([
            "-h",
            &Node::Primary.ip(),
            "-U",
            "postgres",
            "-D",
            &path(dir),
            "-X",
            "stream",
            "-R",
        ]))?;
        // postgresql.auto.conf (written by -R) wins over postgresql.conf.
        append(
            &dir.join("postgresql.auto.conf"),
            &format!(
                "listen_addresses = '{}'\nunix_socket_directories = '{}'\n\
                 primary_conninfo = 'host={} port=5432 user=postgres application_name=standby'\n",
                Node::Standby.ip(),
                path(&sockets),
                Node::Primary.ip()
            ),
        )?;
        c.start(net)?;
        if !synchronous {
            // The deliberate bug `async-standby`: commits do not wait for it.
            return Ok(c);
        }
        primary.psql(
            net,
            "ALTER SYSTEM SET synchronous_standby_names = 'standby'",
        )?;
        primary.psql(net, "SELECT pg_reload_conf()")?;
        wait_until(
            "the standby to be synchronous",
            Duration::from_secs(30),
            || {
                primary
                    .psql(
                        net,
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    )
                    .is_ok_and(|o| o.trim() == "1")
            },
        )?;
        Ok(c)
    }

    pub fn start(&self, net: &Net) -> Result<()> {
        let Some(skew) = self.skew_s else {
            return sh(self.as_postgres(net, "pg_ctl").args([
                "-D",
                &path(&self.dir),
                "-l",
                &path(&self.dir.join("log")),
                "-w",
                "-t",
                "60",
                "start",
            ]))
            .map(|_| ());
        };
        // Under libfaketime `pg_ctl -w` never sees the server start: the
        // postmaster is started directly, only its wall clock skewed (the
        // monotonic clock its timers use is left alone), then polled.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .map_err(|e| e.to_string())?;
        // setpriv, not runuser: it execs, so the postmaster's parent is this
        // run (runuser would wait in between, and stop itself whenever the
        // nemesis stops the postmaster, then never continue).
        let mut c = net.exec(self.node, "setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            "env",
        ])
        .arg(format!("LD_PRELOAD={FAKETIME_LIB}"))
        .arg(format!("FAKETIME={skew:+}s"))
        .arg("DONT_FAKE_MONOTONIC=1")
        .arg(self.bindir.join("postgres"))
        .args(["-D", &path(&self.dir)])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
        // Stopped by `pg_ctl stop`, reaped when the cluster drops.
        let child = c
            .spawn()
            .map_err(|e| format!("postgres under faketime: {e}"))?;
        self.postmaster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(child);
        let isready = self.bindir.join("pg_isready");
        wait_until(
            "PostgreSQL under faketime to start",
            Duration::from_secs(60),
            || {
                sh(net
                    .exec(self.node, &path(&isready))
                    .args(["-h", &self.node.ip(), "-p", "5432"]))
                .is_ok()
            },
        )
    }

    /// Ends recovery: this standby becomes the primary.
    pub fn promote(&self, net: &Net) -> Result<()> {
        sh(self
            .as_postgres(net, "pg_ctl")
            .args(["-D", &path(&self.dir), "-w", "promote"]))
        .map(|_| ())
    }

    /// Stops (`SIGSTOP`) every process of the cluster: the postmaster
    /// first (so that it forks no new backend), then its children.
    /// Returns them, for [`Cluster::resume`].
    pub fn freeze(&self) -> Result<Vec<u32>> {
        let pidfile = self.dir.join("postmaster.pid");
        let text =
            fs::read_to_string(&pidfile).map_err(|e| format!("{}: {e}", pidfile.display()))?;
        let postmaster: u32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| format!("{}: no pid", pidfile.display()))?;
        signal("STOP", postmaster)?;
        let mut pids = vec![postmaster];
        for child in children(postmaster) {
            // A child that exited meanwhile is no error.
            if signal("STOP", child).is_ok() {
                pids.push(child);
            }
        }
        Ok(pids)
    }

    /// Continues what [`Cluster::freeze`] stopped.
    pub fn resume(pids: &[u32]) {
        for &p in pids.iter().rev() {
            let _ = signal("CONT", p);
        }
    }

    pub fn stop(&self, net: &Net, mode: &str) -> Result<()> {
        sh(self
            .as_postgres(net, "pg_ctl")
            .args(["-D", &path(&self.dir), "-m", mode, "stop"]))
        .map(|_| ())
    }

    /// `sql` through psql on the cluster's address: its output, unaligned.
    pub fn psql(&self, net: &Net, sql: &str) -> Result<String> {
        sh(net.exec(self.node, &path(&self.bindir.join("psql"))).args([
            "-h",
            &self.node.ip(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-XAtc",
            sql,
        ]))
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@{}:5432/postgres", self.node.ip())
    }
}

impl Drop for Cluster {
    /// Stopped however the run ends (a failed setup step included): no
    /// PostgreSQL outlives its run. `pg_ctl stop` signals the postmaster
    /// named in the data directory: no namespace needed.
    fn drop(&mut self) {
        let _ = sh(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bindir.join("pg_ctl"))
            .args(["-D", &path(&self.dir), "-m", "immediate", "stop"]));
        for mut c in self
            .postmaster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A child process killed (-9) and reaped when dropped.
pub struct Owned(pub Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One `settle serve` of the run, on the primary.
pub struct Server {
    pub node: Node,
    pub child: Option<Child>,
    args: Vec<String>,
    log: PathBuf,
    /// `SETTLE_DELIBERATE_BUG` for a build with `deliberate-bugs`.
    bug: Option<&'static str>,
    /// Seconds its wall clock is off (libfaketime), the sign flipped at
    /// every start: each restart makes its clock jump.
    skew_s: Option<i64>,
}

impl Server {
    /// `store`: `--store URL` or `--data DIR`.
    pub fn new(
        node: Node,
        settle: &Path,
        store: [&str; 2],
        tenant_sha: &str,
        log: PathBuf,
    ) -> Server {
        let mut args = vec![
            path(settle),
            "serve".into(),
            store[0].into(),
            store[1].into(),
            "--listen".into(),
            format!("{}:8080", node.ip()),
            "--tenant".into(),
            format!("nemesis={tenant_sha}"),
            "--behind-proxy".into(),
            "true".into(),
        ];
        if store[0] == "--store" {
            args.extend(["--pg-client-timeout-ms".into(), "3000".into()]);
        }
        Server {
            node,
            child: None,
            args,
            log,
            bug: None,
            skew_s: None,
        }
    }

    /// Runs it with its wall clock `skew_s` seconds off (0: not at all),
    /// the other way after each restart.
    pub fn with_skew(mut self, skew_s: i64) -> Server {
        self.skew_s = (skew_s != 0).then_some(skew_s);
        self
    }

    /// Switches a deliberate bug of the server on (docs/reliability.md).
    pub fn with_bug(mut self, bug: Option<&'static str>) -> Server {
        self.bug = bug;
        self
    }

    pub fn url(&self) -> String {
        format!("http://{}:8080", self.node.ip())
    }

    /// Points it at another store (a failover): used from the next start.
    pub fn repoint(&mut self, store: &str) {
        self.args[3] = store.to_string();
    }

    /// Starts it and waits until it accepts connections.
    pub fn start(&mut self, net: &Net) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let before = fs::metadata(&self.log).map_or(0, |m| m.len());
        let mut cmd = match self.skew_s {
            None => net.exec(self.node, &self.args[0]),
            Some(skew) => {
                // Only the wall clock: the runtime's timers keep real time.
                let mut c = net.exec(self.node, "env");
                c.arg(format!("LD_PRELOAD={FAKETIME_LIB}"))
                    .arg(format!("FAKETIME={skew:+}s"))
                    .arg("DONT_FAKE_MONOTONIC=1")
                    .arg(&self.args[0]);
                self.skew_s = Some(-skew);
                c
            }
        };
        let child = cmd
            .args(&self.args[1..])
            .env("SETTLE_LOG", "warn")
            .envs(self.bug.map(|b| ("SETTLE_DELIBERATE_BUG", b)))
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("settle serve: {e}"))?;
        self.child = Some(child);
        let log = self.log.clone();
        wait_until("settle serve to listen", Duration::from_secs(30), || {
            fs::read(&log).is_ok_and(|b| {
                String::from_utf8_lossy(&b[before as usize..]).contains("listening on")
            })
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// kill -9, reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = signal("CONT", pid);
        }
        self.kill();
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            // The parent is the second field after the command's ')'.
            fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// `kill -SIG pid`.
pub fn signal(sig: &str, pid: u32) -> Result<()> {
    sh(Command::new("kill").args([&format!("-{sig}"), &pid.to_string()])).map(|_| ())
}

/// libfaketime (Debian's `faketime` package).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A cluster's socket directory, beside its data directory (inside it,
/// `pg_basebackup` would copy the primary's socket lock to the standby).
fn sockets(data: &Path) -> Result<PathBuf> {
    let d = data.with_extension("sock");
    fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    sh(Command::new("chown").args(["postgres:postgres", &path(&d)]))?;
    Ok(d)
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn append(file: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", file.display()))
}
