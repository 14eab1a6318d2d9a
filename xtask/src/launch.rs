//! `cargo xtask launch`: torchrun's launcher for any command, on one node or several.
//!
//! ```text
//! cargo xtask launch --nproc-per-node 2 [--master-port 0] -- target/release/run_clm ...
//! # two nodes, static rendezvous (torchrun's `--nnodes 2 --node-rank R`), on each node:
//! cargo xtask launch --nnodes 2 --node-rank R --nproc-per-node 2 \
//!     --master-addr NODE0 --master-port 29500 -- target/release/run_clm ...
//! ```
//!
//! Like torchrun's static launches it starts `--nproc-per-node` copies of the command, each
//! with torchrun's environment (`RANK` = node rank × processes per node + local rank,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK` (the node), `GROUP_WORLD_SIZE`,
//! `ROLE_RANK`, `ROLE_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, ... and `OMP_NUM_THREADS=1`
//! unless set), each in its own process group (torchrun's `start_new_session`); every output
//! line is prefixed with `[rank N] ` (the global rank). With several nodes the launchers do
//! not talk to each other: the ranks meet at `MASTER_ADDR:MASTER_PORT`, where global rank 0
//! (on node 0) serves the rendezvous store, as with torchrun's `static` rendezvous. A node
//! that never arrives leaves the others' ranks waiting in their rendezvous, which fails each
//! of them after `ddp_timeout` with an error naming the address, the ranks and the timeout
//! (`tchtrain_distributed::Error::Rendezvous`). When a rank fails
//! (non-zero exit or a signal) the others are stopped as torchrun stops them: SIGTERM to
//! each process group, SIGKILL to what is left after `--term-timeout` seconds (torchrun's
//! 30; a stopped rank is sent SIGCONT with the SIGTERM so that it can act on it); the
//! launcher then fails naming the rank and its exit status. SIGINT / SIGTERM sent to the
//! launcher stop every rank the same way, and end the launch.
//!
//! With `--max-restarts N` (torchrun's; default 0) a failed worker group is stopped as above
//! and started again, up to N times: the same ranks and command, `TORCHELASTIC_RESTART_COUNT`
//! one higher (`TORCHELASTIC_MAX_RESTARTS` = N), and a new rendezvous (a new free port with
//! `--master-port 0`, else the same port, served anew by the new rank 0). The example scripts
//! then resume from the newest complete checkpoint in `--output_dir`, as upstream's do
//! (`get_last_checkpoint`). A rank that stops answering (SIGSTOP, a hung peer) is noticed by
//! the others' collectives after `ddp_timeout`; their failure restarts the group.
//! `--monitor-interval` (torchrun's, 0.1 s) is how often the launcher looks at its ranks and
//! at the signals it caught. Restarts are for one node: several nodes would have to restart
//! in the same round (torchrun's dynamic rendezvous), so `--max-restarts` with `--nnodes`
//! above 1 is refused, as are elastic ranges (`--nnodes 1:4`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::signal;

/// torchrun's default `--master-port`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// torchrun's default `--master-addr`.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// How long stopped ranks get between SIGTERM and SIGKILL (torchrun's `close(timeout=30)`).
pub const DEFAULT_TERM_TIMEOUT: Duration = Duration::from_secs(30);
/// torchrun's default `--monitor-interval` (0.1 s).
pub const DEFAULT_MONITOR_INTERVAL: Duration = Duration::from_millis(100);
/// How long output readers may run after every rank has exited (a daemon left behind by a
/// rank can hold its pipes open).
const READER_GRACE: Duration = Duration::from_secs(2);

/// The parsed command line of `launch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Processes to start on this node (`--nproc-per-node`, default 1).
    pub nproc_per_node: usize,
    /// Nodes in the run (`--nnodes`, default 1).
    pub nnodes: usize,
    /// This node's rank (`--node-rank`, default 0).
    pub node_rank: usize,
    /// Rendezvous address handed to the ranks (`--master-addr`).
    pub master_addr: String,
    /// Rendezvous port (`--master-port`); 0 picks a free port at launch.
    pub master_port: u16,
    /// SIGTERM-to-SIGKILL grace when stopping ranks (`--term-timeout SECONDS`).
    pub term_timeout: Duration,
    /// How many times a failed worker group is started again (`--max-restarts`, default 0).
    pub max_restarts: usize,
    /// How often the launcher looks at its ranks and at the signals it caught
    /// (`--monitor-interval SECONDS`, torchrun's default 0.1).
    pub monitor_interval: Duration,
    /// The program and its arguments.
    pub command: Vec<String>,
}

/// Where the ranks' prefixed lines go.
pub type Sink = Arc<Mutex<dyn Write + Send>>;

/// The two sinks of a launch (the launcher's own stdout and stderr by default).
#[derive(Clone)]
pub struct Output {
    /// Receives the ranks' stdout lines.
    pub stdout: Sink,
    /// Receives the ranks' stderr lines and the launcher's notes.
    pub stderr: Sink,
}

