//! One run: the topology up, the workload and the seeded nemesis against
//! it, everything healed, the checker over what was recorded, the
//! topology down. The report is one JSON object on stdout.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::Digest;

use crate::check::{self, Op, RemoteEvent, Verdict};
use crate::rng::Rng;
use crate::topology::{Cluster, Net, Node, Owned, Result, Server, pg_bindir, signal, wait_until};

/// What `settle-nemesis run` is told.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The schedule's and the workload's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds of faults (the workload runs as long, then the heal and
    /// the final pass follow).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Concurrent `run_once` clients.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// The settle binary (default: `settle` beside this program).
    #[arg(long)]
    pub settle: Option<PathBuf>,
    /// Keep the run's directory (logs, history, the remote's log).
    #[arg(long)]
    pub keep: bool,
    /// Seconds the standby's clock is off (libfaketime): the database's
    /// clock jumps by that much at the failover.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub standby_skew_s: i64,
    /// Switch on a deliberate bug, to show the checker catches it
    /// (docs/reliability.md).
    #[arg(long)]
    pub bug: Option<Bug>,
    /// The store: PostgreSQL (primary, synchronous standby, three
    /// servers) or the embedded engine (one server on its own directory).
    #[arg(long, value_enum, default_value_t = Engine::Postgres)]
    pub engine: Engine,
    /// With `--engine embedded`: seconds the server's wall clock is off
    /// (libfaketime), the other way after each restart, so that every
    /// kill -9 makes it jump by twice that.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub server_skew_s: i64,
}

/// Where the servers keep the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Postgres,
    Embedded,
}

/// The deliberate bugs a run can switch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// The standby is asynchronous: commits do not wait for it, so a
    /// failover loses acknowledged receipts.
    AsyncStandby,
    /// The clients are an SDK that runs the effect again when a settle's
    /// answer is lost.
    RerunAfterLostSettle,
    /// The servers answer a command when its COMMIT has waited 20 ms,
    /// before it returns (needs `--settle` built with the feature
    /// `deliberate-bugs`): a failover loses acknowledged receipts.
    AnswerBeforeCommit,
}

impl Bug {
    /// What the server is told (`SETTLE_DELIBERATE_BUG`), for the bugs that
    /// are the server's.
    fn server_env(self) -> Option<&'static str> {
        match self {
            Bug::AnswerBeforeCommit => Some("answer-before-commit"),
            Bug::AsyncStandby | Bug::RerunAfterLostSettle => None,
        }
    }
}

/// The faults the nemesis injects.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Clients and server i cannot reach each other.
    CutClients(u8),
    /// Server i and the primary cannot reach each other.
    CutPrimary(u8),
    /// What the clients send to server i is dropped (answers still flow).
    ClientsToServerOneWay(u8),
    /// What the primary sends to server i is dropped.
    PrimaryToServerOneWay(u8),
    /// Server i's answers to the clients are dropped (requests arrive and
    /// commit: lost answers, retried by the SDK).
    AnswersLost(u8),
    /// Every process of server i stopped (SIGSTOP) longer than a lease.
    Pause(u8),
    /// Server i killed (-9), restarted after a while.
    Kill(u8),
    /// Workload process j (half of the clients) stopped (SIGSTOP) longer
    /// than a lease: its leases lapse, the other half takes the keys over,
    /// and its effects arrive late (the remote's fencing refuses them).
    PauseClients(u8),
    /// Every process of the database (the primary; after the failover,
    /// the promoted standby) stopped (SIGSTOP) longer than a lease.
    PauseDatabase,
    /// The primary and the standby cannot reach each other (before the
    /// failover): commits wait for the standby until it heals.
    CutStandby,
    /// The primary cut off from the standby, crashed and restarted
    /// (recovery shows its unconfirmed commits), crashed again; the
    /// standby promoted and every server repointed to it. Once per run.
    Failover,
}

