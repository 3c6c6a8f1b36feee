//! A fake `nvidia-cuda-mps-control`: the same command line, environment and control
//! commands, with no GPU. CI and `mmkd --backend sim` run it in place of the real one.
//!
//! - `-d` starts the daemon in the background and returns once it answers; `-f` runs it in
//!   the foreground. The daemon writes `nvidia-cuda-mps-control.pid` in
//!   `CUDA_MPS_PIPE_DIRECTORY`, logs to `control.log` in `CUDA_MPS_LOG_DIRECTORY`, and
//!   listens on a Unix socket `control` in the pipe directory.
//! - With no argument it is the client: it reads commands from stdin, one per line, and
//!   prints the replies, as `echo get_server_list | nvidia-cuda-mps-control` does. It
//!   exits 1 when the daemon cannot be reached or a command fails.
//! - Like the real daemon it starts a server process for the first client, stops its
//!   servers on `quit`, and keeps a server's status. A server that is not ready (after a
//!   client's fatal fault) refuses new clients until the clients it had then have exited.
//!
//! Commands of the real daemon: `get_server_list`, `get_server_status PID`,
//! `get_client_list PID`, `start_server -uid UID`, `set_default_active_thread_percentage P`,
//! `get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV VALUE`,
//! `get_default_device_pinned_mem_limit DEV`, `terminate_client SERVER CLIENT`, `quit`.
//!
//! Commands for tests only: `fake_client PID` (a CUDA process connects: the server starts
//! if there is none; a client of another user than the server's is refused with `queued`
//! while that server has live clients, as the real daemon holds it, and gets a server of
//! its user's once they are gone), `fake_fault` (a client faults: the server is not ready),
//! `fake_kill_server` (the server crashes).
//!
//! The daemon and its server exit by themselves when their pipe directory disappears, so
//! that a test that dies leaves nothing running.
//!
//! What it copies was seen on an H200 (lab/scripts/gpu/mps-smoke.sh): the pid file, `ACTIVE`
//! as a server's status, `100.0` after setting 100 (and after 140), a limit set as `4096M`
//! read back as `4G`, and `Unknown command "..."` with exit status 0. Other errors (a bad
//! pid) make the fake's client exit 1; what the real one prints for them is not known.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::{PID_FILE, format_mem, parse_mem, procs};

/// The socket in the pipe directory.
const SOCKET: &str = "control";
/// What a server reports when it accepts clients, and when it does not (the status text
/// the real daemon prints).
pub const STATUS_ACTIVE: &str = "ACTIVE";
pub const STATUS_NOT_READY: &str = "FAULT";

/// Runs the fake control program with `args` (after the program name). `reexec` is what
/// runs this program again: empty for the standalone binary, or the arguments that select
/// the fake in a program that embeds it (`mmkd fake-mps-control`).
pub fn main(args: Vec<OsString>, reexec: &[OsString]) -> ExitCode {
    let Some(pipe) = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").map(PathBuf::from) else {
        eprintln!("CUDA_MPS_PIPE_DIRECTORY is not set");
        return ExitCode::FAILURE;
    };
    let log = std::env::var_os("CUDA_MPS_LOG_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| pipe.clone());
    let first = args.first().and_then(|a| a.to_str());
    let result = match first {
        Some("-d") => background(&pipe, &log, reexec),
        Some("-f") => Daemon::new(pipe, log).and_then(Daemon::serve),
        Some("--server") => server(&pipe),
        None => client(&pipe),
        Some(other) => Err(format!("unknown option {other:?} (use -d, -f or none)")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Sends one command; `Ok(reply)` or `Err(what failed)`.
fn request(pipe: &Path, command: &str) -> std::io::Result<Result<String, String>> {
    let mut s = connect(pipe)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(command.as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (status, body) = reply.split_once('\n').unwrap_or((reply.as_str(), ""));
    Ok(match status {
        "ok" => Ok(body.to_owned()),
        _ => Err(body.trim_end().to_owned()),
    })
}

/// Connects by a relative path from the pipe directory: a Unix socket path is limited to
/// 107 bytes and a data dir may be deep.
fn connect(pipe: &Path) -> std::io::Result<UnixStream> {
    std::env::set_current_dir(pipe)?;
    UnixStream::connect(SOCKET)
}

fn client(pipe: &Path) -> Result<(), String> {
    let mut failed = false;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("cannot read stdin: {e}"))?;
        let command = line.trim();
        if command.is_empty() {
            continue;
        }
        match request(pipe, command) {
            Ok(Ok(reply)) => print!("{reply}"),
            Ok(Err(why)) => {
                eprintln!("{why}");
                failed = true;
            }
            Err(_) => return Err("Cannot find MPS control daemon process".into()),
        }
    }
    if failed {
        return Err("a command failed".into());
    }
    Ok(())
}

/// `-d`: starts `-f` in its own session and waits until it answers.
fn background(pipe: &Path, log: &Path, reexec: &[OsString]) -> Result<(), String> {
    if request(pipe, "get_server_list").is_ok() {
        return Err("An instance of this daemon is already running".into());
    }
    for d in [pipe, log] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log.join("control.log"))
        .map_err(|e| format!("cannot open control.log: {e}"))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open control.log: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(reexec)
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!(
                "the daemon exited at start ({st}); see control.log"
            ));
        }
        if request(pipe, "get_server_list").is_ok() {
            // The daemon lives on by itself; its parent (init or a subreaper) reaps it.
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    Err("the daemon did not answer within 5 s".into())
}

