use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use super::*;
use crate::gate::Gate;
use crate::policy::{Class, PolicyKind};

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A user that is not the test's (nobody), for the checks that need root to make a file
/// of another user.
const NOBODY: GateOwner = GateOwner {
    uid: 65534,
    gid: 65534,
};

fn config() -> GateConfig {
    GateConfig::new(66, PolicyKind::Mmk)
}

#[test]
fn the_folder_is_made_for_mmkd_alone_and_a_planted_one_is_refused() {
    let top = tempfile::tempdir().unwrap();
    let path = top.path().join("run/gates");
    let dir = GateDir::open(&path).unwrap();
    let meta = std::fs::metadata(dir.path()).unwrap();
    assert_eq!(
        meta.mode() & 0o7777,
        0o711,
        "users reach their gate, list nothing"
    );

    // Others may write it.
    let open = top.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let why = GateDir::open(&open).unwrap_err().to_string();
    assert!(why.contains("other users may write it"), "{why}");

    // A link to a folder, even a good one.
    let link = top.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let why = GateDir::open(&link).unwrap_err().to_string();
    assert!(why.contains("a link"), "{why}");

    // Under a folder others may write (not sticky): they could swap the gate folder.
    let shared = top.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let why = GateDir::open(&shared.join("gates"))
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("other users may write") && why.contains("shared"),
        "{why}"
    );
    // Sticky, like /dev/shm: allowed above the gate folder.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    GateDir::open(&shared.join("gates")).unwrap();

    assert!(
        GateDir::open(Path::new("relative/gates"))
            .unwrap_err()
            .to_string()
            .contains("absolute")
    );

    if !root() {
        eprintln!("skipped the other user's folder: not root");
        return;
    }
    // Made first by another user (in a sticky /dev/shm, say).
    let planted = shared.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY.uid), Some(NOBODY.gid)).unwrap();
    let why = GateDir::open(&planted).unwrap_err().to_string();
    assert!(why.contains("belongs to uid 65534"), "{why}");
}

#[test]
fn a_gate_is_its_owners_alone_and_no_link_is_followed() {
    let top = tempfile::tempdir().unwrap();
    let dir = GateDir::open(&top.path().join("gates")).unwrap();
    let owner = if root() { NOBODY } else { GateOwner::current() };

    // A link planted where the gate goes, to a file the link's maker could not write.
    let victim = top.path().join("victim");
    std::fs::write(&victim, b"root's file").unwrap();
    std::os::unix::fs::symlink(&victim, dir.gate_path("g0i1")).unwrap();
    let gate = dir.prepare("g0i1", &config(), owner).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's file", "untouched");
    let meta = std::fs::symlink_metadata(dir.gate_path("g0i1")).unwrap();
    assert!(meta.file_type().is_file(), "the link was replaced");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (owner.uid, owner.gid));
    assert_eq!(gate.owner_uid(), owner.uid);
    assert_eq!(meta.len(), SEGMENT_BYTES as u64);
    assert_eq!(gate.snapshot().unwrap().config(), config());

    // Nothing but the gate is left in the folder: the temporary name is gone.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["g0i1.gate"]);

    // A half-made gate of a crash is removed when the folder is opened again.
    std::fs::write(dir.path().join(".g0i2.0123456789abcdef.new"), b"").unwrap();
    let again = GateDir::open(dir.path()).unwrap();
    assert!(!dir.path().join(".g0i2.0123456789abcdef.new").exists());

    // Keys are names, never paths.
    for key in ["../x", "", "g0/i1", &"g".repeat(65)] {
        assert!(again.prepare(key, &config(), owner).is_err(), "{key:?}");
    }
    again.remove("g0i1").unwrap();
    again.remove("g0i1").unwrap();
    assert!(again.open_gate("g0i1").unwrap().is_none());
}