impl Fault {
    fn pick(rng: &mut Rng, failed_over: bool, engine: Engine) -> Fault {
        if engine == Engine::Embedded {
            // One server, no database of its own to cut or pause.
            return match rng.below(6) {
                0 => Fault::CutClients(0),
                1 => Fault::ClientsToServerOneWay(0),
                2 => Fault::AnswersLost(0),
                3 => Fault::Pause(0),
                4 => Fault::PauseClients(rng.below(2) as u8),
                _ => Fault::Kill(0),
            };
        }
        let i = rng.below(3) as u8;
        match rng.below(10) {
            9 if failed_over => Fault::PauseDatabase,
            9 => Fault::CutStandby,
            8 => Fault::PauseDatabase,
            7 => Fault::PauseClients(i % 2),
            6 => Fault::AnswersLost(i),
            0 => Fault::CutClients(i),
            1 => Fault::CutPrimary(i),
            2 => Fault::ClientsToServerOneWay(i),
            3 => Fault::PrimaryToServerOneWay(i),
            4 => Fault::Pause(i),
            _ => Fault::Kill(i),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Fault::CutClients(_) => "partition clients-server",
            Fault::CutPrimary(_) => "partition server-primary",
            Fault::ClientsToServerOneWay(_) => "one-way clients->server",
            Fault::PrimaryToServerOneWay(_) => "one-way primary->server",
            Fault::AnswersLost(_) => "one-way server->clients (lost answers)",
            Fault::Pause(_) => "pause server (SIGSTOP)",
            Fault::Kill(_) => "kill -9 server",
            Fault::PauseClients(_) => "pause half of the clients (SIGSTOP)",
            Fault::PauseDatabase => "pause the database's processes (SIGSTOP)",
            Fault::CutStandby => "partition primary-standby",
            Fault::Failover => "failover (primary cut off, crashed, standby promoted)",
        }
    }
}

/// What a run reports.
#[derive(Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub seconds: u64,
    pub ops: usize,
    pub ok: usize,
    pub replayed: usize,
    pub errors: BTreeMap<String, usize>,
    pub faults: BTreeMap<String, usize>,
    pub schedule: Vec<String>,
    pub bug: Option<String>,
    pub engine: Engine,
    pub standby_skew_s: i64,
    pub server_skew_s: i64,
    /// What the first workload process's Reconciler did.
    pub reconciler: Option<crate::workload::Sweeps>,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub dir: Option<PathBuf>,
}

const LEASE_MS: u64 = 2000;
const TOKEN: &str = "nemesis-token";

struct Up {
    net: Net,
    /// `None` on the embedded engine.
    pg: Option<Pg>,
    servers: Vec<Server>,
    _remote: Owned,
    /// The workload processes' pids (paused by the nemesis).
    workloads: Vec<u32>,
}

/// The PostgreSQL clusters of a run.
struct Pg {
    primary: Cluster,
    standby: Cluster,
    /// The standby was promoted: no second failover.
    failed_over: bool,
}

impl Up {
    fn failed_over(&self) -> bool {
        self.pg.as_ref().is_some_and(|pg| pg.failed_over)
    }

    fn pg(&self) -> Result<&Pg> {
        self.pg
            .as_ref()
            .ok_or_else(|| "a database fault without PostgreSQL".into())
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // The rest (remote, clusters, namespaces) stop as they drop.
        for s in &mut self.servers {
            s.kill();
        }
    }
}

