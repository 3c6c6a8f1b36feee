use super::*;
use crate::job::{Assignment, Change, InstanceRecord, Owner, StepRecord};
use crate::learn::{Learned, Observed};
use mmk_core::spec::{RestartPolicy, Task, WorkloadSpec};
use mmk_core::{JobClass, JobSpec};
use mmk_partitioner::{Instance, Placement, Slot};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

fn spec(name: &str) -> JobSpec {
    JobSpec {
        name: name.into(),
        class: JobClass::Offline,
        gpu_memory_mib: 1024,
        slo_ms: None,
        slo_slowdown_pct: None,
        priority: 0,
        task: Task::Workload(WorkloadSpec {
            name: "resnet50-train".into(),
            batch_size: None,
            duration_ms: None,
        }),
        checkpoint: false,
        restart_policy: RestartPolicy::Never,
        max_restarts: 0,
        exclusive: false,
        profile_key: None,
    }
}

async fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Store::open(&dir.path().join("mmk.db")).await.expect("open");
    (dir, s)
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_reopen() {
    let (dir, s) = store().await;
    s.insert_job(&spec("a"), None, 1).await.expect("insert");
    s.close().await;
    let s = Store::open(&dir.path().join("mmk.db"))
        .await
        .expect("reopen");
    assert_eq!(s.list_jobs(&[], None).await.expect("list").len(), 1);
}

#[tokio::test]
async fn a_wait_reason_does_not_overwrite_a_job_that_left_the_queue() {
    let (_dir, s) = store().await;
    let (a, _) = s.insert_job(&spec("a"), None, 10).await.expect("insert");
    let (b, _) = s.insert_job(&spec("b"), None, 10).await.expect("insert");
    // A cancel comes in between a pass's read and its write of the reasons.
    s.transition(
        a.id,
        JobState::Cancelled,
        "cancelled: no",
        Change::default(),
        11,
    )
    .await
    .expect("cancel");
    s.set_reasons(&[(a.id, "waiting".into()), (b.id, "waiting".into())], 12)
        .await
        .expect("reasons");
    s.set_reason(a.id, "waiting again", 13)
        .await
        .expect("reason");
    let get = |id| s.get_job(id);
    assert_eq!(get(a.id).await.expect("a").reason, "cancelled: no");
    assert_eq!(get(b.id).await.expect("b").reason, "waiting");
}

#[tokio::test]
async fn transitions_follow_the_state_machine_and_leave_events() {
    let (_dir, s) = store().await;
    let (job, ev) = s.insert_job(&spec("a"), None, 10).await.expect("insert");
    assert_eq!((job.state, ev.state), (JobState::Queued, JobState::Queued));
    let err = s
        .transition(job.id, JobState::Succeeded, "x", Change::default(), 11)
        .await
        .expect_err("QUEUED cannot become SUCCEEDED");
    assert!(matches!(err, StoreError::BadTransition { .. }));
    let a = Assignment {
        slot: Slot {
            gpu: 0,
            start: 4,
            profile_id: Some(9),
        },
        gpu_uuid: "GPU-x".into(),
        instance_id: 2,
        device_uuid: "MIG-y".into(),
        profile: "3g.40gb".into(),
        mps_share: 100,
    };
    s.transition(
        job.id,
        JobState::Starting,
        "placed",
        Change {
            assignment: Some(a.clone()),
            ..Change::default()
        },
        12,
    )
    .await
    .expect("start");
    s.transition(job.id, JobState::Running, "running", Change::default(), 13)
        .await
        .expect("run");
    let (done, _) = s
        .transition(
            job.id,
            JobState::Failed,
            "exited with code 3",
            Change {
                exit_code: Some(3),
                ..Change::default()
            },
            14,
        )
        .await
        .expect("fail");
    assert_eq!(done.assignment, Some(a));
    assert_eq!(
        (done.started_at, done.finished_at, done.exit_code),
        (Some(13), Some(14), Some(3))
    );
    let states: Vec<_> = s
        .job_events(job.id)
        .await
        .expect("events")
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        states,
        [
            JobState::Queued,
            JobState::Starting,
            JobState::Running,
            JobState::Failed
        ]
    );
}

