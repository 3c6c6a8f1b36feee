//! mmkd as root on a node that several users share (docs/security.md): each test runs
//! mmkctl as two distinct non-root users, made by the test (the tests run as root in CI).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output};
use std::sync::OnceLock;

use mmk_proto::v1;

use crate::harness::{Daemon, PATIENCE, text, wait_for, wait_state};

const GROUP: &str = "mmk-e2e";
const ADMINS: &str = "mmk-e2e-admin";

/// A test user: name, uid, gid.
#[derive(Debug, Clone)]
struct User {
    name: &'static str,
    uid: u32,
}

/// Creates the test users once: alice and bob in the socket's group, carol also in the
/// admin group. `None` (and the reason printed) when this process is not root; under
/// CI that fails instead.
fn users() -> Option<&'static (User, User, User)> {
    static USERS: OnceLock<Option<(User, User, User)>> = OnceLock::new();
    USERS
        .get_or_init(|| {
            if !rustix_is_root() {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "the multi-user tests need root (they create users); CI runs as root"
                );
                eprintln!("skipped: the multi-user tests need root to create users");
                return None;
            }
            for g in [GROUP, ADMINS] {
                let _ = Command::new("groupadd").arg("-f").arg(g).status();
            }
            // Removed when the test binary exits (after every test has run).
            extern "C" fn remove_users() {
                for u in ["mmk-alice", "mmk-bob", "mmk-carol"] {
                    // Their processes first: userdel refuses a user who still runs one.
                    let _ = Command::new("pkill").args(["-KILL", "-u", u]).status();
                    let _ = Command::new("userdel").arg(u).output();
                }
                for g in [GROUP, ADMINS] {
                    let _ = Command::new("groupdel").arg(g).output();
                }
            }
            // SAFETY: atexit with a function that takes nothing and returns nothing.
            unsafe { libc::atexit(remove_users) };
            let make = |name: &'static str, groups: &str| {
                let _ = Command::new("useradd")
                    .args(["-M", "-N", "-s", "/bin/sh", "-g", GROUP, "-G", groups, name])
                    .status();
                let out = Command::new("id").args(["-u", name]).output().expect("id");
                let uid = text(&out.stdout).trim().parse().expect("the user exists");
                User { name, uid }
            };
            Some((
                make("mmk-alice", GROUP),
                make("mmk-bob", GROUP),
                make("mmk-carol", ADMINS),
            ))
        })
        .as_ref()
}