fn settle_bin(a: &RunArgs) -> Result<PathBuf> {
    if let Some(p) = &a.settle {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = me.with_file_name("settle");
    p.exists()
        .then_some(p)
        .ok_or_else(|| "no settle beside settle-nemesis: build it or pass --settle".into())
}

fn up(dir: &Path, settle: &Path, tag: &str, a: &RunArgs) -> Result<Up> {
    let net = Net::create(tag)?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let remote = net
        .exec(Node::Remote, &me.to_string_lossy())
        .args(["remote", "--listen", &format!("{}:7000", Node::Remote.ip())])
        .arg("--log")
        .arg(dir.join("remote.jsonl"))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("the remote: {e}"))?;
    let mut up = Up {
        net,
        pg: None,
        servers: Vec::new(),
        _remote: Owned(remote),
        workloads: Vec::new(),
    };
    let sha = hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()));
    let bug = a.bug.and_then(Bug::server_env);
    if a.engine == Engine::Embedded {
        let data = dir.join("s1.data");
        let mut s = Server::new(
            Node::Server(0),
            settle,
            ["--data", &data.to_string_lossy()],
            &sha,
            dir.join("s1.log"),
        )
        .with_bug(bug)
        .with_skew(a.server_skew_s);
        s.start(&up.net)?;
        up.servers.push(s);
        return Ok(up);
    }
    up.pg = Some(clusters(&up.net, dir, a)?);
    let store = up.pg()?.primary.url();
    // One after the other: the first migrates the schema.
    for i in 0..3 {
        let mut s = Server::new(
            Node::Server(i),
            settle,
            ["--store", &store],
            &sha,
            dir.join(format!("s{}.log", i + 1)),
        )
        .with_bug(bug);
        s.start(&up.net)?;
        up.servers.push(s);
    }
    Ok(up)
}

/// The primary and its synchronous standby.
fn clusters(net: &Net, dir: &Path, a: &RunArgs) -> Result<Pg> {
    let bindir = pg_bindir()?;
    let primary = Cluster::primary(net, &bindir, &dir.join("pg1"))?;
    let synchronous = a.bug != Some(Bug::AsyncStandby);
    let standby = Cluster::standby(
        net,
        &primary,
        &dir.join("pg2"),
        synchronous,
        a.standby_skew_s,
    )?;
    Ok(Pg {
        primary,
        standby,
        failed_over: false,
    })
}

/// How long a pause holds: `hold`, at least a lease and a second (so that
/// the paused side's leases lapse).
fn pause_hold(hold: Duration) -> Duration {
    hold.max(Duration::from_millis(LEASE_MS + 1000))
}

/// Stops `pid` (SIGSTOP) for [`pause_hold`], then continues it.
fn pause(pid: u32, hold: Duration) -> Result<()> {
    signal("STOP", pid)?;
    std::thread::sleep(pause_hold(hold));
    signal("CONT", pid)
}

/// Injects `f`, holds it, heals it.
fn inject(up: &mut Up, f: Fault, hold: Duration) -> Result<()> {
    let net = &up.net;
    let db = if up.failed_over() {
        Node::Standby
    } else {
        Node::Primary
    };
    match f {
        Fault::CutClients(i) => {
            net.cut(Node::Clients, Node::Server(i))?;
            net.cut(Node::Server(i), Node::Clients)?;
        }
        Fault::CutPrimary(i) => {
            net.cut(db, Node::Server(i))?;
            net.cut(Node::Server(i), db)?;
        }
        Fault::ClientsToServerOneWay(i) => net.cut(Node::Clients, Node::Server(i))?,
        Fault::PrimaryToServerOneWay(i) => net.cut(db, Node::Server(i))?,
        Fault::AnswersLost(i) => net.cut(Node::Server(i), Node::Clients)?,
        Fault::Pause(i) => {
            let pid = up.servers[i as usize].pid().ok_or("no server to pause")?;
            return pause(pid, hold);
        }
        Fault::Kill(i) => {
            let s = &mut up.servers[i as usize];
            s.kill();
            std::thread::sleep(hold);
            return s.start(&up.net);
        }
        Fault::CutStandby => {
            net.cut(Node::Primary, Node::Standby)?;
            net.cut(Node::Standby, Node::Primary)?;
        }
        Fault::PauseDatabase => {
            let pg = up.pg()?;
            let cluster = if pg.failed_over {
                &pg.standby
            } else {
                &pg.primary
            };
            let pids = cluster.freeze()?;
            std::thread::sleep(pause_hold(hold));
            Cluster::resume(&pids);
            return Ok(());
        }
        Fault::Failover => return failover(up, hold),
        Fault::PauseClients(j) => return pause(up.workloads[j as usize], hold),
    }
    std::thread::sleep(hold);
    up.net.heal()
}