#[test]
fn the_owners_gate_is_taken_over_and_another_users_replaced() {
    let top = tempfile::tempdir().unwrap();
    let dir = GateDir::open(&top.path().join("gates")).unwrap();
    let me = GateOwner::current();
    let first = dir.prepare("g0", &config(), me).unwrap();
    let job = Gate::open(first.path()).unwrap();
    job.join(std::process::id(), Class::Online, 1.0).unwrap();

    // The same user's next job: the slot stays, the settings change.
    let mut online = config();
    online.policy = PolicyKind::Orion;
    let taken = dir.prepare("g0", &online, me).unwrap();
    let snap = taken.snapshot().unwrap();
    assert_eq!(snap.config().policy, PolicyKind::Orion);
    assert_eq!(snap.slots().len(), 1);
    assert_eq!(job.config().policy, PolicyKind::Orion, "the job sees it");

    if !root() {
        eprintln!("skipped another user's gate: not root");
        return;
    }
    // Another user's job in the partition: a fresh gate of theirs; the old one's
    // processes keep what they mapped, and see none of the new one.
    let theirs = dir.prepare("g0", &config(), NOBODY).unwrap();
    assert_eq!(theirs.owner_uid(), NOBODY.uid);
    assert!(theirs.snapshot().unwrap().slots().is_empty());
    assert_eq!(job.slots().len(), 1);
}

#[test]
fn mmkd_reads_and_writes_a_gate_without_mapping_it_and_survives_any_content() {
    let top = tempfile::tempdir().unwrap();
    let dir = GateDir::open(&top.path().join("gates")).unwrap();
    let gate = dir.prepare("g0", &config(), GateOwner::current()).unwrap();
    // A job process maps it, joins, launches.
    let job = Gate::open(gate.path()).unwrap();
    let slot = job.join(4242, Class::Offline, 0.5).unwrap();
    job.count(slot);
    let snap = gate.snapshot().unwrap();
    assert_eq!(snap.slots()[0].pid, 4242);
    assert_eq!(snap.totals().launches, 1);

    // What mmkd writes, the job sees.
    let mut c = config();
    c.offline_depth = 8;
    c.device_wait = true;
    c.hold_budget_pct = 250;
    gate.configure(&c).unwrap();
    assert_eq!(job.config().offline_depth, 8);
    assert!(job.config().device_wait);
    assert_eq!(job.config().hold_budget_pct, 100, "capped");
    assert!(gate.set_untracked(4242, true).unwrap());
    assert!(job.untracked(slot));
    assert!(!gate.set_untracked(77, true).unwrap(), "no slot of pid 77");
    let mut bad = config();
    bad.max_hold = Duration::from_secs(3600);
    assert!(gate.configure(&bad).is_err());

    // The job writes huge counters and a bad policy code: read saturating, or refused.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(gate.path())
        .unwrap();
    let slots = std::mem::offset_of!(Segment, slots);
    for field in [
        std::mem::offset_of!(Slot, launches),
        std::mem::offset_of!(Slot, held_ns),
    ] {
        for i in 0..3 {
            let at = slots + i * std::mem::size_of::<Slot>() + field;
            f.write_all_at(&u64::MAX.to_ne_bytes(), at as u64).unwrap();
        }
    }
    let t = gate.snapshot().unwrap().totals();
    assert_eq!((t.launches, t.held_ns), (u64::MAX, u64::MAX));
    f.write_all_at(
        &99u32.to_ne_bytes(),
        std::mem::offset_of!(Header, policy) as u64,
    )
    .unwrap();
    let why = gate.snapshot().unwrap_err().to_string();
    assert!(why.contains("unknown policy code 99"), "{why}");

    // Truncated (a mapping of it would fault): an error naming the size, not a signal.
    f.set_len(100).unwrap();
    let why = gate.snapshot().unwrap_err().to_string();
    assert!(why.contains("size 100 bytes"), "{why}");
    assert!(gate.set_untracked(4242, false).is_err());
    f.set_len(0).unwrap();
    assert!(gate.snapshot().is_err());
    // Garbage of the right size.
    f.write_all_at(&vec![0xA5; SEGMENT_BYTES], 0).unwrap();
    let why = gate.snapshot().unwrap_err().to_string();
    assert!(why.contains("not an mmk gate"), "{why}");
    // The next job of the partition gets a fresh gate.
    let fresh = dir.prepare("g0", &config(), GateOwner::current()).unwrap();
    assert!(fresh.snapshot().unwrap().slots().is_empty());
}
