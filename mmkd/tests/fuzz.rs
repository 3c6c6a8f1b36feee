//! Fuzzing mmkd's config file (`mmkd --config FILE`) through what mmkd does with it,
//! `Config::resolve`: any bytes give a configuration or an error, never a panic or a hang
//! (core/tests/support/fuzz.rs says how inputs are made; `MMK_FUZZ_CASES` sets how many).

#[path = "../../core/tests/support/fuzz.rs"]
mod support;

use clap::Parser;
use mmkd::config::{Args, Config};

/// The example, and a file with every setting.
fn seeds() -> Vec<Vec<u8>> {
    vec![
        include_bytes!("../../examples/mmkd.yaml").to_vec(),
        b"socket: /tmp/mmk-fuzz/mmkd.sock\n\
          listen: 127.0.0.1:7400\n\
          tls_cert: /etc/mmk/cert.pem\n\
          tls_key: /etc/mmk/key.pem\n\
          tls_client_ca: /etc/mmk/ca.pem\n\
          data_dir: /tmp/mmk-fuzz/data\n\
          backend: sim\n\
          sim_gpus: a100-80gb:2,h100-80gb:1\n\
          sim_speed: 60\n\
          stop_grace: 3s\n\
          planner: mmk\n\
          mps: fake\n\
          mps_control: /usr/bin/nvidia-cuda-mps-control\n\
          mps_check_interval: 500ms\n\
          model: /var/lib/mmk/model.mmk\n\
          kernel_policy: orion\n\
          kernel_offline_depth: 8\n\
          kernel_gemm_slice: 8000\n\
          kernel_base: 1500us\n\
          kernel_device_wait: true\n\
          kernel_device_wait_grain: 50us\n\
          kernel_gate_dir: /dev/shm/mmk-fuzz\n\
          interposer: /usr/lib/mmk/libmmk_interposer.so\n\
          capacity_unit: 10GiB\n\
          kubelet_dir: /var/lib/kubelet/device-plugins\n\
          kubelet_pod_resources: /var/lib/kubelet/pod-resources/kubelet.sock\n\
          kubelet_check_interval: 2s\n\
          job_log_max: 64M\n\
          admin_group: root\n\
          scheduler_users: [root]\n\
          socket_group: root\n"
            .to_vec(),
    ]
}

const DICT: &[&[u8]] = &[
    b": ",
    b"\n",
    b"- ",
    b"[",
    b"]",
    b"{",
    b"}",
    b"'",
    b"&a ",
    b"*a",
    b"<<: ",
    b"~",
    b"0",
    b"-1",
    b"1e309",
    b".nan",
    b"18446744073709551616",
    b"4294967296",
    b"a100-80gb:",
    b"h200:4000000000",
    b",",
    b":",
    b"ms",
    b"us",
    b"ns",
    b"days",
    b"99999999999999999999s",
    b"GiB",
    b"TiB",
    b"[::1]:0",
    b"off",
];

#[test]
fn config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mmkd.yaml");
    let data = dir.path().join("data");
    support::fuzz("config_file", seeds(), DICT, |bytes| {
        std::fs::write(&path, bytes).expect("write config");
        let args = Args::try_parse_from([
            "mmkd".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
            "--data-dir".as_ref(),
            data.as_os_str(),
        ])
        .expect("flags parse");
        Config::resolve(args).is_ok()
    });
}
