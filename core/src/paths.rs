//! Default locations, shared by mmkd and mmkctl so that both find the same socket, and
//! the one rule for where mmk's interposer goes in `LD_PRELOAD`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The environment variable that overrides the socket path for both mmkd and mmkctl.
pub const SOCKET_ENV: &str = "MMK_SOCKET";

fn uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The node's socket: where root's mmkd (the Debian package's unit) listens.
pub const NODE_SOCKET: &str = "/run/mmk/mmkd.sock";

/// Where mmkd listens unless told: [`NODE_SOCKET`] for root; otherwise
/// `$XDG_RUNTIME_DIR/mmk/mmkd.sock`, or `/tmp/mmk-$UID/mmkd.sock` when XDG_RUNTIME_DIR is
/// unset (a user's own mmkd).
pub fn default_socket() -> PathBuf {
    let uid = uid();
    if uid == 0 {
        return PathBuf::from(NODE_SOCKET);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("mmk/mmkd.sock"),
        None => PathBuf::from(format!("/tmp/mmk-{uid}/mmkd.sock")),
    }
}

/// The socket a client calls unless told: the node's when the node runs mmkd (its folder
/// `/run/mmk` is there, whether or not this user may enter it: the error then says so),
/// else the user's own mmkd's ([`default_socket`]).
pub fn client_socket() -> PathBuf {
    let node = std::path::Path::new(NODE_SOCKET);
    choose_socket(
        uid() == 0 || node.parent().is_some_and(std::path::Path::exists),
        default_socket,
    )
}

fn choose_socket(node_runs_mmkd: bool, own: impl FnOnce() -> PathBuf) -> PathBuf {
    if node_runs_mmkd {
        PathBuf::from(NODE_SOCKET)
    } else {
        own()
    }
}

/// `/var/lib/mmk` for root; otherwise `$XDG_DATA_HOME/mmk` or `~/.local/share/mmk`.
pub fn default_data_dir() -> PathBuf {
    if uid() == 0 {
        return PathBuf::from("/var/lib/mmk");
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("mmk");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(h) => PathBuf::from(h).join(".local/share/mmk"),
        None => PathBuf::from(format!("/tmp/mmk-{}/data", uid())),
    }
}

/// `LD_PRELOAD` with `first` (mmk's interposer) ahead of what the job preloads itself.
pub fn preload_first(first: &str, own: Option<&str>) -> String {
    match own {
        Some(own) if !own.is_empty() => format!("{first}:{own}"),
        _ => first.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_calls_the_nodes_mmkd_where_there_is_one() {
        let own = || PathBuf::from("/tmp/mmk-1000/mmkd.sock");
        assert_eq!(choose_socket(true, own), PathBuf::from(NODE_SOCKET));
        assert_eq!(choose_socket(false, own), own());
        assert_eq!(preload_first("/lib/a.so", Some("b.so")), "/lib/a.so:b.so");
    }
}