#[tokio::test]
async fn list_filters_by_state_and_class() {
    let (_dir, s) = store().await;
    let (a, _) = s.insert_job(&spec("a"), None, 1).await.expect("insert");
    let mut on = spec("b");
    on.class = JobClass::Online;
    s.insert_job(&on, None, 2).await.expect("insert");
    s.transition(a.id, JobState::Cancelled, "user", Change::default(), 3)
        .await
        .expect("cancel");
    let q = s.list_jobs(&[JobState::Queued], None).await.expect("list");
    assert_eq!(
        q.iter().map(|j| j.spec.name.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    let off = s
        .list_jobs(&[], Some(JobClass::Offline))
        .await
        .expect("list");
    assert_eq!(
        off.iter().map(|j| j.spec.name.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
}

#[tokio::test]
async fn moves_count_apart_from_failure_restarts() {
    let (_dir, s) = store().await;
    let (job, _) = s.insert_job(&spec("a"), None, 1).await.expect("insert");
    s.transition(job.id, JobState::Starting, "placed", Change::default(), 2)
        .await
        .expect("start");
    s.transition(job.id, JobState::Running, "running", Change::default(), 3)
        .await
        .expect("run");
    let moved = Change {
        moved: true,
        ..Change::default()
    };
    let (j, _) = s
        .transition(job.id, JobState::Queued, "moved", moved, 4)
        .await
        .expect("move");
    assert_eq!((j.restarts, j.moves, j.failure_restarts()), (1, 1, 0));
    s.transition(job.id, JobState::Starting, "placed", Change::default(), 5)
        .await
        .expect("start");
    let failed = Change {
        restart: true,
        ..Change::default()
    };
    let (j, _) = s
        .transition(job.id, JobState::Queued, "failed", failed, 6)
        .await
        .expect("requeue");
    assert_eq!((j.restarts, j.moves, j.failure_restarts()), (2, 1, 1));
}

#[tokio::test]
async fn a_missing_job_is_not_found() {
    let (_dir, s) = store().await;
    assert!(matches!(s.get_job(42).await, Err(StoreError::NotFound(42))));
}

#[tokio::test]
async fn steps_are_recorded_before_and_after() {
    let (_dir, s) = store().await;
    let step = StepRecord {
        id: 0,
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        kind: "create".into(),
        profile_id: 9,
        start: 4,
        instance_id: None,
    };
    let done = s.begin_step(&step, 1).await.expect("begin");
    let rec = InstanceRecord {
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        instance: Instance {
            id: 3,
            profile_id: 9,
            placement: Placement { start: 4, size: 4 },
            uuid: "MIG-z".into(),
        },
    };
    s.finish_create(done, &rec, 2).await.expect("finish");
    assert_eq!(s.instances().await.expect("list"), vec![rec]);
    let cut = s
        .begin_step(
            &StepRecord {
                kind: "destroy".into(),
                instance_id: Some(3),
                ..step
            },
            3,
        )
        .await
        .expect("begin");
    let interrupted = s.interrupt_pending_steps(4).await.expect("interrupt");
    assert_eq!(interrupted.iter().map(|x| x.id).collect::<Vec<_>>(), [cut]);
    assert!(
        s.interrupt_pending_steps(5)
            .await
            .expect("again")
            .is_empty()
    );
}

#[tokio::test]
async fn instances_round_trip() {
    let (_dir, s) = store().await;
    let rec = InstanceRecord {
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        instance: Instance {
            id: 3,
            profile_id: 9,
            placement: Placement { start: 4, size: 4 },
            uuid: "MIG-z".into(),
        },
    };
    s.add_instance(&rec, 1).await.expect("add");
    assert_eq!(s.instances().await.expect("list"), vec![rec]);
    s.remove_instance("GPU-1", 4).await.expect("remove");
    assert!(s.instances().await.expect("list").is_empty());
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[tokio::test]
async fn the_store_files_are_for_root_only() {
    let (dir, s) = store().await;
    s.insert_job(&spec("a"), None, 1).await.expect("insert");
    let db = dir.path().join("mmk.db");
    let files = [db.clone(), sibling(&db, "-wal"), sibling(&db, "-shm")];
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("mmk.db") && !n.contains(".new")),
        "{names:?}"
    );
    // Files an older mmkd left readable by all are made root's alone.
    for file in &files {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let again = Store::open(&db).await.expect("reopen");
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    assert_eq!(again.list_jobs(&[], None).await.expect("list").len(), 1);
}

#[tokio::test]
async fn an_empty_store_file_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("mmk.db");
    std::fs::write(&db, b"").expect("write");
    let err = Store::open(&db).await.expect_err("an empty store");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Empty { .. }), "{err:?}");
    assert!(text.contains(&db.display().to_string()), "{text}");
    assert!(
        text.contains("is empty") && text.contains("move it away"),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&db).expect("stat").len(),
        0,
        "left as it was"
    );
}

