//! Default locations, shared by mmkd and mmkctl so that both find the same socket, and
//! the one rule for where mmk's interposer goes in `LD_PRELOAD`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The environment variable that overrides the socket path for both mmkd and mmkctl.
pub const SOCKET_ENV: &str = "MMK_SOCKET";

fn uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// `/run/mmk/mmkd.sock` for root; otherwise `$XDG_RUNTIME_DIR/mmk/mmkd.sock`, or
/// `/tmp/mmk-$UID/mmkd.sock` when XDG_RUNTIME_DIR is unset.
pub fn default_socket() -> PathBuf {
    let uid = uid();
    if uid == 0 {
        return PathBuf::from("/run/mmk/mmkd.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("mmk/mmkd.sock"),
        None => PathBuf::from(format!("/tmp/mmk-{uid}/mmkd.sock")),
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