impl Output {
    fn standard() -> Self {
        Self {
            stdout: Arc::new(Mutex::new(std::io::stdout())),
            stderr: Arc::new(Mutex::new(std::io::stderr())),
        }
    }

    fn note(&self, text: &str) {
        let mut w = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(w, "launch: {text}");
        let _ = w.flush();
    }
}

fn value<'a>(
    flag: &str,
    inline: Option<&'a str>,
    it: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a str, String> {
    inline
        .or_else(|| it.next().map(String::as_str))
        .ok_or_else(|| format!("launch: `{flag}` needs a value"))
}

impl Options {
    /// Parses `launch`'s arguments: torchrun's flags (dashes or underscores, `--flag value`
    /// or `--flag=value`), then the command after `--` (or from the first argument that is
    /// not a flag, as torchrun's `training_script`).
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options {
            nproc_per_node: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: DEFAULT_MASTER_ADDR.into(),
            master_port: DEFAULT_MASTER_PORT,
            term_timeout: DEFAULT_TERM_TIMEOUT,
            max_restarts: 0,
            monitor_interval: DEFAULT_MONITOR_INTERVAL,
            command: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--" {
                o.command = it.by_ref().cloned().collect();
                break;
            }
            if !arg.starts_with("--") {
                o.command = std::iter::once(arg).chain(it.by_ref()).cloned().collect();
                break;
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (arg.as_str(), None),
            };
            let name = flag.trim_start_matches('-').replace('_', "-");
            match name.as_str() {
                "nproc-per-node" => {
                    let v = value(flag, inline, &mut it)?;
                    o.nproc_per_node = v.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| {
                        format!("launch: `--nproc-per-node {v}`: expected a positive number of processes")
                    })?;
                }
                "master-port" => {
                    let v = value(flag, inline, &mut it)?;
                    o.master_port = v.parse().map_err(|_| {
                        format!("launch: `--master-port {v}`: expected a port in 0..=65535 (0: pick a free one)")
                    })?;
                }
                "master-addr" => {
                    let v = value(flag, inline, &mut it)?;
                    if v.is_empty() {
                        return Err("launch: `--master-addr` is empty".into());
                    }
                    o.master_addr = v.to_string();
                }
                "standalone" => {
                    o.master_addr = DEFAULT_MASTER_ADDR.into();
                    o.master_port = 0;
                }
                "nnodes" => {
                    let v = value(flag, inline, &mut it)?;
                    // torchrun's `MIN[:MAX]`: a fixed count only.
                    let (min, max) = v.split_once(':').unwrap_or((v, v));
                    o.nnodes = match (min.parse::<usize>(), max.parse::<usize>()) {
                        (Ok(a), Ok(b)) if a == b && a > 0 => a,
                        (Ok(a), Ok(b)) if a > 0 && b > a => {
                            return Err(format!(
                                "launch: `--nnodes {v}`: an elastic range needs torchrun's dynamic rendezvous; give a fixed number of nodes"
                            ));
                        }
                        _ => {
                            return Err(format!(
                                "launch: `--nnodes {v}`: expected a positive number of nodes"
                            ));
                        }
                    };
                }
                "node-rank" => {
                    let v = value(flag, inline, &mut it)?;
                    o.node_rank = v.parse().map_err(|_| {
                        format!("launch: `--node-rank {v}`: expected a node number 0, 1, ...")
                    })?;
                }
                "term-timeout" => {
                    let v = value(flag, inline, &mut it)?;
                    let secs: f64 = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| {
                            format!("launch: `--term-timeout {v}`: expected seconds >= 0")
                        })?;
                    o.term_timeout = Duration::from_secs_f64(secs);
                }
                "max-restarts" => {
                    let v = value(flag, inline, &mut it)?;
                    o.max_restarts = v.parse().map_err(|_| {
                        format!(
                            "launch: `--max-restarts {v}`: expected a number of restarts 0, 1, ..."
                        )
                    })?;
                }
                "monitor-interval" => {
                    let v = value(flag, inline, &mut it)?;
                    let secs: f64 = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s > 0.0)
                        .ok_or_else(|| {
                            format!("launch: `--monitor-interval {v}`: expected seconds > 0")
                        })?;
                    o.monitor_interval = Duration::from_secs_f64(secs);
                }
                _ => {
                    return Err(format!(
                        "launch: unknown option `{arg}`; known: --nproc-per-node, --nnodes, --node-rank, --master-addr, --master-port, --standalone, --max-restarts, --monitor-interval, --term-timeout (the command goes after `--`)"
                    ));
                }
            }
        }
        if o.node_rank >= o.nnodes {
            return Err(format!(
                "launch: `--node-rank {}` is not below `--nnodes {}`: number the nodes 0 to {}",
                o.node_rank,
                o.nnodes,
                o.nnodes - 1
            ));
        }
        if o.nnodes > 1 && o.master_port == 0 {
            return Err(format!(
                "launch: {} nodes must meet on one port: give every node the same `--master-port` (and `--master-addr`, node 0's address); `--standalone` and port 0 are for one node",
                o.nnodes
            ));
        }
        if o.nnodes > 1 && o.max_restarts > 0 {
            return Err(format!(
                "launch: `--max-restarts {}` with {} nodes: restarting needs every node to restart its ranks in the same round, which torchrun's dynamic (c10d) rendezvous arranges and this launcher does not; restart single-node runs, or restart the launchers of every node together (e.g. under your cluster's job scheduler)",
                o.max_restarts, o.nnodes
            ));
        }
        if o.command.is_empty() {
            return Err(
                "launch: no command; usage: cargo xtask launch --nproc-per-node N -- <command> [args]"
                    .into(),
            );
        }
        Ok(o)
    }

    /// The port the ranks meet on: `master_port`, or a free one when it is 0.
    pub fn resolve_port(&self) -> Result<u16, String> {
        if self.master_port != 0 {
            return Ok(self.master_port);
        }
        TcpListener::bind((self.master_addr.as_str(), 0))
            .or_else(|_| TcpListener::bind((DEFAULT_MASTER_ADDR, 0)))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("launch: no free port for the rendezvous: {e}"))
    }
}