fn rustix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// mmkd as root with the socket open to the test group and an admin group; its directory
/// is traversable so that the users reach the socket and their logs.
fn daemon() -> Daemon {
    let d = Daemon::start_with(
        "a100-80gb:1",
        &["--socket-group", GROUP, "--admin-group", ADMINS],
    );
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

/// Runs mmkctl as `user` against `d`.
fn ctl_as(d: &Daemon, user: &User, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            user.name,
            "--regid",
            GROUP,
            "--init-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(args)
        .env_remove("MMK_SOCKET")
        .current_dir("/")
        .output()
        .expect("setpriv runs mmkctl")
}

fn json_as(d: &Daemon, user: &User, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let out = ctl_as(d, user, &all);
    assert!(
        out.status.success(),
        "mmkctl {args:?} as {} failed: {}",
        user.name,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Submits `yaml` as `user`; returns the job's ID.
fn submit_as(d: &Daemon, user: &User, yaml: &str) -> u64 {
    let file = d
        .path()
        .join(format!("{}-{}.yaml", user.name, std::process::id()));
    std::fs::write(&file, yaml).expect("job file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let v = json_as(
        d,
        user,
        &["submit", "--offline", &file.display().to_string()],
    );
    v["id"].as_u64().expect("id")
}

#[tokio::test]
async fn a_job_cannot_take_roots_files_through_its_log_dir() {
    let Some((alice, _, _)) = users() else { return };
    let d = daemon();
    let precious = d.path().join("roots-file");
    std::fs::write(&precious, "root's own\n").expect("write");
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // The attack: replace the log with a link to root's file, fail, and be restarted.
    let script = format!(
        "ln -sf {p} $MMK_LOG_DIR/stdout.log; ln -f {p} $MMK_LOG_DIR/stderr.log; \
         touch $MMK_LOG_DIR/planted; echo run; exit 1",
        p = precious.display()
    );
    let id = submit_as(
        &d,
        alice,
        &format!(
            "name: sneaky\ngpu_memory: 1GiB\nrestart_policy: on-failure\nmax_restarts: 2\n\
             command:\n  workdir: /\n  args: [sh, -c, '{script}']\n"
        ),
    );
    let mut c = d.clients().await;
    let j = wait_state(&mut c, id, v1::JobState::Failed).await;
    assert_eq!(j.restarts, 2, "{j:?}");
    let meta = std::fs::metadata(&precious).expect("stat");
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (0, 0o600),
        "root's file kept its owner and mode"
    );
    assert_eq!(
        std::fs::read_to_string(&precious).expect("read"),
        "root's own\n",
        "nothing was appended to root's file"
    );
    let log_dir = std::path::Path::new(&j.log_dir);
    assert!(
        !log_dir.join("planted").exists(),
        "the job cannot write its log dir"
    );
    let out = std::fs::read_to_string(log_dir.join("stdout.log")).expect("stdout.log");
    assert_eq!(
        out.matches("run").count(),
        3,
        "each run's output is in its log: {out}"
    );
    let owner_mode = |p: &std::path::Path| {
        let m = std::fs::metadata(p).expect("stat");
        (m.uid(), m.mode() & 0o777)
    };
    let dir = log_dir;
    assert_eq!(
        owner_mode(&dir.join("stdout.log")),
        (alice.uid, 0o600),
        "the owner's log"
    );
    assert_eq!(owner_mode(dir), (0, 0o711), "mmkd's log dir");
    assert_eq!(
        owner_mode(&dir.join("work")),
        (alice.uid, 0o700),
        "the job's own dir"
    );
}

#[tokio::test]
async fn another_user_can_neither_act_on_a_job_nor_read_it() {
    let Some((alice, bob, carol)) = users() else {
        return;
    };
    let d = daemon();
    let id = submit_as(
        &d,
        alice,
        "name: alices\ngpu_memory: 1GiB\ncommand:\n  workdir: /\n  args: [sh, -c, 'echo hush; exec sleep 300']\n  env: {SECRET: hunter2}\n",
    );
    let mut c = d.clients().await;
    let j = wait_state(&mut c, id, v1::JobState::Running).await;
    let ids = id.to_string();

    // Bob sees that the job exists, not what it runs.
    let seen = json_as(&d, bob, &["jobs", "get", &ids]);
    let shown = seen.to_string();
    assert!(
        !shown.contains("hunter2") && !shown.contains("sleep"),
        "{shown}"
    );
    let listed = json_as(&d, bob, &["jobs"]).to_string();
    assert!(
        listed.contains("alices") && !listed.contains("hunter2"),
        "{listed}"
    );
    // ... nor its log.
    let log = std::path::Path::new(&j.log_dir).join("stdout.log");
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            bob.name,
            "--regid",
            GROUP,
            "--init-groups",
            "cat",
        ])
        .arg(&log)
        .output()
        .expect("cat");
    assert!(
        !out.status.success(),
        "bob read alice's log: {}",
        text(&out.stdout)
    );
    // Bob cannot cancel it.
    let out = ctl_as(&d, bob, &["jobs", "cancel", &ids]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("belongs to another user"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        wait_state(&mut c, id, v1::JobState::Running).await.state,
        v1::JobState::Running as i32
    );

    // Alice reads it all and her log; carol, an admin, cancels it.
    let mine = json_as(&d, alice, &["jobs", "get", &ids]).to_string();
    assert!(mine.contains("exec sleep 300"), "{mine}");
    let out = ctl_as(&d, alice, &["jobs", "logs", &ids]);
    assert_eq!(text(&out.stdout), "hush\n", "{}", text(&out.stderr));
    let out = ctl_as(&d, carol, &["jobs", "cancel", &ids]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j = wait_state(&mut c, id, v1::JobState::Cancelled).await;
    let carol_uid = carol.uid;
    assert_eq!(
        j.ended_by_uid,
        Some(carol_uid),
        "who cancelled it is recorded"
    );
    assert_eq!(j.owner_uid, Some(alice.uid));
}

#[tokio::test]
async fn the_store_and_logs_are_not_for_other_users() {
    let Some(_) = users() else { return };
    let d = daemon();
    let db = d.data_dir().join("mmk.db");
    wait_for("the store file", || db.exists().then_some(()));
    for f in ["mmk.db", "mmk.db-wal", "mmk.db-shm"] {
        let p = d.data_dir().join(f);
        if let Ok(m) = std::fs::metadata(&p) {
            assert_eq!(
                m.mode() & 0o077,
                0,
                "{} is mode {:o}",
                p.display(),
                m.mode() & 0o777
            );
        }
    }
}

#[tokio::test]
async fn of_concurrent_cancels_of_one_job_one_succeeds() {
    let d = Daemon::start("a100-80gb:1");
    let id = d.submit(
        "--offline",
        "name: target\ngpu_memory: 1GiB\ncommand:\n  args: [sleep, '300']\n",
    );
    let mut c = d.clients().await;
    wait_state(&mut c, id, v1::JobState::Running).await;
    let mut calls = Vec::new();
    for _ in 0..8 {
        let mut c = d.clients().await;
        calls.push(tokio::spawn(async move {
            c.jobs
                .cancel_job(v1::CancelJobRequest {
                    id,
                    reason: String::new(),
                })
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }));
    }
    let mut codes = Vec::new();
    for call in calls {
        codes.push(
            tokio::time::timeout(PATIENCE, call)
                .await
                .expect("in time")
                .expect("join"),
        );
    }
    let ok = codes.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "{codes:?}");
    assert!(
        codes
            .iter()
            .all(|r| matches!(r, Ok(()) | Err(tonic::Code::FailedPrecondition))),
        "{codes:?}"
    );
}

#[tokio::test]
async fn big_fields_are_refused_and_lists_come_in_pages() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let spec = |workdir: String, key: String| v1::JobSpec {
        name: "big".into(),
        class: v1::JobClass::Offline as i32,
        gpu_memory_mib: 1024,
        task: Some(v1::job_spec::Task::Command(v1::CommandTask {
            args: vec!["true".into()],
            env: [(key, "v".into())].into(),
            workdir,
            ..Default::default()
        })),
        ..Default::default()
    };
    let huge = format!("/{}", "w".repeat(3 * 1024 * 1024));
    let err = c
        .jobs
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec(huge, "K".into())),
            ..Default::default()
        })
        .await
        .expect_err("a 3 MB workdir");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() < 1000, "{} bytes", err.message().len());
    let err = c
        .jobs
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec("/".into(), format!("K\r\n{}", "k".repeat(20_000)))),
            ..Default::default()
        })
        .await
        .expect_err("a 20 KB env key");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() < 1000, "{} bytes", err.message().len());
    assert!(err.metadata().get("mmk-field").is_some(), "{err:?}");

    for i in 0..5 {
        d.submit(
            "--offline",
            &format!("name: q{i}\ngpu_memory: 1GiB\nworkload:\n  name: bert-train\n"),
        );
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = c
            .jobs
            .list_jobs(v1::ListJobsRequest {
                page_size: 2,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        assert!(page.jobs.len() <= 2);
        seen.extend(page.jobs.iter().map(|j| j.id));
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!((seen.len(), pages), (5, 3), "{seen:?}");
    let listed = d.ctl_json(&["jobs"]);
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(5),
        "mmkctl follows the pages"
    );
}

/// mmkd with `flags` (and its socket and data in `dir`) stops at start, saying `why`.
fn refused_at_start(dir: &std::path::Path, flags: &[&str], why: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim"])
        .args(flags)
        .arg("--socket")
        .arg(dir.join("x.sock"))
        .arg("--data-dir")
        .arg(dir.join("x"))
        .output()
        .expect("mmkd runs");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
}

/// A CA and certificates signed by it, written as PEM files into `dir`.
struct Pki {
    ca: std::path::PathBuf,
}

impl Pki {
    /// Makes a CA named `name` in `dir`; returns it with its signing key.
    fn ca(dir: &std::path::Path, name: &str) -> (Pki, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA");
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, cert.pem()).expect("write");
        (Pki { ca: path }, rcgen::Issuer::new(params, key))
    }

    /// A certificate for `cn` (and `sans`) signed by `issuer`: (cert, key) paths.
    fn leaf(
        dir: &std::path::Path,
        issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
        cn: &str,
        sans: &[&str],
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, issuer).expect("signed");
        let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
        std::fs::write(&c, cert.pem()).expect("write");
        std::fs::write(&k, key.serialize_pem()).expect("write");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        (c, k)
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end story, read top to bottom; the 150-line limit is for product code"
)]
#[tokio::test]
async fn tcp_takes_only_callers_with_a_certificate_of_the_ca() {
    let pki_dir = tempfile::tempdir().expect("tempdir");
    let dir = pki_dir.path();
    let (pki, issuer) = Pki::ca(dir, "node-ca");
    let (server_crt, server_key) = Pki::leaf(dir, &issuer, "mmkd", &["localhost", "127.0.0.1"]);
    // A node user who is not root (root's identity is not granted over TCP).
    let Some((alice, _, _)) = users() else {
        return;
    };
    let whoami = alice.name.to_owned();
    let (me_crt, me_key) = Pki::leaf(dir, &issuer, &whoami, &[]);
    let (root_crt, root_key) = Pki::leaf(dir, &issuer, "root", &[]);
    let (stranger_crt, stranger_key) = Pki::leaf(dir, &issuer, "no-such-user-here", &[]);
    // A system user (a daemon's account, uid 1 on Debian).
    let (system_crt, system_key) = Pki::leaf(dir, &issuer, "daemon", &[]);
    let other = tempfile::tempdir().expect("tempdir");
    let (_, other_issuer) = Pki::ca(other.path(), "other-ca");
    let (forged_crt, forged_key) = Pki::leaf(other.path(), &other_issuer, &whoami, &[]);

    // Plain TCP is refused at start.
    refused_at_start(dir, &["--listen", "127.0.0.1:0"], "TCP needs TLS");

    let s = |p: &std::path::Path| p.display().to_string();
    let d = Daemon::start_with(
        "a100-80gb:1",
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &s(&server_crt),
            "--tls-key",
            &s(&server_key),
            "--tls-client-ca",
            &s(&pki.ca),
        ],
    );
    let addr = d
        .wait_log("listening on tcp")
        .iter()
        .find_map(|l| l.split("addr=").nth(1).map(|a| a.trim().to_owned()))
        .expect("mmkd logs its tcp address");
    let port = addr.rsplit(':').next().expect("port").to_owned();
    let endpoint = format!("https://localhost:{port}");
    // A client that connects and never starts the handshake is dropped after 10 s.
    let silent = std::thread::spawn({
        let addr = format!("127.0.0.1:{port}");
        move || {
            use std::io::Read;
            let mut c = std::net::TcpStream::connect(addr).expect("connect");
            c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .expect("timeout");
            let t = std::time::Instant::now();
            let mut buf = [0u8; 16];
            let end = c.read(&mut buf);
            (t.elapsed(), end.map_err(|e| e.kind()))
        }
    });
    let job = d.job_file(
        "cmd.yaml",
        "name: cmd\nclass: offline\ngpu_memory: 1GiB\ncommand:\n  workdir: /\n  args: [true]\n",
    );
    let call_tcp = |crt: &std::path::Path, key: &std::path::Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mmkctl"))
            .args([
                "--output",
                "json",
                "--endpoint",
                &endpoint,
                "--tls-ca",
                &s(&pki.ca),
            ])
            .args(["--tls-cert", &s(crt), "--tls-key", &s(key)])
            .args(args)
            .env_remove("MMK_SOCKET")
            .output()
            .expect("mmkctl runs")
    };
    let over_tcp =
        |crt: &std::path::Path, key: &std::path::Path| call_tcp(crt, key, &["submit", &job]);
    // The read-only calls too: the node, its partitions, a dry run, a fit, capacity.
    let reads: [&[&str]; 5] = [
        &["gpus"],
        &["partitions", "show"],
        &["partitions", "plan", &job],
        &["fit", &job],
        &["capacity"],
    ];
    for args in reads {
        let out = call_tcp(&me_crt, &me_key, args);
        assert!(
            out.status.code().is_some_and(|c| c != 2),
            "{args:?} as alice: {}",
            text(&out.stderr)
        );
        for (who, crt, key) in [
            ("root", &root_crt, &root_key),
            ("no user", &stranger_crt, &stranger_key),
            ("a system user", &system_crt, &system_key),
        ] {
            let out = call_tcp(crt, key, args);
            assert_eq!(out.status.code(), Some(2), "{args:?} as {who}");
            assert!(
                text(&out.stderr).contains("does not grant over TCP")
                    || text(&out.stderr).contains("not a user on this node"),
                "{args:?} as {who}: {}",
                text(&out.stderr)
            );
        }
    }
    let out = over_tcp(&me_crt, &me_key);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["owner_uid"], alice.uid,
        "the certificate's user owns the job: {v}"
    );
    let out = over_tcp(&root_crt, &root_key);
    assert_eq!(out.status.code(), Some(2), "a certificate that names root");
    assert!(
        text(&out.stderr).contains("does not grant over TCP"),
        "{}",
        text(&out.stderr)
    );

    let out = over_tcp(&forged_crt, &forged_key);
    assert_eq!(out.status.code(), Some(2), "a certificate of another CA");
    let out = over_tcp(&stranger_crt, &stranger_key);
    assert_eq!(out.status.code(), Some(2), "a user this node does not know");
    assert!(
        text(&out.stderr).contains("not a user on this node"),
        "{}",
        text(&out.stderr)
    );
    // No certificate at all: mmkctl refuses to try, and a raw TLS client is turned away.
    let out = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .args(["--endpoint", &endpoint, "jobs"])
        .env_remove("MMK_SOCKET")
        .output()
        .expect("mmkctl runs");
    assert_eq!(out.status.code(), Some(2));
    let bare = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .expect("endpoint")
        .tls_config(tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(std::fs::read(&pki.ca).expect("ca")),
        ))
        .expect("tls");
    let refused = match bare.connect().await {
        Err(_) => true,
        Ok(ch) => mmk_proto::v1::job_service_client::JobServiceClient::new(ch)
            .list_jobs(v1::ListJobsRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    let (after, end) = silent.join().expect("the silent client");
    assert!(
        after < std::time::Duration::from_secs(20) && matches!(end, Ok(0) | Err(_)),
        "a silent TCP client kept its connection {after:?} ({end:?})"
    );

    // A client that finishes the handshake and never speaks HTTP/2 is dropped too.
    let tls_silent = {
        use rustls_pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls_pki_types::CertificateDer::from_pem_file(&pki.ca).expect("ca"))
            .expect("root");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![rustls_pki_types::CertificateDer::from_pem_file(&me_crt).expect("crt")],
                rustls_pki_types::PrivateKeyDer::from_pem_file(&me_key).expect("key"),
            )
            .expect("client auth");
        let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
            .await
            .expect("connect");
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(
                rustls_pki_types::ServerName::try_from("localhost").expect("name"),
                tcp,
            )
            .await
            .expect("the handshake")
    };
    let mut tls_silent = tls_silent;
    let t = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut tls_silent, &mut buf),
    )
    .await
    .expect("dropped within 30 s");
    assert!(
        matches!(end, Ok(0) | Err(_)) && t.elapsed() < std::time::Duration::from_secs(20),
        "a client that said nothing after its handshake kept its connection ({end:?})"
    );

    // A flood of connections from one address: past the per-address cap, new ones are
    // closed at once while the first ones still wait; the Unix socket serves throughout.
    let flood: Vec<std::net::TcpStream> = (0..64)
        .map(|_| std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect"))
        .collect();
    let mut over = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
    over.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let mut one = [0u8; 1];
    assert!(
        matches!(std::io::Read::read(&mut over, &mut one), Ok(0) | Err(_)),
        "the 65th connection was kept"
    );
    flood[0].set_nonblocking(true).expect("nonblocking");
    assert!(
        matches!(
            std::io::Read::read(&mut &flood[0], &mut one),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        ),
        "the first ones are still open"
    );
    let jobs = d.ctl(&["jobs"]);
    assert!(jobs.status.success(), "{}", text(&jobs.stderr));
    drop(flood);
}