fn failover(up: &mut Up, hold: Duration) -> Result<()> {
    let (net, Some(pg)) = (&up.net, up.pg.as_mut()) else {
        return Err("a failover without PostgreSQL".into());
    };
    if pg.failed_over {
        return Ok(());
    }
    net.cut(Node::Primary, Node::Standby)?;
    net.cut(Node::Standby, Node::Primary)?;
    // Commits now wait for the standby (or, asynchronous, do not).
    std::thread::sleep(hold);
    pg.primary.stop(net, "immediate")?;
    pg.primary.start(net)?;
    // Crash recovery made its unconfirmed commits visible; the servers
    // reconnect and read them.
    std::thread::sleep(Duration::from_millis(1500));
    pg.primary.stop(net, "immediate")?;
    net.heal()?;
    pg.standby.promote(net)?;
    pg.failed_over = true;
    let store = pg.standby.url();
    for s in &mut up.servers {
        s.kill();
        s.repoint(&store);
        s.start(&up.net)?;
    }
    Ok(())
}

/// Runs the nemesis until `end` (seeded), healing after each fault.
fn nemesis(up: &mut Up, rng: &mut Rng, end: Instant, t0: Instant) -> Result<Vec<(u64, Fault)>> {
    let engine = if up.pg.is_some() {
        Engine::Postgres
    } else {
        Engine::Embedded
    };
    let mut done = Vec::new();
    let half = t0 + (end - t0) / 2;
    while Instant::now() + Duration::from_secs(4) < end {
        std::thread::sleep(rng.ms(300, 1500));
        // One failover, at the first fault past half-time.
        let f = if up.pg.is_some() && Instant::now() > half && !up.failed_over() {
            Fault::Failover
        } else {
            Fault::pick(rng, up.failed_over(), engine)
        };
        let hold = rng.ms(500, 3000);
        done.push((t0.elapsed().as_millis() as u64, f));
        inject(up, f, hold)?;
    }
    Ok(done)
}

fn read_lines<T: serde::de::DeserializeOwned>(p: &Path) -> Result<Vec<T>> {
    std::fs::read_to_string(p)
        .map_err(|e| format!("{}: {e}", p.display()))?
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{}: {e}: {l}", p.display())))
        .collect()
}

/// The answer nemesis's counts (the workload's proxies).
fn read_answers(history: &Path) -> Result<BTreeMap<String, usize>> {
    let p = history.with_extension("answers.json");
    let b = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", p.display()))
}

