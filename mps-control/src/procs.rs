//! Finding processes by what their environment holds, through `/proc`: how mmk tells its
//! own processes (MPS daemons, job processes) from everything else on the node.

/// A process's environment, as `/proc/PID/environ` holds it.
#[derive(Debug)]
pub struct Environ(Vec<u8>);

impl Environ {
    /// Whether the environment holds exactly `KEY=VALUE`.
    pub fn has(&self, key_value: &str) -> bool {
        self.entries().any(|kv| kv == key_value.as_bytes())
    }

    /// Whether the environment sets `key` at all.
    pub fn has_key(&self, key: &str) -> bool {
        self.value(key).is_some()
    }

    /// The value of `key`, when the environment sets it.
    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.entries().find_map(|kv| {
            (kv.len() > key.len() && kv.starts_with(key.as_bytes()) && kv[key.len()] == b'=')
                .then(|| &kv[key.len() + 1..])
        })
    }

    fn entries(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|b| *b == 0)
    }
}

/// The most of a process's environment mmk reads.
const MAX_ENVIRON_BYTES: u64 = 1 << 20;

/// The environment process `pid` started with (at most the first MiB of it); `None` when
/// it cannot be read (gone, or another user's unless we are root).
pub fn environ(pid: i32) -> Option<Environ> {
    use std::io::Read as _;
    let mut env = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .take(MAX_ENVIRON_BYTES)
        .read_to_end(&mut env)
        .ok()?;
    Some(Environ(env))
}

/// The pids of processes whose environment satisfies `pred`. Processes whose environment
/// we may not read (other users', unless we are root) are never matched.
pub fn scan(pred: impl Fn(&Environ) -> bool) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| environ(*pid).is_some_and(|env| !env.0.is_empty() && pred(&env)))
        .collect()
}

/// Whether a process exists and has not exited (a zombie has).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold any
        // character: read it after the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sends `sig`; true when it was delivered.
pub fn kill(pid: i32, sig: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with a positive pid; no memory involved.
    unsafe { libc::kill(pid, sig) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_matches_whole_entries() {
        let e = Environ(b"A=1\0PATH=/bin\0CUDA_MPS_PIPE_DIRECTORY=/x/pipe\0".to_vec());
        assert!(e.has("A=1"));
        assert!(!e.has("A=12"));
        assert!(e.has("CUDA_MPS_PIPE_DIRECTORY=/x/pipe"));
        assert!(!e.has("CUDA_MPS_PIPE_DIRECTORY=/x"));
        assert!(e.has_key("PATH"));
        assert!(!e.has_key("PAT"));
        assert_eq!(e.value("A"), Some(&b"1"[..]));
        assert_eq!(e.value("PAT"), None);
    }

    #[test]
    fn a_child_is_found_by_its_environment_and_seen_to_die() {
        let marker = format!("MMK_PROCS_TEST={}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("MMK_PROCS_TEST", std::process::id().to_string())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Until the child has exec'd, /proc shows the parent's environment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while scan(|e| e.has(&marker)).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(scan(|e| e.has(&marker)), [pid]);
        assert!(alive(pid));
        assert!(kill(pid, libc::SIGKILL));
        // Not reaped yet: a zombie is not alive.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!alive(pid));
        child.wait().unwrap();
        assert!(!alive(pid));
        assert!(scan(|e| e.has(&marker)).is_empty());
    }
}