#[tokio::test]
async fn a_jobs_logs_stay_under_their_cap() {
    let d = Daemon::start_with("a100-80gb:1", &["--job-log-max", "1M"]);
    let id = d.submit(
        "--offline",
        "name: chatty\ngpu_memory: 1GiB\ncommand:\n  args: [sh, -c, 'yes chatter | head -c 6000000; echo last line']\n",
    );
    let mut c = d.clients().await;
    let j = wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let dir = std::path::Path::new(&j.log_dir);
    let size = |name: &str| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len());
    // Each stream keeps a quarter of the cap in its live file and a quarter before it.
    assert!(
        size("stdout.log") <= 256 * 1024 + 200,
        "{}",
        size("stdout.log")
    );
    assert!(
        size("stdout.log.1") <= 256 * 1024 + 200,
        "{}",
        size("stdout.log.1")
    );
    assert!(size("stdout.log.1") > 0, "the previous part is kept");
    let live = std::fs::read_to_string(dir.join("stdout.log")).expect("read");
    assert!(
        live.starts_with("[mmk: the log reached its cap; the previous part is stdout.log.1 and "),
        "{}",
        &live[..live.len().min(200)]
    );
    assert!(live.ends_with("chatter\nlast line\n") || live.ends_with("last line\n"));
}