/// One whole run.
pub fn run(a: &RunArgs) -> Result<Report> {
    if a.engine == Engine::Embedded
        && matches!(a.bug, Some(Bug::AsyncStandby | Bug::AnswerBeforeCommit))
    {
        return Err("that deliberate bug is PostgreSQL's: run it with --engine postgres".into());
    }
    let settle = settle_bin(a)?;
    let tmp = tempfile::Builder::new()
        .prefix("settle-nemesis-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let dir = tmp.path().to_path_buf();
    // The postgres user must reach the clusters' directories.
    crate::topology::sh(Command::new("chmod").args(["755", &dir.to_string_lossy()]))?;
    let tag = format!("sn{:04x}", std::process::id() % 0x10000);
    match run_in(a, &dir, &settle, &tag) {
        Ok(mut report) => {
            if a.keep || !report.verdict.violations.is_empty() {
                report.dir = Some(tmp.keep());
            }
            Ok(report)
        }
        Err(e) => Err(format!("{e} (the run's files: {})", tmp.keep().display())),
    }
}

fn run_in(a: &RunArgs, dir: &Path, settle: &Path, tag: &str) -> Result<Report> {
    let mut up = up(dir, settle, tag, a)?;
    let servers: Vec<String> = up.servers.iter().map(Server::url).collect();
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    // Two workload processes, half of the clients each: the nemesis
    // pauses one while the other goes on.
    let histories: Vec<PathBuf> = (0..2)
        .map(|j| dir.join(format!("history-{j}.jsonl")))
        .collect();
    let mut workloads = Vec::new();
    for (j, history) in histories.iter().enumerate() {
        let w = up
            .net
            .exec(Node::Clients, &me.to_string_lossy())
            .args(["workload", "--servers", &servers.join(",")])
            .args(["--token", TOKEN])
            .args(["--remote", &format!("{}:7000", Node::Remote.ip())])
            .args(["--seconds", &a.seconds.to_string()])
            .args(["--seed", &(a.seed ^ (j as u64) << 32).to_string()])
            .args(["--clients", &a.clients.div_ceil(2).to_string()])
            .args(["--client-base", &(j as u32 * 1000).to_string()])
            .args(["--lease-ms", &LEASE_MS.to_string()])
            .arg("--history")
            .arg(history)
            .args((a.bug == Some(Bug::RerunAfterLostSettle)).then_some("--rerun-after-lost-settle"))
            .args((j == 0).then_some("--reconciler"))
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("the workload: {e}"))?;
        up.workloads.push(w.id());
        workloads.push(Owned(w));
    }
    let t0 = Instant::now();
    let mut rng = Rng::new(a.seed);
    let schedule = nemesis(&mut up, &mut rng, t0 + Duration::from_secs(a.seconds), t0);
    // Heal everything whatever happened, then let the workload finish.
    let healed = up.net.heal();
    for s in &mut up.servers {
        if let Some(pid) = s.pid() {
            let _ = signal("CONT", pid);
        } else {
            s.start(&up.net)?;
        }
    }
    let schedule = schedule?;
    healed?;
    for w in &mut workloads {
        if let Some(mut stdin) = w.0.stdin.take() {
            writeln!(stdin, "healed").map_err(|e| format!("the workload: {e}"))?;
        }
    }
    for w in &mut workloads {
        let mut status = None;
        wait_until(
            "the workload to end",
            Duration::from_secs(a.seconds + 180),
            || {
                status = w.0.try_wait().ok().flatten();
                status.is_some()
            },
        )?;
        if !status.is_some_and(|s| s.success()) {
            return Err(format!("the workload failed: {status:?}"));
        }
    }
    drop(up);
    report(a, dir, &histories, &schedule)
}

/// The run's report: the histories and the remote's log read back and
/// checked.
fn report(
    a: &RunArgs,
    dir: &Path,
    histories: &[PathBuf],
    schedule: &[(u64, Fault)],
) -> Result<Report> {
    let mut ops: Vec<Op> = Vec::new();
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for h in histories {
        ops.extend(read_lines::<Op>(h)?);
        for (k, n) in read_answers(h)? {
            *faults.entry(k).or_insert(0) += n;
        }
    }
    let remote: Vec<RemoteEvent> = read_lines(&dir.join("remote.jsonl"))?;
    let sweeps = histories[0].with_extension("reconciler.json");
    let reconciler = std::fs::read(&sweeps)
        .map_err(|e| format!("{}: {e}", sweeps.display()))
        .and_then(|b| {
            serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", sweeps.display()))
        })?;
    let verdict = check::check(&ops, &remote);
    let mut errors = BTreeMap::new();
    for o in &ops {
        if let Some(e) = &o.error {
            *errors.entry(e.clone()).or_insert(0) += 1;
        }
    }
    for (_, f) in schedule {
        *faults.entry(f.kind().to_string()).or_insert(0) += 1;
    }
    let report = Report {
        seed: a.seed,
        seconds: a.seconds,
        ops: ops.len(),
        ok: ops.iter().filter(|o| o.outcome_id.is_some()).count(),
        replayed: ops.iter().filter(|o| o.replayed).count(),
        errors,
        faults,
        schedule: schedule
            .iter()
            .map(|(ms, f)| format!("{ms} ms: {f:?}"))
            .collect(),
        bug: a.bug.map(|b| format!("{b:?}")),
        engine: a.engine,
        standby_skew_s: a.standby_skew_s,
        server_skew_s: a.server_skew_s,
        reconciler: Some(reconciler),
        verdict,
        dir: None,
    };
    Ok(report)
}