/// The most pages every connection of `s` lets the database file grow to: a nonzero
/// limit stands for a full disk (SQLITE_FULL), as far as the file has reached it.
async fn set_page_limit(s: &Store, limit: &AtomicU32, pages: u32) {
    limit.store(pages, Ordering::SeqCst);
    // Holding every connection of the pool at once reaches the idle ones too; a new one
    // gets the limit from `after_connect`.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(s.pool.acquire().await.expect("acquire"));
    }
    for conn in &mut held {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "PRAGMA max_page_count = {pages}"
        )))
        .execute(&mut **conn)
        .await
        .expect("pragma");
    }
}

fn is_full(err: &StoreError) -> bool {
    // The message as SQLite words it, and the code mmkd maps to RESOURCE_EXHAUSTED.
    matches!(err, StoreError::Query(sqlx::Error::Database(e)) if e.message().contains("full"))
        && err.is_full()
}

#[tokio::test]
async fn writes_fail_on_a_full_disk_and_succeed_again_once_space_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("mmk.db");
    let limit = Arc::new(AtomicU32::new(0));
    let on_connect = limit.clone();
    let pool = pool_options().after_connect(move |conn, _| {
        let pages = on_connect.load(Ordering::SeqCst);
        Box::pin(async move {
            if pages > 0 {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "PRAGMA max_page_count = {pages}"
                )))
                .execute(conn)
                .await?;
            }
            Ok(())
        })
    });
    let s = Store::open_with(&db, pool).await.expect("open");
    let mut acked = 0;
    s.insert_job(&spec("first"), None, 1).await.expect("insert");
    acked += 1;
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&s.pool)
        .await
        .expect("page count");
    set_page_limit(&s, &limit, u32::try_from(pages).expect("pages")).await;
    // Fill the "disk".
    let mut err = None;
    for n in 0..1000 {
        match s.insert_job(&spec(&format!("fill{n}")), None, 2).await {
            Ok(_) => acked += 1,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the database fills up");
    assert!(is_full(&err), "{err:?}");
    // While it is full, every write says so, whichever connection it gets.
    let job = s.get_job(1).await.expect("a read still works");
    for n in 0..2 * MAX_CONNECTIONS {
        let err = s
            .insert_job(&spec(&format!("full{n}")), None, 3)
            .await
            .expect_err("still full");
        assert!(is_full(&err), "write {n} while full: {err:?}");
        let err = s
            .note(job.id, &"x".repeat(5000), 3)
            .await
            .expect_err("still full");
        assert!(is_full(&err), "note {n} while full: {err:?}");
    }
    // Space returns: writes succeed again, on every connection, without a restart.
    set_page_limit(&s, &limit, 1_000_000_000).await;
    for n in 0..2 * MAX_CONNECTIONS {
        s.insert_job(&spec(&format!("after{n}")), None, 4)
            .await
            .unwrap_or_else(|e| panic!("write {n} after space returned: {e:?}"));
        acked += 1;
    }
    s.close().await;
    let s = Store::open(&db).await.expect("reopen");
    assert_eq!(
        s.list_jobs(&[], None).await.expect("list").len(),
        acked,
        "every acknowledged job is kept, and only those"
    );
}

#[tokio::test]
async fn learned_profiles_are_kept_and_a_bad_row_is_named_not_fatal() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("mmk.db");
    let store = Store::open(&path).await.expect("open");
    let mut observed = Observed::default();
    observed.sample(40, true);
    observed.sample(0, false);
    observed.seconds = 0.004;
    let p = Learned {
        signature: "1000/name/train/cmd/00ff".into(),
        owner_uid: Some(1000),
        name: "train".into(),
        class: JobClass::Offline,
        observed,
        created_at: 5,
        updated_at: 7,
    };
    store.put_profile(&p).await.expect("put");
    let mut later = p.clone();
    later.observed.sample(40, true);
    later.updated_at = 9;
    store.put_profile(&later).await.expect("replace");
    sqlx::query(
        "INSERT INTO learned_profiles VALUES ('1000/key/bad', 1000, 'bad', 'offline', '{\"version\":1}', 1, 1)",
    )
    .execute(&store.pool)
    .await
    .expect("a corrupt row");
    store.close().await;
    let store = Store::open(&path).await.expect("reopen");
    let rows = store.profiles().await.expect("profiles");
    assert_eq!(rows.len(), 2);
    let (bad, why) = rows[0].clone().expect_err("the corrupt row");
    assert_eq!(bad, "1000/key/bad");
    assert!(why.starts_with("observed:"), "{why}");
    assert_eq!(rows[1], Ok(later), "the newer write replaced the first");
}