/// `--server`: stands for nvidia-cuda-mps-server; lives until killed or until its pipe
/// directory is gone.
fn server(pipe: &Path) -> Result<(), String> {
    while pipe.is_dir() {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[derive(Debug)]
struct Server {
    child: Child,
    uid: u32,
    clients: Vec<u32>,
    /// Set after a fault: the clients that must exit before the server is ready again.
    fault: Option<Vec<u32>>,
}

#[derive(Debug)]
struct Daemon {
    pipe: PathBuf,
    log: PathBuf,
    device: String,
    thread_percentage: f64,
    pinned_mem: BTreeMap<String, String>,
    server: Option<Server>,
    listener: UnixListener,
}

impl Daemon {
    fn new(pipe: PathBuf, log: PathBuf) -> Result<Daemon, String> {
        std::env::set_current_dir(&pipe)
            .map_err(|e| format!("cannot enter {}: {e}", pipe.display()))?;
        let _ = std::fs::remove_file(SOCKET);
        let listener =
            UnixListener::bind(SOCKET).map_err(|e| format!("cannot listen on control: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot listen on control: {e}"))?;
        std::fs::write(PID_FILE, format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot write {PID_FILE}: {e}"))?;
        let d = Daemon {
            pipe,
            log,
            device: std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
            thread_percentage: 100.0,
            pinned_mem: BTreeMap::new(),
            server: None,
            listener,
        };
        d.note(&format!("control daemon started for device {:?}", d.device));
        Ok(d)
    }

    fn note(&self, line: &str) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log.join("control.log"))
        {
            let _ = writeln!(f, "[fake] {line}");
        }
    }

    fn serve(mut self) -> Result<(), String> {
        loop {
            if !self.pipe.join(SOCKET).exists() {
                self.stop_server();
                return Ok(());
            }
            self.tend();
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.handle(stream) {
                        self.note("quit");
                        self.stop_server();
                        let _ = std::fs::remove_file(self.pipe.join(PID_FILE));
                        let _ = std::fs::remove_file(self.pipe.join(SOCKET));
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        }
    }

    /// Reaps a server that died, forgets clients that exited, ends a fault whose clients
    /// are all gone.
    fn tend(&mut self) {
        if let Some(s) = &mut self.server {
            if let Ok(Some(st)) = s.child.try_wait() {
                let pid = s.child.id();
                self.server = None;
                self.note(&format!("server {pid} exited ({st})"));
                return;
            }
            s.clients.retain(|c| procs::alive(*c as i32));
            if let Some(waiting) = &mut s.fault {
                waiting.retain(|c| procs::alive(*c as i32));
                if waiting.is_empty() {
                    s.fault = None;
                }
            }
        }
    }

    fn stop_server(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }

    /// Answers one connection; true when it asked the daemon to quit.
    fn handle(&mut self, mut stream: UnixStream) -> bool {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        if std::io::BufReader::new(&stream)
            .read_line(&mut line)
            .is_err()
        {
            return false;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (reply, quit) = match self.command(&words) {
            Ok(body) => (format!("ok\n{body}"), words.first() == Some(&"quit")),
            Err(why) => (format!("error\n{why}\n"), false),
        };
        self.note(line.trim());
        let _ = stream.write_all(reply.as_bytes());
        quit
    }

    fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().map(|s| s.child.id())
    }

    fn command(&mut self, words: &[&str]) -> Result<String, String> {
        let num = |i: usize| -> Result<u32, String> {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("{}: argument {i} must be a number", words[0]))
        };
        let own_server = |pid: u32, this: &Daemon| -> Result<(), String> {
            if this.server_pid() == Some(pid) {
                Ok(())
            } else {
                Err(format!("no server with pid {pid}"))
            }
        };
        match words {
            [] => Err("empty command".into()),
            ["get_server_list"] => Ok(self
                .server_pid()
                .map_or(String::new(), |p| format!("{p}\n"))),
            ["get_server_status", _] => {
                own_server(num(1)?, self)?;
                let faulted = self.server.as_ref().is_some_and(|s| s.fault.is_some());
                Ok(format!(
                    "{}\n",
                    if faulted {
                        STATUS_NOT_READY
                    } else {
                        STATUS_ACTIVE
                    }
                ))
            }
            ["get_client_list", _] => {
                own_server(num(1)?, self)?;
                let s = self
                    .server
                    .as_ref()
                    .map(|s| s.clients.clone())
                    .unwrap_or_default();
                Ok(s.iter().map(|c| format!("{c}\n")).collect())
            }
            ["start_server", "-uid", _] => {
                let uid = num(2)?;
                self.start_server(uid)?;
                Ok(String::new())
            }
            ["set_default_active_thread_percentage", p] => {
                // As the real daemon: a value over 100 is taken as 100.
                let v: f64 = p
                    .parse()
                    .ok()
                    .filter(|v: &f64| *v > 0.0)
                    .ok_or_else(|| format!("invalid thread percentage {p:?}"))?;
                self.thread_percentage = v.min(100.0);
                Ok(format!("{:.1}\n", self.thread_percentage))
            }
            ["get_default_active_thread_percentage"] => {
                Ok(format!("{:.1}\n", self.thread_percentage))
            }
            ["set_default_device_pinned_mem_limit", dev, value] => {
                let bytes =
                    parse_mem(value).ok_or_else(|| format!("invalid memory limit {value:?}"))?;
                // Read back in the largest unit that divides it, as the real one does.
                self.pinned_mem.insert((*dev).to_owned(), format_mem(bytes));
                Ok(String::new())
            }
            ["get_default_device_pinned_mem_limit", dev] => Ok(self
                .pinned_mem
                .get(*dev)
                .map_or("0\n".to_owned(), |v| format!("{v}\n"))),
            ["terminate_client", _, _] => {
                let (server, client) = (num(1)?, num(2)?);
                own_server(server, self)?;
                let s = self.server.as_mut().ok_or("no server")?;
                if !s.clients.contains(&client) {
                    return Err(format!("no client {client} on server {server}"));
                }
                procs::kill(client as i32, libc::SIGTERM);
                s.clients.retain(|c| *c != client);
                Ok(String::new())
            }
            ["quit"] => Ok(String::new()),
            ["fake_client", _] => {
                let pid = num(1)?;
                if self.server.as_ref().is_some_and(|s| s.fault.is_some()) {
                    return Err("cudaErrorMpsServerNotReady".into());
                }
                // One user's server at a time, as the real daemon: a client of another
                // user waits until the running server's clients are gone (the real
                // client blocks; this one is refused, saying so), and the next server
                // is that user's.
                let uid = owner_of(pid).unwrap_or(0);
                if let Some(s) = &mut self.server
                    && s.uid != uid
                {
                    s.clients.retain(|c| procs::alive(*c as i32));
                    if !s.clients.is_empty() {
                        return Err(format!(
                            "queued: the server of uid {} has clients; MPS serves one user at a time",
                            s.uid
                        ));
                    }
                    let mut done = self.server.take().expect("checked above");
                    let _ = done.child.kill();
                    let _ = done.child.wait();
                    self.note(&format!("server of uid {} exited: no clients", done.uid));
                }
                if self.server.is_none() {
                    self.start_server(uid)?;
                }
                if let Some(s) = &mut self.server {
                    s.clients.push(pid);
                }
                Ok(String::new())
            }
            ["fake_fault"] => {
                let s = self.server.as_mut().ok_or("no server")?;
                s.fault = Some(s.clients.clone());
                Ok(String::new())
            }
            ["fake_kill_server"] => {
                let s = self.server.as_mut().ok_or("no server")?;
                let _ = s.child.kill();
                Ok(String::new())
            }
            // The real daemon answers this, and its client still exits 0.
            _ => Ok(format!("Unknown command {:?}\n", words.join(" "))),
        }
    }

    fn start_server(&mut self, uid: u32) -> Result<(), String> {
        if let Some(s) = &self.server {
            return if s.uid == uid {
                Ok(())
            } else {
                Err(format!("a server for uid {} is running", s.uid))
            };
        }
        let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
        let mut cmd = Command::new(exe);
        // The embedding program's selector (if any) is the daemon's own argv minus "-f".
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        let prefix = &args[..args.len().saturating_sub(1)];
        let child = cmd
            .args(prefix)
            .arg("--server")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start a server: {e}"))?;
        self.note(&format!("server {} started for uid {uid}", child.id()));
        self.server = Some(Server {
            child,
            uid,
            clients: Vec::new(),
            fault: None,
        });
        Ok(())
    }
}

/// The uid that owns a process.
fn owner_of(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}
