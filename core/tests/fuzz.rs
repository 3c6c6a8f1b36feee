//! Fuzzing the `job.yaml` parser: any bytes give a spec or an error, never a panic or a
//! hang (support/fuzz.rs says how inputs are made; `MMK_FUZZ_CASES` sets how many).

#[path = "support/fuzz.rs"]
mod support;

use mmk_core::JobClass;
use mmk_core::yaml::parse_job_yaml;

/// Valid job files: the examples and one with every field.
fn seeds() -> Vec<Vec<u8>> {
    [
        include_str!("../../examples/bert-train.yaml"),
        include_str!("../../examples/resnet50-serving.yaml"),
        include_str!("../../examples/train-script.yaml"),
        "name: serve\nclass: online\ngpu_memory: 4096\nslo: 50ms\npriority: -3\ncommand:\n  \
         args: [python3, serve.py, '--port', \"8080\"]\n  env: {PORT: 8080, DEBUG: true, X: 1.5}\n  \
         workdir: /srv/model\n  profile: resnet50-inference\n  kernel_profile: k.json\n  \
         kernel_policy: orion\nrestart_policy: on-failure\nmax_restarts: 5\n",
        "name: t\ngpu_memory: 1.5GiB\ncheckpoint: true\nworkload:\n  name: resnet50-train\n  \
         batch_size: 65536\n  duration: 30days\n",
        "{name: f, class: offline, gpu_memory: 1TB, workload: {name: bert-train}}\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

const DICT: &[&[u8]] = &[
    b": ",
    b"\n",
    b"\n  ",
    b"- ",
    b"'",
    b"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"&a ",
    b"*a",
    b"!!str ",
    b"!!binary ",
    b"<<: ",
    b"? ",
    b"|\n",
    b">-\n",
    b"---\n",
    b"...\n",
    b"%YAML 1.2\n",
    b"#",
    b"\\u0000",
    b"~",
    b"null",
    b"-1",
    b"0",
    b"1e309",
    b"-0.0",
    b".nan",
    b".inf",
    b"18446744073709551616",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"0x7f",
    b"TiB",
    b"MiB",
    b"ms",
    b"ns",
    b"h",
    b"days",
    b"99999999999999999999days",
    b"name",
    b"class",
    b"gpu_memory",
    b"slo",
    b"command",
    b"args",
    b"env",
    b"MMK_",
    b"workload",
    b"duration",
    b"batch_size",
    b"online",
    b"offline",
    b"on-failure",
    b"\xc3\xa9",
    b"\xe2\x80\xae",
];

#[test]
fn job_yaml() {
    support::fuzz("job_yaml", seeds(), DICT, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let mut accepted = false;
        for class in [None, Some(JobClass::Online), Some(JobClass::Offline)] {
            accepted |= parse_job_yaml(&text, class).is_ok();
        }
        accepted
    });
}