/// Ended jobs past the age go with their events, but for the newest few of each user;
/// jobs that have not ended stay whatever their age; IDs are not reused.
#[tokio::test]
async fn the_history_prunes_old_ended_jobs_but_the_newest_of_each_user() {
    let (dir, s) = store().await;
    let alice = Some(Owner {
        uid: 1001,
        gid: 1001,
    });
    let bob = Some(Owner {
        uid: 1002,
        gid: 1002,
    });
    let mut ended = Vec::new();
    for (owner, at) in [
        (alice, 10),
        (alice, 11),
        (alice, 12),
        (bob, 13),
        (alice, 500),
    ] {
        let (j, _) = s.insert_job(&spec("a"), owner, at).await.expect("insert");
        s.transition(
            j.id,
            JobState::Cancelled,
            "cancelled",
            Change::default(),
            at,
        )
        .await
        .expect("cancel");
        ended.push(j.id);
    }
    let (old_queued, _) = s.insert_job(&spec("q"), alice, 1).await.expect("insert");
    // Ended before 100, the newest one of each user kept: alice's 500 is newer than 100,
    // so alice's ended at 10, 11 and 12 go (her newest, at 500, is kept), bob's only one stays.
    assert_eq!(s.prune_ended(100, 1).await.expect("prune"), 3);
    for id in &ended[..3] {
        assert!(matches!(s.get_job(*id).await, Err(StoreError::NotFound(_))));
        assert!(s.job_events(*id).await.expect("events").is_empty());
    }
    for id in [ended[3], ended[4], old_queued.id] {
        s.get_job(id).await.expect("kept");
    }
    // Nothing left to prune; a new job gets a new ID.
    assert_eq!(s.prune_ended(100, 1).await.expect("again"), 0);
    let (next, _) = s.insert_job(&spec("n"), bob, 600).await.expect("insert");
    assert!(next.id > old_queued.id);
    s.checkpoint().await.expect("checkpoint");
    let wal = sibling(&dir.path().join("mmk.db"), "-wal");
    assert_eq!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0), 0);
}

/// Old layout steps go where they tell nothing: a create a later destroy undid and that
/// destroy, failed steps; a create still standing is kept however old.
#[tokio::test]
async fn the_history_keeps_the_steps_of_instances_that_stand() {
    let (_dir, s) = store().await;
    let step = |kind: &str, start: u8| StepRecord {
        id: 0,
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        kind: kind.into(),
        profile_id: 19,
        start,
        instance_id: Some(u32::from(start) + 1),
    };
    let rec = |start: u8| InstanceRecord {
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        instance: Instance {
            id: u32::from(start) + 1,
            profile_id: 19,
            placement: Placement { start, size: 1 },
            uuid: format!("MIG-{start}"),
        },
    };
    // Slice 0: made and destroyed. Slice 1: made and standing. Slice 2: a failed create.
    let a = s.begin_step(&step("create", 0), 1).await.expect("begin");
    s.finish_create(a, &rec(0), 2).await.expect("made");
    let b = s.begin_step(&step("destroy", 0), 3).await.expect("begin");
    s.finish_destroy(b, "GPU-1", 0, 4).await.expect("destroyed");
    let c = s.begin_step(&step("create", 1), 5).await.expect("begin");
    s.finish_create(c, &rec(1), 6).await.expect("made");
    let d = s.begin_step(&step("create", 2), 7).await.expect("begin");
    s.fail_step(d, "no room", 8).await.expect("failed");
    let standing = s.created_instances().await.expect("created");
    assert_eq!(s.prune_steps(100).await.expect("prune"), 3);
    assert_eq!(s.created_instances().await.expect("created"), standing);
    assert_eq!(standing.iter().map(|x| x.start).collect::<Vec<_>>(), [1]);
}