/// Where a process sits in the run: its node and its place there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The process's rank on its node (`LOCAL_RANK`).
    pub local_rank: usize,
    /// Processes per node (`LOCAL_WORLD_SIZE`).
    pub nproc_per_node: usize,
    /// The node's rank (`GROUP_RANK`).
    pub node_rank: usize,
    /// Nodes (`GROUP_WORLD_SIZE`).
    pub nnodes: usize,
}

impl Placement {
    /// The global rank: `node_rank * nproc_per_node + local_rank`.
    pub fn rank(&self) -> usize {
        self.node_rank * self.nproc_per_node + self.local_rank
    }

    /// Processes in the run.
    pub fn world(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }
}

/// torchrun's environment for the process at `p`, in the worker group started after
/// `restart` restarts of at most `max_restarts`.
pub fn rank_env(
    p: Placement,
    addr: &str,
    port: u16,
    restart: usize,
    max_restarts: usize,
) -> Vec<(&'static str, String)> {
    let (r, w) = (p.rank().to_string(), p.world().to_string());
    vec![
        ("RANK", r.clone()),
        ("LOCAL_RANK", p.local_rank.to_string()),
        ("GROUP_RANK", p.node_rank.to_string()),
        ("ROLE_RANK", r),
        ("ROLE_NAME", "default".into()),
        ("WORLD_SIZE", w.clone()),
        ("LOCAL_WORLD_SIZE", p.nproc_per_node.to_string()),
        ("GROUP_WORLD_SIZE", p.nnodes.to_string()),
        ("ROLE_WORLD_SIZE", w),
        ("MASTER_ADDR", addr.to_string()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", restart.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", "none".into()),
    ]
}

/// `cargo xtask launch ...`: parses, catches termination signals, launches.
pub fn run(args: &[String]) -> Result<(), String> {
    if matches!(
        args.first().map(String::as_str),
        Some("--help" | "-h" | "help")
    ) {
        print!("{}", crate::USAGE);
        return Ok(());
    }
    let options = Options::parse(args)?;
    signal::catch_termination_signals();
    launch(&options, &Output::standard())
}

/// Copies `reader` to `sink` line by line, each line prefixed.
fn pump(reader: impl Read, prefix: String, sink: Sink, done: mpsc::Sender<()>) {
    let mut r = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut w = sink.lock().unwrap_or_else(|e| e.into_inner());
                let _ = w.write_all(prefix.as_bytes());
                let _ = w.write_all(&line);
                let _ = w.flush();
            }
        }
    }
    let _ = done.send(());
}

/// One rank's end: its exit status, or why it could not be waited for.
type Exit = (usize, Result<ExitStatus, String>);

