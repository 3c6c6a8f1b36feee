//! The install pieces agree with each other and with the code: the Debian package's files
//! (Cargo.toml's `package.metadata.deb`), its systemd unit and `/etc/mmk/mmkd.yaml`, the
//! container image's recipe and the Kubernetes DaemonSet. (Building and installing the
//! package is `.ci/run`'s; building the image needs a container builder, docs/install.md.)

use std::path::Path;

use serde_json::Value;

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

const VERSION: &str = env!("CARGO_PKG_VERSION");
const DATA_DIR: &str = "/var/lib/mmk";

/// Where the package puts `src`: its asset line in Cargo.toml.
fn installed_dir(manifest: &str, src: &str) -> String {
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("[\"{src}\"")))
        .unwrap_or_else(|| panic!("no asset {src} in Cargo.toml's package.metadata.deb"));
    let dest = line.split('"').nth(3).expect("a destination");
    format!("/{}", dest.trim_end_matches('/'))
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("YAML: {e}"))
}

#[test]
fn the_package_its_unit_and_its_config_agree_with_mmkd() {
    let manifest = repo("Cargo.toml");
    assert!(manifest.contains("[package.metadata.deb]\nname = \"mmk\""));
    assert_eq!(installed_dir(&manifest, "target/release/mmkd"), "/usr/bin");
    assert_eq!(
        installed_dir(&manifest, "target/release/mmkctl"),
        "/usr/bin"
    );
    // mmkd finds the interposer in ../lib/mmk from /usr/bin (ksched::default_interposer).
    assert_eq!(
        installed_dir(&manifest, "target/release/libmmk_interposer.so"),
        "/usr/lib/mmk"
    );
    assert_eq!(
        installed_dir(&manifest, "deploy/slurm/mmk-task-prolog.sh"),
        "/usr/lib/mmk/slurm"
    );
    assert_eq!(
        installed_dir(&manifest, "deploy/debian/mmkd.yaml"),
        "/etc/mmk"
    );

    let unit = repo("deploy/debian/mmkd.service");
    assert!(
        unit.contains("\nExecStart=/usr/bin/mmkd --config /etc/mmk/mmkd.yaml\n"),
        "{unit}"
    );
    for line in [
        "RuntimeDirectory=mmk",
        "StateDirectory=mmk",
        "Restart=on-failure",
        "WantedBy=multi-user.target",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "{line} missing from the unit"
        );
    }
    let config = yaml(&repo("deploy/debian/mmkd.yaml"));
    // systemd's RuntimeDirectory=mmk is the socket's folder; StateDirectory=mmk the data dir.
    assert_eq!(config["socket"], mmk_core::paths::NODE_SOCKET);
    assert_eq!(config["data_dir"], DATA_DIR);
    assert_eq!(config["socket_group"], "mmk");
    let postinst = repo("deploy/debian/postinst");
    assert!(postinst.contains("groupadd --system mmk"), "{postinst}");
    for script in ["postinst", "prerm", "postrm"] {
        assert!(
            repo(&format!("deploy/debian/{script}")).contains("#DEBHELPER#"),
            "{script} lacks #DEBHELPER#, where cargo-deb puts the unit's steps"
        );
    }
}

#[test]
fn the_image_recipe_and_the_daemonset_agree() {
    let manifest = repo("Cargo.toml");
    let recipe = repo("deploy/kubernetes/Containerfile");
    let tag = format!("mmk/mmkd:{VERSION}");
    assert!(
        recipe.contains(&format!("\nARG VERSION={VERSION}\n")),
        "{recipe}"
    );
    assert!(
        recipe.contains("COPY target/debian/mmk_${VERSION}-1_amd64.deb"),
        "the image installs the package cargo deb makes: {recipe}"
    );
    assert!(recipe.contains(&format!("-t {tag} .")), "{recipe}");
    assert!(
        recipe.contains("ENTRYPOINT [\"/usr/bin/mmkd\"]"),
        "{recipe}"
    );

    let text = repo("deploy/kubernetes/mmkd-daemonset.yaml");
    let daemonset = yaml(text.split("\n---\n").next().expect("the DaemonSet"));
    let pod = &daemonset["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    let mmkd = &pod["containers"][0];
    assert_eq!(init["image"], tag.as_str());
    assert_eq!(mmkd["image"], tag.as_str());

    let args: Vec<&str> = mmkd["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let arg = |flag: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{flag}=")))
            .unwrap_or_else(|| panic!("{flag} missing from {args:?}"))
    };
    assert_eq!(arg("--socket"), mmk_core::paths::NODE_SOCKET);
    assert_eq!(arg("--data-dir"), DATA_DIR);
    // The interposer pods load is where the init container copies the package's.
    let interposer = format!("{DATA_DIR}/lib/libmmk_interposer.so");
    assert_eq!(arg("--interposer"), interposer);
    let copy = init["command"][2]
        .as_str()
        .expect("the init container's script");
    let packaged = format!(
        "{}/libmmk_interposer.so",
        installed_dir(&manifest, "target/release/libmmk_interposer.so")
    );
    assert!(
        copy.contains(&format!("cp {packaged} {DATA_DIR}/lib/")),
        "{copy}"
    );

    // Each path mmkd uses is a host path mounted at the same place.
    let mounts = mmkd["volumeMounts"].as_array().expect("mounts");
    let volumes = pod["volumes"].as_array().expect("volumes");
    let host_path_at = |mount_path: &str| -> String {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == mount_path)
            .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("the mount's volume");
        v["hostPath"]["path"]
            .as_str()
            .expect("a host path")
            .to_owned()
    };
    assert_eq!(host_path_at(DATA_DIR), DATA_DIR);
    let socket_dir = Path::new(mmk_core::paths::NODE_SOCKET)
        .parent()
        .expect("a folder")
        .display()
        .to_string();
    assert_eq!(host_path_at(&socket_dir), socket_dir);
    let plugins = arg("--kubelet-dir");
    assert_eq!(host_path_at(plugins), plugins);
    let pod_resources = Path::new(arg("--kubelet-pod-resources"))
        .parent()
        .expect("a folder")
        .display()
        .to_string();
    assert_eq!(host_path_at(&pod_resources), pod_resources);
    let probe = mmkd["readinessProbe"]["exec"]["command"]
        .as_array()
        .expect("a probe");
    let socket_flag = format!("--socket={}", mmk_core::paths::NODE_SOCKET);
    assert!(
        probe
            .iter()
            .any(|a| a.as_str() == Some(socket_flag.as_str())),
        "{probe:?}"
    );
}