/// A GetJobRequest whose field 1 has the wrong wire type: bytes that no mmk message decodes.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbled {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
}

#[tokio::test]
async fn malformed_and_oversized_requests_get_the_documented_codes() {
    let d = Daemon::start("a100-80gb:1");
    let c = d.clients().await;
    let mut raw = tonic::client::Grpc::new(c.channel.clone());
    raw.ready().await.expect("ready");
    let err = raw
        .unary::<Garbled, v1::Job, _>(
            tonic::Request::new(Garbled {
                id: b"\xff\xff\xff".to_vec(),
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static("/mmk.v1.JobService/GetJob"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("not a GetJobRequest");
    assert_eq!(
        err.code(),
        tonic::Code::Internal,
        "docs/api.md, Limits: {err:?}"
    );
    let mut jobs = c.jobs.clone();
    let err = jobs
        .submit_job(v1::SubmitJobRequest {
            spec: Some(v1::JobSpec {
                name: "x".repeat(5 * 1024 * 1024),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("over 4 MiB");
    assert_eq!(
        err.code(),
        tonic::Code::OutOfRange,
        "docs/api.md, Limits: {err:?}"
    );
    // mmkd still serves.
    jobs.list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("list");
}

#[tokio::test]
async fn a_socket_dir_another_user_made_is_refused() {
    let Some((alice, _, _)) = users() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let trap = dir.path().join("mmk-0");
    std::fs::create_dir(&trap).expect("mkdir");
    std::os::unix::fs::chown(&trap, Some(alice.uid), None).expect("chown");
    let out = Command::new(env!("CARGO_BIN_EXE_mmkd"))
        .args(["--backend", "sim", "--socket"])
        .arg(trap.join("mmkd.sock"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("mmkd runs");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("belongs to uid {}", alice.uid)),
        "{err}"
    );
    assert!(!trap.join("mmkd.sock").exists());
}

/// Metrics beyond loopback: refused at start without TLS; with it, only a client with a
/// certificate of the client CA gets them.
#[tokio::test]
async fn metrics_beyond_loopback_take_only_clients_with_a_certificate_of_the_ca() {
    let pki_dir = tempfile::tempdir().expect("tempdir");
    let dir = pki_dir.path();
    refused_at_start(
        dir,
        &["--metrics", "0.0.0.0:0"],
        "beyond loopback metrics need TLS with client certificates",
    );

    let (pki, issuer) = Pki::ca(dir, "node-ca");
    let (server_crt, server_key) = Pki::leaf(dir, &issuer, "mmkd", &["localhost", "127.0.0.1"]);
    let (prom_crt, prom_key) = Pki::leaf(dir, &issuer, "prometheus", &[]);
    let other = tempfile::tempdir().expect("tempdir");
    let (_, other_issuer) = Pki::ca(other.path(), "other-ca");
    let (forged_crt, forged_key) = Pki::leaf(other.path(), &other_issuer, "prometheus", &[]);
    let s = |p: &std::path::Path| p.display().to_string();
    let d = Daemon::start_with(
        "a100-80gb:1",
        &[
            "--metrics",
            "0.0.0.0:0",
            "--tls-cert",
            &s(&server_crt),
            "--tls-key",
            &s(&server_key),
            "--tls-client-ca",
            &s(&pki.ca),
        ],
    );
    let line = d.wait_log("metrics listening").pop().unwrap_or_default();
    assert!(line.contains("(TLS, client certificates)"), "{line}");
    let port = line
        .rsplit(':')
        .next()
        .map(|p| p.trim().to_owned())
        .expect("the metrics port");
    let curl = |cert: Option<(&std::path::Path, &std::path::Path)>| {
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&pki.ca)
            .arg(format!("https://localhost:{port}/metrics"));
        if let Some((crt, key)) = cert {
            c.arg("--cert").arg(crt).arg("--key").arg(key);
        }
        c.output().expect("curl runs")
    };
    let ok = curl(Some((&prom_crt, &prom_key)));
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(
        text(&ok.stdout).contains("# TYPE mmk_planning_seconds histogram"),
        "{}",
        text(&ok.stdout)
    );
    assert!(
        !curl(None).status.success(),
        "no client certificate: refused"
    );
    assert!(
        !curl(Some((&forged_crt, &forged_key))).status.success(),
        "a certificate of another CA: refused"
    );
}

/// The interposer, the fake driver and its test program copied where every user may read
/// them (the build tree may not be), in `dir`.
struct Tools {
    _dir: tempfile::TempDir,
    interposer: String,
    app: String,
    lib: String,
}

fn tools() -> Tools {
    use mmk_kernel_sched::artifacts::{FAKE_APP, INTERPOSER};
    let bin = crate::ksched::built();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let lib = crate::ksched::fake_driver_in(&bin, dir.path());
    let interposer = dir.path().join(INTERPOSER);
    std::fs::copy(bin.join(INTERPOSER), &interposer).expect("copy");
    let app = dir.path().join(FAKE_APP);
    std::fs::copy(bin.join(FAKE_APP), &app).expect("copy");
    Tools {
        interposer: interposer.display().to_string(),
        app: app.display().to_string(),
        lib: lib.display().to_string(),
        _dir: dir,
    }
}

fn daemon_with(extra: &[&str]) -> Daemon {
    let mut flags = vec!["--socket-group", GROUP, "--admin-group", ADMINS];
    flags.extend_from_slice(extra);
    let d = Daemon::start_with("a100-80gb:1", &flags);
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

/// Runs `sh -c script` as `user`; its output.
fn sh_as(user: &User, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            user.name,
            "--regid",
            GROUP,
            "--init-groups",
            "--",
        ])
        .args(["/bin/sh", "-c", script])
        .current_dir("/")
        .output()
        .expect("setpriv runs sh")
}

/// A user's job runs under the kernel scheduler as that user: its launches go through its
/// partition's gate, which is theirs alone (no other user opens it), mmkd counts its GPU
/// time and learns its profile.
#[tokio::test]
async fn a_users_job_is_scheduled_counted_and_learned_through_a_gate_of_their_own() {
    let Some((alice, bob, _)) = users() else {
        return;
    };
    let t = tools();
    let d = daemon_with(&["--interposer", &t.interposer]);
    // Kernels of 2 ms, 2 ms apart, each waited for: busy half the time.
    let yaml = format!(
        "name: learner\ngpu_memory: 4GiB\ncommand:\n  args: [{app}, --kernels, '600', --duration-us, '2000', --gap-us, '2000', --blocks, '54', --sync-every, '1']\n  env: {{LD_LIBRARY_PATH: {lib}}}\n",
        app = t.app,
        lib = t.lib,
    );
    let id = submit_as(&d, alice, &yaml);
    let mut c = d.clients().await;
    let job = wait_state(&mut c, id, v1::JobState::Running).await;
    let a = job.assignment.expect("placed");

    // Its gate: alice's, mode 0600, in a folder only root writes.
    let parts = d.ctl_json(&["partitions", "show"]);
    let gate = parts[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["instance_id"] == a.instance_id)
        .expect("the job's partition")["gate"]["path"]
        .as_str()
        .expect("a gate")
        .to_owned();
    let meta = std::fs::metadata(&gate).expect("the gate");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (alice.uid, 0o600));
    let folder = std::fs::metadata(std::path::Path::new(&gate).parent().expect("folder"))
        .expect("the gate folder");
    assert_eq!((folder.uid(), folder.mode() & 0o7777), (0, 0o711));
    // Bob can neither read it, write it, nor list the folder.
    for script in [
        format!("cat {gate} > /dev/null"),
        format!(": >> {gate}"),
        format!(
            "ls {}",
            std::path::Path::new(&gate)
                .parent()
                .expect("folder")
                .display()
        ),
    ] {
        let out = sh_as(bob, &script);
        assert!(!out.status.success(), "bob ran {script}");
        assert!(
            text(&out.stderr).contains("Permission denied"),
            "{}",
            text(&out.stderr)
        );
    }

    // mmkd sees its GPU time while it runs.
    wait_for("the job's GPU time", || {
        let v = json_as(&d, alice, &["top", "--once", "--interval", "300ms"]);
        let row = v
            .as_array()?
            .iter()
            .flat_map(|p| p["jobs"].as_array().into_iter().flatten())
            .find(|j| j["id"] == id)?
            .clone();
        (row["kernel_us"].as_u64()? > 0 && row["launches"].as_u64()? > 0).then_some(row)
    });
    let done = wait_state(&mut c, id, v1::JobState::Succeeded).await;
    let err = std::fs::read_to_string(std::path::Path::new(&done.log_dir).join("stderr.log"))
        .expect("stderr");
    assert!(!err.contains("unscheduled"), "{err}");
    // Every launch went through the gate.
    let parts = d.ctl_json(&["partitions", "show"]);
    let launches: u64 = parts[0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter_map(|p| p["gate"]["launches"].as_u64())
        .sum();
    assert_eq!(launches, 600);
    // And it is learned, under alice.
    let profile = wait_for("alice's learned profile", || {
        let v = json_as(&d, alice, &["profiles"]);
        let p = v.as_array()?.first()?.clone();
        (p["runs"] == 1).then_some(p)
    });
    assert_eq!(profile["name"], "learner");
    assert!(
        profile["signature"]
            .as_str()
            .is_some_and(|s| s.starts_with(&format!("{}/", alice.uid))),
        "{profile}"
    );
    assert!(
        profile["launches"].as_u64().is_some_and(|n| n > 0),
        "{profile}"
    );
}

/// A partition serves one user at a time (one MPS server per user): bob's job goes to
/// another partition, or waits saying why; alice's next job joins her own.
#[tokio::test]
async fn two_users_jobs_never_share_a_partition() {
    let Some((alice, bob, _)) = users() else {
        return;
    };
    let d = daemon();
    let job = |name: &str, gib: u32| {
        format!("name: {name}\ngpu_memory: {gib}GiB\ncommand:\n  args: [/bin/sleep, '60']\n")
    };
    let mut c = d.clients().await;
    // Alice's job fills the GPU's largest partition.
    let big = submit_as(&d, alice, &job("big", 70));
    let big = wait_state(&mut c, big, v1::JobState::Running).await;
    // Bob's small job would fit beside it, but waits, saying why.
    let small = submit_as(&d, bob, &job("small", 5));
    let reason = wait_for("bob's job to wait with a reason", || {
        let v = json_as(&d, bob, &["jobs", "get", &small.to_string()]);
        let r = v["reason"].as_str()?.to_owned();
        (v["state"] == "QUEUED" && r.contains("another user's jobs")).then_some(r)
    });
    assert!(reason.contains("one user at a time"), "{reason}");
    // Alice's own small job joins her partition.
    let hers = submit_as(&d, alice, &job("hers", 5));
    let hers = wait_state(&mut c, hers, v1::JobState::Running).await;
    let (a, b) = (
        big.assignment.expect("placed"),
        hers.assignment.expect("placed"),
    );
    assert_eq!((a.gpu_index, a.instance_id), (b.gpu_index, b.instance_id));
    // Once alice's jobs end, bob's runs.
    for id in [big.id, hers.id] {
        let out = ctl_as(&d, alice, &["jobs", "cancel", &id.to_string()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    wait_state(&mut c, small, v1::JobState::Running).await;
}

/// A gate folder another user made (in /dev/shm, say) is refused at start, not used.
#[tokio::test]
async fn a_gate_folder_another_user_made_is_refused() {
    let Some((alice, _, _)) = users() else { return };
    let t = tools();
    let dir = tempfile::tempdir().expect("tempdir");
    let planted = dir.path().join("gates");
    std::fs::create_dir(&planted).expect("mkdir");
    std::os::unix::fs::chown(&planted, Some(alice.uid), None).expect("chown");
    refused_at_start(
        dir.path(),
        &[
            "--interposer",
            &t.interposer,
            "--kernel-gate-dir",
            &planted.display().to_string(),
        ],
        &format!("belongs to uid {}", alice.uid),
    );
    assert_eq!(std::fs::read_dir(&planted).expect("dir").count(), 0);
}

/// The kernel profile a job names is read with its user's rights, bounded and non-blocking:
/// root's file is refused without showing its content, and a FIFO holds nothing up.
#[tokio::test]
async fn a_jobs_kernel_profile_is_read_as_its_user() {
    let Some((alice, _, _)) = users() else { return };
    let d = daemon();
    let secret = d.path().join("secret.json");
    std::fs::write(&secret, "\"AKIA-root-only\"").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let fifo = d.path().join("profile.fifo");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o666) }, 0);
    let online = |name: &str, profile: &std::path::Path| {
        format!(
            "name: {name}\nclass: online\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sleep, '30']\n  kernel_profile: {}\n",
            profile.display()
        )
    };
    let submit_online = |yaml: &str| {
        let file = d.path().join(format!("online-{}.yaml", rand_name()));
        std::fs::write(&file, yaml).expect("job file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let v = json_as(
            &d,
            alice,
            &["submit", "--online", &file.display().to_string()],
        );
        v["id"].as_u64().expect("id")
    };
    let mut c = d.clients().await;
    let blocked = submit_online(&online("fifo", &fifo));
    let job = wait_state(&mut c, blocked, v1::JobState::Failed).await;
    assert!(job.reason.contains("not a regular file"), "{}", job.reason);
    let stolen = submit_online(&online("secret", &secret));
    let job = wait_state(&mut c, stolen, v1::JobState::Failed).await;
    assert!(job.reason.contains("Permission denied"), "{}", job.reason);
    assert!(!job.reason.contains("AKIA"), "{}", job.reason);
    // Scheduling went on meanwhile.
    let other = submit_as(
        &d,
        alice,
        "name: other\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/true]\n",
    );
    wait_state(&mut c, other, v1::JobState::Succeeded).await;
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Watch streams are capped per user (and on the node): a caller that opens many and reads
/// none gets RESOURCE_EXHAUSTED past the cap, and a place comes back once one closes. The
/// snapshot of a watch that is never read is sent a few jobs at a time.
#[tokio::test]
async fn watches_are_capped_per_user() {
    let d = Daemon::start("a100-80gb:1");
    // Jobs of large specs, so that a snapshot of all of them would weigh.
    let big_arg = "x".repeat(60_000);
    for i in 0..20 {
        d.submit(
            "--offline",
            &format!(
                "name: big{i}\ngpu_memory: 40GiB\ncommand:\n  args: [/bin/true, {big_arg}, {big_arg}, {big_arg}, {big_arg}]\n"
            ),
        );
    }
    let mut c = d.clients().await;
    let watch = v1::WatchJobsRequest {
        include_current: true,
        ..v1::WatchJobsRequest::default()
    };
    let mut open = Vec::new();
    for _ in 0..32 {
        let stream = c
            .jobs
            .watch_jobs(watch)
            .await
            .expect("a watch within the cap")
            .into_inner();
        open.push(stream);
    }
    let refused = c
        .jobs
        .watch_jobs(watch)
        .await
        .expect_err("the 33rd watch of one user");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(refused.message().contains("watches open"), "{refused:?}");
    // The capacity stream counts too.
    let mut alloc = v1::allocation_service_client::AllocationServiceClient::new(c.channel.clone());
    let refused = alloc
        .watch_capacity(v1::WatchCapacityRequest::default())
        .await
        .expect_err("a capacity watch past the cap");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    // One closes: its place comes back. (Asked on a connection of its own: the unread
    // streams above hold their connection's flow-control window.)
    open.pop();
    let mut fresh = d.clients().await;
    let began = std::time::Instant::now();
    let mut again = loop {
        match fresh.jobs.watch_jobs(watch).await {
            Ok(s) => break s.into_inner(),
            Err(e) if began.elapsed() < PATIENCE => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no place came back: {e:?}"),
        }
    };
    // And what it sends is the whole snapshot, in order.
    let mut ids = Vec::new();
    while ids.len() < 20 {
        let ev = again.message().await.expect("an event").expect("open");
        ids.push(ev.job.expect("job").id);
    }
    assert_eq!(ids, (1..=20).collect::<Vec<u64>>());
    drop(open);
}

/// A job that fills the disk mmkd's store is on: the store keeps working (a cancel
/// completes), new jobs are refused while the disk is full, and the job is stopped, its
/// work/ removed, after which new jobs come in again.
#[tokio::test]
async fn a_job_that_fills_the_disk_is_stopped_and_the_store_keeps_working() {
    let Some(d) = Daemon::start_on_small_disk("a100-80gb:1", &["--job-disk-max", "1G"], "400m")
    else {
        return;
    };
    let mut c = d.clients().await;
    let quick = d.job_file(
        "quick.yaml",
        "name: quick\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/true]\n",
    );
    let other = d.submit(
        "--offline",
        "name: waiting\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sleep, '600']\n",
    );
    wait_state(&mut c, other, v1::JobState::Running).await;
    let filler = d.submit(
        "--offline",
        "name: filler\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sh, -c, 'dd if=/dev/zero of=\"$MMK_LOG_DIR/work/fill\" bs=1M count=1000 2>/dev/null; sleep 600']\n",
    );
    let why = wait_for("a submit refused for the full disk", || {
        let out = d.ctl(&["submit", "--offline", &quick]);
        (!out.status.success() && text(&out.stderr).contains("disk is full"))
            .then(|| text(&out.stderr))
    });
    assert!(why.contains("disk is full"), "{why}");
    // A cancel while the disk is full completes.
    let out = d.ctl(&["jobs", "cancel", &other.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cancelled = wait_state(&mut c, other, v1::JobState::Cancelled).await;
    assert_eq!(cancelled.state, v1::JobState::Cancelled as i32);
    // The filler is stopped, saying why.
    let job = wait_state(&mut c, filler, v1::JobState::Failed).await;
    assert!(
        job.reason.contains("full") && job.reason.contains("took the most"),
        "{}",
        job.reason
    );
    // Its work/ is gone, the reserve back: new jobs come in.
    let id = wait_for("a submit accepted again", || {
        let out = d.ctl(&["--output", "json", "submit", "--offline", &quick]);
        out.status.success().then(|| {
            serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")["id"]
                .as_u64()
                .expect("id")
        })
    });
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
}

/// mmkd restarted on a disk that filled while it was down starts (the store opens in the
/// reserve's room), answers reads of the jobs it has, refuses new ones saying why, and
/// takes them again once there is room.
#[tokio::test]
async fn mmkd_starts_on_a_full_disk_and_serves_reads() {
    let Some(d) = Daemon::start_on_small_disk("a100-80gb:1", &[], "400m") else {
        return;
    };
    let mut c = d.clients().await;
    let hello = d.submit(
        "--offline",
        "name: hello\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/echo, hello]\n",
    );
    wait_state(&mut c, hello, v1::JobState::Succeeded).await;
    let (_, dir) = d.terminate();
    // Everything but the reserve mmkd holds taken while it is down.
    let out = dir
        .disk()
        .expect("a small disk")
        .sh("dd if=/dev/zero of=\"$0/fill\" bs=1M count=400 2>/dev/null; df -k \"$0\"");
    assert!(text(&out.stdout).contains("100%"), "{}", text(&out.stdout));

    let d = Daemon::start_in(dir, "a100-80gb:1");
    let job = d.ctl_json(&["jobs", "get", &hello.to_string()]);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    // Its log, read where the small disk is seen.
    let socket = d.socket().display().to_string();
    let logs = d.disk().expect("a small disk").enter(&[
        env!("CARGO_BIN_EXE_mmkctl"),
        "--socket",
        &socket,
        "jobs",
        "logs",
        &hello.to_string(),
    ]);
    let out = Command::new(&logs[0])
        .args(&logs[1..])
        .output()
        .expect("mmkctl");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "hello");
    let quick = d.job_file(
        "quick.yaml",
        "name: quick\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/true]\n",
    );
    let out = d.ctl(&["submit", "--offline", &quick]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("disk is full"),
        "{}",
        text(&out.stderr)
    );
    // Room again: new jobs come in and run.
    let out = d.disk().expect("a small disk").sh("rm \"$0/fill\"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut c = d.clients().await;
    let id = wait_for("a submit accepted again", || {
        let out = d.ctl(&["--output", "json", "submit", "--offline", &quick]);
        out.status.success().then(|| {
            serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")["id"]
                .as_u64()
                .expect("id")
        })
    });
    wait_state(&mut c, id, v1::JobState::Succeeded).await;
}

/// A job's folder past its cap fails the job; an ended job's folder goes after the
/// retention.
#[tokio::test]
async fn a_jobs_folder_is_capped_and_removed_after_the_retention() {
    let d = Daemon::start_with(
        "a100-80gb:1",
        &["--job-disk-max", "8M", "--job-retention", "3s"],
    );
    let mut c = d.clients().await;
    let big = d.submit(
        "--offline",
        "name: big\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sh, -c, 'head -c 20000000 /dev/zero > \"$MMK_LOG_DIR/work/out\"; sleep 600']\n",
    );
    let job = wait_state(&mut c, big, v1::JobState::Failed).await;
    assert!(
        job.reason.contains("over the cap of 8MiB"),
        "{}",
        job.reason
    );
    let small = d.submit(
        "--offline",
        "name: small\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sh, -c, 'echo kept; echo x > \"$MMK_LOG_DIR/work/out\"']\n",
    );
    let done = wait_state(&mut c, small, v1::JobState::Succeeded).await;
    let folder = std::path::PathBuf::from(&done.log_dir);
    assert!(
        folder.join("work/out").exists(),
        "kept while the retention lasts"
    );
    wait_for("the ended jobs' folders to go", || {
        (!folder.exists() && !d.data_dir().join(format!("jobs/{big}")).exists()).then_some(())
    });
}

/// `mmkctl top` on a terminal gives the terminal back as it found it on SIGTERM (and on
/// SIGHUP, q and Ctrl-C); without a terminal it prints plain frames, no screen clears.
#[tokio::test]
async fn top_restores_the_terminal_and_prints_plain_frames_elsewhere() {
    let d = Daemon::start("a100-80gb:1");
    // A pseudo-terminal as top's standard input, where it turns echo off.
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty with out pointers to two ints and no name, settings or size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: fds openpty just returned, owned here from now on.
    let (master, slave) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    };
    let echo = |fd: &std::os::fd::OwnedFd| {
        use std::os::fd::AsRawFd;
        // SAFETY: tcgetattr on an open descriptor into a zeroed struct.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
        t.c_lflag & libc::ECHO != 0
    };
    assert!(echo(&slave), "a new terminal echoes");
    let mut top = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["top", "--interval", "200ms"])
        .stdin(std::process::Stdio::from(slave.try_clone().expect("dup")))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("mmkctl top");
    wait_for("top to turn echo off", || (!echo(&slave)).then_some(()));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(top.id() as i32, libc::SIGTERM) };
    let status = top.wait().expect("top exits");
    assert!(status.success(), "{status}");
    assert!(echo(&slave), "SIGTERM left the terminal without echo");
    drop(master);

    // Through a pipe: frames one after the other, no control sequence.
    let mut piped = Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .args(["top", "--interval", "100ms"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("mmkctl top");
    let out = piped.stdout.take().expect("stdout");
    let all = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let all = std::sync::Arc::clone(&all);
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut all = all.lock().expect("lock");
                all.push_str(&line);
                all.push('\n');
            }
        })
    };
    // Two frames, however long a loaded machine takes to print them.
    wait_for("two frames of top", || {
        (all.lock().expect("lock").matches("mmk top").count() >= 2).then_some(())
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(piped.id() as i32, libc::SIGTERM) };
    piped.wait().expect("top exits");
    reader.join().expect("reader");
    let all = all.lock().expect("lock").clone();
    assert!(!all.contains('\u{1b}'), "{all:?}");
}

/// A user who may not call mmkd (the socket is for a group they are not in) is told so,
/// and which group, rather than asked whether mmkd runs.
#[tokio::test]
async fn a_socket_the_caller_may_not_use_says_so() {
    let Some((alice, _, _)) = users() else { return };
    let d = Daemon::start_with("a100-80gb:1", &["--socket-group", ADMINS]);
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = ctl_as(&d, alice, &["jobs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("permission denied") && err.contains(&format!("group {ADMINS}")),
        "{err}"
    );
    assert!(!err.contains("is mmkd running"), "{err}");
}