/// Receives exits until every rank has one or `deadline` passes.
fn collect_exits(
    rx: &Receiver<Exit>,
    exits: &mut [Option<Result<ExitStatus, String>>],
    deadline: Instant,
) {
    while exits.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok((rank, status)) => exits[rank] = Some(status),
            Err(_) if Instant::now() >= deadline => break,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// SIGTERM to every rank's process group, SIGKILL after `grace` to those still running.
fn stop_all(
    pgids: &[u32],
    rx: &Receiver<Exit>,
    exits: &mut [Option<Result<ExitStatus, String>>],
    grace: Duration,
    out: &Output,
) {
    for &pgid in pgids {
        signal::kill_group(pgid, signal::SIGTERM);
        // A stopped rank (SIGSTOP, a debugger) acts on the SIGTERM only once continued.
        signal::kill_group(pgid, signal::SIGCONT);
    }
    collect_exits(rx, exits, Instant::now() + grace);
    let stubborn: Vec<usize> = (0..exits.len()).filter(|&r| exits[r].is_none()).collect();
    if !stubborn.is_empty() {
        out.note(&format!(
            "ranks {stubborn:?} still running {grace:?} after SIGTERM; sending SIGKILL"
        ));
    }
    // Also reaps what a finished rank may have left behind in its group.
    for &pgid in pgids {
        signal::kill_group(pgid, signal::SIGKILL);
    }
    collect_exits(rx, exits, Instant::now() + Duration::from_secs(10));
}

fn describe(status: &Option<Result<ExitStatus, String>>) -> String {
    match status {
        Some(Ok(s)) => s.to_string(),
        Some(Err(e)) => e.clone(),
        None => "still running".into(),
    }
}

/// What a launch shows of its worker groups while they run: the process ids of the group
/// now running and the restarts so far. `cargo xtask soak --ranks` kills ranks through it.
#[derive(Debug, Default)]
pub struct Watch {
    pids: Mutex<Vec<u32>>,
    restarts: AtomicUsize,
    failed_at: Mutex<Option<Instant>>,
}

impl Watch {
    /// The running group's process ids (each rank leads its own process group), local rank
    /// order; empty between groups.
    pub fn pids(&self) -> Vec<u32> {
        self.pids.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Restarts so far (the running group's `TORCHELASTIC_RESTART_COUNT`).
    pub fn restarts(&self) -> usize {
        self.restarts.load(Ordering::SeqCst)
    }

    /// When the launcher last saw a rank fail.
    pub fn failed_at(&self) -> Option<Instant> {
        *self.failed_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_pids(&self, pids: &[u32]) {
        *self.pids.lock().unwrap_or_else(|e| e.into_inner()) = pids.to_vec();
    }
}

/// How one worker group ended.
enum GroupEnd {
    /// Every rank exited 0.
    Succeeded,
    /// A rank failed; the others were stopped. The message names them.
    Failed(String),
    /// The launcher was signalled, or a rank could not be started: no restart.
    Fatal(String),
}

/// Starts the ranks and supervises them until all succeed, or one fails with no restart
/// left, or the launcher is signalled (see the module docs). The error names the failed rank
/// and its exit status.
pub fn launch(options: &Options, out: &Output) -> Result<(), String> {
    launch_watched(options, out, &Watch::default())
}

/// [`launch`], showing its groups in `watch`. A failed group is stopped and started again
/// (torchrun's `_restart_workers`) while restarts are left: the same ranks, the same command,
/// `TORCHELASTIC_RESTART_COUNT` one higher, and a new rendezvous: a fresh free port when
/// `--master-port` is 0, else the same port, where the new rank 0 serves a new store.
pub fn launch_watched(options: &Options, out: &Output, watch: &Watch) -> Result<(), String> {
    let mut port = options.resolve_port()?;
    loop {
        let restart = watch.restarts();
        match run_group(options, out, port, restart, watch) {
            GroupEnd::Succeeded => return Ok(()),
            GroupEnd::Fatal(message) => return Err(message),
            GroupEnd::Failed(message) if restart >= options.max_restarts => {
                return Err(if options.max_restarts > 0 {
                    format!(
                        "{message}; no restart left (--max-restarts {})",
                        options.max_restarts
                    )
                } else {
                    message
                });
            }
            GroupEnd::Failed(message) => {
                let left = options.max_restarts - restart;
                out.note(&format!(
                    "worker group failed: {message}; {left}/{} restarts left, restarting the worker group",
                    options.max_restarts
                ));
                if options.master_port == 0 {
                    port = options.resolve_port()?;
                }
                watch.restarts.store(restart + 1, Ordering::SeqCst);
            }
        }
    }
}

/// Starts one worker group and supervises it to its end.
fn run_group(
    options: &Options,
    out: &Output,
    port: u16,
    restart: usize,
    watch: &Watch,
) -> GroupEnd {
    // `world`: the processes of this node; `global` gives a local index's global rank.
    let world = options.nproc_per_node;
    let place = |local_rank: usize| Placement {
        local_rank,
        nproc_per_node: world,
        node_rank: options.node_rank,
        nnodes: options.nnodes,
    };
    let global = |local: usize| place(local).rank();
    let set_omp = world * options.nnodes > 1 && std::env::var_os("OMP_NUM_THREADS").is_none();
    if set_omp && restart == 0 {
        out.note("setting OMP_NUM_THREADS=1 for each rank (torchrun's default, to avoid overloading the machine); set it to tune");
    }
    let node = if options.nnodes > 1 {
        format!(
            " on node {} of {} (ranks {}..={} of {})",
            options.node_rank,
            options.nnodes,
            global(0),
            global(world - 1),
            place(0).world()
        )
    } else {
        String::new()
    };
    let attempt = if options.max_restarts > 0 {
        format!(" (restart {restart} of at most {})", options.max_restarts)
    } else {
        String::new()
    };
    out.note(&format!(
        "{world} rank(s){node}{attempt}, MASTER_ADDR={} MASTER_PORT={port}: {}",
        options.master_addr,
        options.command.join(" ")
    ));
    let (exit_tx, exit_rx) = mpsc::channel::<Exit>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pgids: Vec<u32> = Vec::with_capacity(world);
    let mut readers = 0usize;
    for rank in 0..world {
        let mut cmd = Command::new(&options.command[0]);
        cmd.args(&options.command[1..])
            .envs(rank_env(
                place(rank),
                &options.master_addr,
                port,
                restart,
                options.max_restarts,
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if set_omp {
            cmd.env("OMP_NUM_THREADS", "1");
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let mut exits = vec![None; rank];
                stop_all(&pgids, &exit_rx, &mut exits, options.term_timeout, out);
                return GroupEnd::Fatal(format!(
                    "launch: could not start rank {} (`{}`): {e}",
                    global(rank),
                    options.command[0]
                ));
            }
        };
        pgids.push(child.id());
        let prefix = format!("[rank {}] ", global(rank));
        if let Some(s) = child.stdout.take() {
            let (p, sink, tx) = (prefix.clone(), Arc::clone(&out.stdout), done_tx.clone());
            std::thread::spawn(move || pump(s, p, sink, tx));
            readers += 1;
        }
        if let Some(s) = child.stderr.take() {
            let (sink, tx) = (Arc::clone(&out.stderr), done_tx.clone());
            std::thread::spawn(move || pump(s, prefix, sink, tx));
            readers += 1;
        }
        let tx = exit_tx.clone();
        std::thread::spawn(move || {
            let status = child
                .wait()
                .map_err(|e| format!("waiting for it failed: {e}"));
            let _ = tx.send((rank, status));
        });
    }
    drop(exit_tx);
    drop(done_tx);
    watch.set_pids(&pgids);

    let mut exits: Vec<Option<Result<ExitStatus, String>>> = vec![None; world];
    let mut failed: Option<usize> = None;
    let mut interrupted: Option<i32> = None;
    while exits.iter().any(Option::is_none) {
        match exit_rx.recv_timeout(options.monitor_interval) {
            Ok((rank, status)) => {
                let ok = matches!(status, Ok(s) if s.success());
                exits[rank] = Some(status);
                if !ok {
                    *watch.failed_at.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now());
                    failed = Some(rank);
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(sig) = signal::received() {
                    interrupted = Some(sig);
                    break;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    watch.set_pids(&[]);
    if failed.is_some() || interrupted.is_some() {
        stop_all(&pgids, &exit_rx, &mut exits, options.term_timeout, out);
    }
    // Let the readers print the last lines (bounded: see READER_GRACE).
    let deadline = Instant::now() + READER_GRACE;
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    let others = |skip: Option<usize>| -> String {
        (0..world)
            .filter(|&r| Some(r) != skip)
            .map(|r| format!("rank {}: {}", global(r), describe(&exits[r])))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(sig) = interrupted {
        return GroupEnd::Fatal(format!(
            "interrupted by signal {sig}; stopped every rank ({})",
            others(None)
        ));
    }
    if let Some(rank) = failed {
        return GroupEnd::Failed(format!(
            "rank {} failed ({}); stopped the other ranks ({})",
            global(rank),
            describe(&exits[rank]),
            others(Some(rank))
        ));
    }
    GroupEnd::Succeeded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn parse(s: &[&str]) -> Result<Options, String> {
        Options::parse(&args(s))
    }

    #[test]
    fn parses_torchrun_flags_in_every_spelling() {
        let o = parse(&["--nproc-per-node", "4", "--", "prog", "--lr", "1"]).unwrap();
        assert_eq!(o.nproc_per_node, 4);
        assert_eq!(o.master_addr, "127.0.0.1");
        assert_eq!(o.master_port, 29500);
        assert_eq!(o.term_timeout, Duration::from_secs(30));
        assert_eq!(
            (o.max_restarts, o.monitor_interval),
            (0, Duration::from_millis(100))
        );
        assert_eq!(o.command, args(&["prog", "--lr", "1"]));

        let o = parse(&[
            "--nproc_per_node=2",
            "--master_addr",
            "10.0.0.1",
            "--master-port=1234",
            "--nnodes=1",
            "--node_rank",
            "0",
            "--term-timeout",
            "0.5",
            "--max_restarts=3",
            "--monitor-interval",
            "5",
            "prog",
            "--flag",
        ])
        .unwrap();
        assert_eq!(o.nproc_per_node, 2);
        assert_eq!(o.master_addr, "10.0.0.1");
        assert_eq!(o.master_port, 1234);
        assert_eq!(o.term_timeout, Duration::from_millis(500));
        assert_eq!(o.max_restarts, 3);
        assert_eq!(o.monitor_interval, Duration::from_secs(5));
        // The first non-flag starts the command; its own flags are not ours.
        assert_eq!(o.command, args(&["prog", "--flag"]));

        let o = parse(&["--standalone", "--", "prog"]).unwrap();
        assert_eq!((o.master_addr.as_str(), o.master_port), ("127.0.0.1", 0));
        assert_eq!(parse(&["prog"]).unwrap().nproc_per_node, 1);
    }

    #[test]
    fn bad_arguments_are_errors_that_say_why() {
        for (bad, says) in [
            (&["--nproc-per-node", "0", "--", "p"][..], "positive"),
            (&["--nproc-per-node", "two", "--", "p"][..], "positive"),
            (&["--nproc-per-node"][..], "needs a value"),
            (&["--master-port", "70000", "--", "p"][..], "0..=65535"),
            (&["--nnodes", "1:4", "--", "p"][..], "elastic range"),
            (
                &["--nnodes", "0", "--", "p"][..],
                "positive number of nodes",
            ),
            (
                &["--node-rank", "1", "--", "p"][..],
                "not below `--nnodes 1`",
            ),
            (
                &["--nnodes", "2", "--standalone", "--", "p"][..],
                "one port",
            ),
            (&["--term-timeout", "-1", "--", "p"][..], "seconds"),
            (
                &["--max-restarts", "-1", "--", "p"][..],
                "number of restarts",
            ),
            (&["--monitor-interval", "0", "--", "p"][..], "seconds > 0"),
            (
                &[
                    "--nnodes",
                    "2",
                    "--master-port",
                    "1",
                    "--max-restarts",
                    "1",
                    "--",
                    "p",
                ][..],
                "dynamic (c10d) rendezvous",
            ),
            (&["--rdzv-backend", "c10d", "--", "p"][..], "unknown option"),
            (&["--nproc-per-node", "2"][..], "no command"),
            (&["--nproc-per-node", "2", "--"][..], "no command"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn port_zero_picks_a_free_port() {
        let o = parse(&["--master-port", "0", "--", "p"]).unwrap();
        let port = o.resolve_port().unwrap();
        assert_ne!(port, 0);
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
        assert_eq!(parse(&["--", "p"]).unwrap().resolve_port().unwrap(), 29500);
    }

    #[test]
    fn rank_env_follows_torchrun() {
        let env = rank_env(
            Placement {
                local_rank: 1,
                nproc_per_node: 3,
                node_rank: 0,
                nnodes: 1,
            },
            "127.0.0.1",
            4242,
            2,
            5,
        );
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("1"));
        assert_eq!(get("LOCAL_RANK"), Some("1"));
        assert_eq!(get("WORLD_SIZE"), Some("3"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("3"));
        assert_eq!(get("MASTER_ADDR"), Some("127.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("4242"));
        assert_eq!(get("GROUP_RANK"), Some("0"));
        assert_eq!(get("TORCHELASTIC_RESTART_COUNT"), Some("2"));
        assert_eq!(get("TORCHELASTIC_MAX_RESTARTS"), Some("5"));
    }

    struct Captured {
        out: Output,
        stdout: Arc<Mutex<Vec<u8>>>,
        stderr: Arc<Mutex<Vec<u8>>>,
    }

    impl Captured {
        fn new() -> Self {
            let stdout = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let out = Output {
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            };
            Self {
                out,
                stdout,
                stderr,
            }
        }

        fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
            String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
        }
    }

    fn sh(nproc: usize, script: &str, term_timeout: f64) -> Options {
        Options {
            nproc_per_node: nproc,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            term_timeout: Duration::from_secs_f64(term_timeout),
            max_restarts: 0,
            monitor_interval: DEFAULT_MONITOR_INTERVAL,
            command: args(&["sh", "-c", script]),
        }
    }

    /// The `[rank R] restart C of M at PORT` lines of a script that echoes them, sorted.
    fn attempts(stdout: &str) -> Vec<(usize, usize, usize, u16)> {
        let mut seen: Vec<_> = stdout
            .lines()
            .filter_map(|l| {
                let v: Vec<&str> = l.split_whitespace().collect();
                match v.as_slice() {
                    ["[rank", r, "restart", c, "of", m, "at", p] => Some((
                        c.parse().ok()?,
                        r.trim_end_matches(']').parse().ok()?,
                        m.parse().ok()?,
                        p.parse().ok()?,
                    )),
                    _ => None,
                }
            })
            .map(|(c, r, m, p)| (r, c, m, p))
            .collect();
        seen.sort_by_key(|&(r, c, _, _)| (c, r));
        seen
    }

    /// Echoes the group's restart line, then marks it done in `$SYNC` (a folder).
    const ECHO_ATTEMPT: &str = "echo \"restart $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS at $MASTER_PORT\"; touch \"$SYNC/$TORCHELASTIC_RESTART_COUNT-$RANK\"; ";
    /// Waits until both ranks of the group have echoed their line: a rank failing at once
    /// would otherwise get the other stopped before its line, on a busy machine.
    const WAIT_BOTH: &str = "while [ ! -e \"$SYNC/$TORCHELASTIC_RESTART_COUNT-0\" ] || [ ! -e \"$SYNC/$TORCHELASTIC_RESTART_COUNT-1\" ]; do sleep 0.02; done; ";

    /// [`sh`] with `$SYNC` a fresh folder (see [`ECHO_ATTEMPT`]).
    fn synced(script: &str, term_timeout: f64, name: &str) -> Options {
        let sync = std::env::temp_dir().join(format!("launch-sync-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sync);
        std::fs::create_dir_all(&sync).unwrap();
        sh(
            2,
            &format!("SYNC='{}'; {script}", sync.display()),
            term_timeout,
        )
    }

    /// torchrun's `--max-restarts`: rank 1 fails in the first two groups; each failure stops
    /// the group and starts it again with `TORCHELASTIC_RESTART_COUNT` one higher and, with
    /// `--master-port 0`, a new port; the third group succeeds and so does the launch.
    #[test]
    fn a_failed_group_is_restarted_until_it_succeeds() {
        let c = Captured::new();
        let mut o = synced(
            &format!(
                "{ECHO_ATTEMPT}{WAIT_BOTH}if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ]; then exit 3; fi; sleep 0.2"
            ),
            30.0,
            "until-success",
        );
        o.max_restarts = 3;
        let watch = Watch::default();
        launch_watched(&o, &c.out, &watch).unwrap();
        assert_eq!(watch.restarts(), 2);
        assert!(watch.pids().is_empty());
        let seen = attempts(&Captured::text(&c.stdout));
        let got: Vec<(usize, usize, usize)> = seen.iter().map(|&(r, c, m, _)| (r, c, m)).collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 3),
                (1, 0, 3),
                (0, 1, 3),
                (1, 1, 3),
                (0, 2, 3),
                (1, 2, 3)
            ],
            "{seen:?}"
        );
        for group in seen.chunks(2) {
            assert_eq!(group[0].3, group[1].3, "{seen:?}");
        }
        assert_ne!(seen[0].3, seen[2].3, "a new rendezvous port: {seen:?}");
        let stderr = Captured::text(&c.stderr);
        assert!(
            stderr.contains("worker group failed: rank 1 failed (exit status: 3)")
                && stderr.contains("3/3 restarts left")
                && stderr.contains("2/3 restarts left")
                && !stderr.contains("1/3 restarts left"),
            "{stderr}"
        );
    }

    /// With no restart left the launch fails naming the rank, its status and the limit;
    /// a fixed `--master-port` is kept across restarts.
    #[test]
    fn a_group_failing_past_its_restarts_fails_the_launch() {
        let c = Captured::new();
        let port = parse(&["--standalone", "p"])
            .unwrap()
            .resolve_port()
            .unwrap();
        let mut o = synced(
            &format!("{ECHO_ATTEMPT}{WAIT_BOTH}[ \"$RANK\" = 0 ] && exit 7; sleep 30"),
            30.0,
            "past-restarts",
        );
        o.master_port = port;
        o.max_restarts = 2;
        let err = launch(&o, &c.out).unwrap_err();
        assert!(
            err.starts_with("rank 0 failed (exit status: 7)")
                && err.contains("rank 1: signal: 15 (SIGTERM)")
                && err.ends_with("no restart left (--max-restarts 2)"),
            "{err}"
        );
        let seen = attempts(&Captured::text(&c.stdout));
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!(
            seen.iter().all(|&(_, _, m, p)| m == 2 && p == port),
            "{seen:?}"
        );
    }

    /// A rank that stops answering (SIGSTOP): another rank notices (here it just fails, as
    /// a rank's collective does after `ddp_timeout`), and the stopped rank is continued with
    /// the SIGTERM so that it ends at once rather than after the SIGKILL grace.
    #[test]
    fn a_stopped_rank_is_ended_and_its_group_restarted() {
        let c = Captured::new();
        let mut o = synced(
            &format!(
                "{ECHO_ATTEMPT}if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then if [ \"$RANK\" = 1 ]; then kill -STOP $$; else {WAIT_BOTH}sleep 0.5; exit 1; fi; fi"
            ),
            60.0,
            "stopped",
        );
        o.max_restarts = 1;
        let start = Instant::now();
        launch(&o, &c.out).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the stopped rank waited for the SIGKILL grace: {:?}",
            start.elapsed()
        );
        let stderr = Captured::text(&c.stderr);
        assert!(
            stderr.contains("rank 1: signal: 15 (SIGTERM)") && !stderr.contains("SIGKILL"),
            "{stderr}"
        );
        assert_eq!(attempts(&Captured::text(&c.stdout)).len(), 4);
    }

    /// Two "nodes" on this machine, two processes each, launched side by side as on two
    /// hosts: the four processes get the global ranks 0..3 once each, their node's
    /// `GROUP_RANK` and local ranks, and the same rendezvous address.
    #[test]
    fn two_nodes_give_torchrun_s_multi_node_env() {
        let port = Options::parse(&args(&["--standalone", "p"]))
            .unwrap()
            .resolve_port()
            .unwrap()
            .to_string();
        let script = "echo \"$RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT\"";
        let nodes: Vec<_> = (0..2)
            .map(|node| {
                let o = Options::parse(&args(&[
                    "--nnodes",
                    "2",
                    "--node-rank",
                    &node.to_string(),
                    "--nproc-per-node",
                    "2",
                    "--master-port",
                    &port,
                    "--",
                    "sh",
                    "-c",
                    script,
                ]))
                .unwrap();
                std::thread::spawn(move || {
                    let c = Captured::new();
                    launch(&o, &c.out).unwrap();
                    (Captured::text(&c.stdout), Captured::text(&c.stderr))
                })
            })
            .collect();
        let mut lines = Vec::new();
        for (node, handle) in nodes.into_iter().enumerate() {
            let (stdout, stderr) = handle.join().unwrap();
            assert!(
                stderr.contains(&format!(
                    "on node {node} of 2 (ranks {}..={} of 4)",
                    2 * node,
                    2 * node + 1
                )),
                "{stderr}"
            );
            lines.extend(stdout.lines().map(str::to_string));
        }
        lines.sort();
        let want: Vec<String> = (0..4)
            .map(|rank| {
                format!(
                    "[rank {rank}] {rank} {} {} 4 2 2 {rank} 4 127.0.0.1:{port}",
                    rank % 2,
                    rank / 2
                )
            })
            .collect();
        assert_eq!(lines, want);
    }

    #[test]
    fn ranks_get_torchrun_env_and_prefixed_output() {
        let c = Captured::new();
        let o = sh(
            2,
            "echo \"env $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT omp $OMP_NUM_THREADS\"; echo oops >&2; printf 'no newline'",
            30.0,
        );
        launch(&o, &c.out).unwrap();
        let stdout = Captured::text(&c.stdout);
        let stderr = Captured::text(&c.stderr);
        for rank in 0..2 {
            let line = stdout
                .lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "[rank {rank}] env {rank}/2 local {rank}/2 at 127.0.0.1:"
                    ))
                })
                .unwrap_or_else(|| panic!("no env line of rank {rank} in {stdout:?}"));
            let port: u16 = line
                .rsplit(':')
                .next()
                .and_then(|p| p.split_whitespace().next())
                .and_then(|p| p.parse().ok())
                .unwrap();
            assert_ne!(port, 0);
            assert!(
                stdout.contains(&format!("[rank {rank}] no newline\n")),
                "{stdout:?}"
            );
            assert!(
                stderr.contains(&format!("[rank {rank}] oops\n")),
                "{stderr:?}"
            );
        }
        assert_eq!(stdout.lines().count(), 4, "{stdout:?}");
    }

    #[test]
    fn a_failed_rank_stops_the_others_and_is_named() {
        let c = Captured::new();
        // Rank 1 fails at once; rank 0 would sleep for a minute but is stopped by SIGTERM.
        let o = sh(
            3,
            "if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; exec sleep 60",
            30.0,
        );
        let start = Instant::now();
        let err = launch(&o, &c.out).unwrap_err();
        assert!(err.starts_with("rank 1 failed (exit status: 3)"), "{err}");
        assert!(err.contains("rank 0: signal: 15 (SIGTERM)"), "{err}");
        assert!(err.contains("rank 2: signal: 15 (SIGTERM)"), "{err}");
        assert!(Captured::text(&c.stdout).contains("[rank 1] failing\n"));
        // Far below the 60 s the survivors would have slept (not a timing assertion on
        // the machine's speed: it only shows nobody waited for them).
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn ranks_ignoring_sigterm_are_killed_after_the_grace_period() {
        let c = Captured::new();
        let o = sh(
            2,
            // Rank 1 fails once rank 0 has had time to ignore SIGTERM (else the SIGTERM can
            // reach rank 0's shell before its `trap`).
            "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 5; fi; trap '' TERM; sleep 60",
            0.5,
        );
        let err = launch(&o, &c.out).unwrap_err();
        assert!(err.starts_with("rank 1 failed (exit status: 5)"), "{err}");
        assert!(err.contains("rank 0: signal: 9 (SIGKILL)"), "{err}");
        assert!(
            Captured::text(&c.stderr).contains("still running"),
            "{}",
            Captured::text(&c.stderr)
        );
    }

    #[test]
    fn a_missing_program_is_an_error_naming_it() {
        let c = Captured::new();
        let mut o = sh(2, "true", 1.0);
        o.command = args(&["/nonexistent/tchtrain-program"]);
        let err = launch(&o, &c.out).unwrap_err();
        assert!(err.contains("could not start rank 0"), "{err}");
        assert!(err.contains("/nonexistent/tchtrain-program"), "{err}");
    }
}
