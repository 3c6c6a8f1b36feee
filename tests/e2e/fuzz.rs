//! Fuzzing without a nightly toolchain: proptest drives each parser of hostile input with
//! arbitrary bytes and with valid inputs mutated (bytes flipped, cut short), so that the
//! parsers get past their first checks. A panic or a hang is a failure; an error is fine.
//!
//! `MMK_FUZZ_CASES` sets the cases per target (256 by default, for CI); a longer run by
//! hand: `MMK_FUZZ_CASES=100000 cargo test --test e2e fuzz -- --nocapture`. Each target
//! prints how many inputs it ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The longest one target may run before it counts as a hang.
const HANG: Duration = Duration::from_secs(300);

fn cases() -> u32 {
    std::env::var("MMK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Inputs: random bytes, or a seed with some bytes replaced, some inserted, and maybe cut.
fn inputs(seeds: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    let random = proptest::collection::vec(any::<u8>(), 0..2048).boxed();
    if seeds.is_empty() {
        return random;
    }
    let mutated = (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<usize>(), any::<u8>(), any::<bool>()), 0..12),
        proptest::option::of(any::<usize>()),
    )
        .prop_map(|(mut seed, edits, cut)| {
            for (at, byte, insert) in edits {
                let i = at % (seed.len() + 1);
                if insert || i == seed.len() {
                    seed.insert(i, byte);
                } else {
                    seed[i] = byte;
                }
            }
            if let Some(c) = cut {
                seed.truncate(c % (seed.len() + 1));
            }
            seed
        });
    prop_oneof![1 => random, 3 => mutated].boxed()
}

/// Runs `target` on the inputs in a thread of its own; fails on a panic or a hang.
fn fuzz(name: &'static str, seeds: Vec<Vec<u8>>, target: impl Fn(&[u8]) + Send + Sync + 'static) {
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&inputs(seeds), |bytes| {
            counted.fetch_add(1, Ordering::Relaxed);
            target(&bytes);
            Ok(())
        });
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    match done_rx.recv_timeout(HANG) {
        Ok(Ok(())) => eprintln!("fuzz {name}: {} executions", runs.load(Ordering::Relaxed)),
        Ok(Err(e)) => panic!("fuzz {name}: {e}"),
        Err(_) => panic!(
            "fuzz {name}: no end after {HANG:?} and {} inputs: a hang",
            runs.load(Ordering::Relaxed)
        ),
    }
}

fn example(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))).expect("example")
}

#[test]
fn fuzz_the_job_file_parser() {
    let seeds = [
        "bert-train.yaml",
        "resnet50-serving.yaml",
        "train-script.yaml",
    ]
    .map(example)
    .to_vec();
    fuzz("job.yaml", seeds, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let _ = mmk_core::yaml::parse_job_yaml(&text, None);
        let _ = mmk_core::yaml::parse_job_yaml(&text, Some(mmk_core::JobClass::Online));
    });
}

#[test]
fn fuzz_protobuf_decoding_and_validation() {
    use prost::Message;
    let seeds: Vec<Vec<u8>> = [
        "bert-train.yaml",
        "resnet50-serving.yaml",
        "train-script.yaml",
    ]
    .iter()
    .map(|f| {
        let text = String::from_utf8(example(f)).expect("utf-8");
        let spec = mmk_core::yaml::parse_job_yaml(&text, None).expect("a valid example");
        mmk_proto::v1::SubmitJobRequest {
            spec: Some(mmk_proto::spec_to_proto(&spec)),
            request_id: "r1".into(),
        }
        .encode_to_vec()
    })
    .collect();
    fuzz("SubmitJobRequest", seeds, |bytes| {
        if let Ok(req) = mmk_proto::v1::SubmitJobRequest::decode(bytes)
            && let Some(spec) = req.spec
            && let Ok(spec) = mmk_proto::spec_from_proto(spec)
        {
            let _ = spec.validate();
        }
        let _ = mmk_proto::v1::ListJobsRequest::decode(bytes);
        let _ = mmk_proto::v1::AllocateRequest::decode(bytes);
    });
}

#[test]
fn fuzz_the_config_file() {
    use clap::Parser;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mmkd.yaml");
    fuzz("mmkd.yaml", vec![example("mmkd.yaml")], move |bytes| {
        std::fs::write(&path, bytes).expect("write");
        let args = mmkd::config::Args::try_parse_from([
            "mmkd".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
        ])
        .expect("flags");
        let _ = mmkd::config::Config::resolve(args);
    });
}

#[test]
fn fuzz_the_trace_csv() {
    let trace = mmk_simulator::trace::generate(mmk_simulator::TraceSpec {
        online: 10,
        offline: 20,
        mean_interval_s: 30.0,
        seed: 1,
    });
    let seed = trace.to_csv().into_bytes();
    let seeds = vec![seed[..seed.len().min(1500)].to_vec()];
    fuzz("trace.csv", seeds, |bytes| {
        let _ = mmk_simulator::Trace::parse(&String::from_utf8_lossy(bytes));
    });
}

#[test]
fn fuzz_the_dataset_csv() {
    let csv = std::fs::read_to_string(format!(
        "{}/data/gpu/h200-2026-11-21/dataset.csv",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("the shipped dataset");
    let head: String = csv.lines().take(12).map(|l| format!("{l}\n")).collect();
    fuzz("dataset.csv", vec![head.into_bytes()], |bytes| {
        let _ = mmk_predictor::Dataset::parse(&String::from_utf8_lossy(bytes));
    });
}

#[test]
fn fuzz_the_model_file() {
    let data = mmk_predictor::groundtruth::generate(40, 1);
    let params = mmk_predictor::ForestParams {
        n_trees: 2,
        max_depth: Some(4),
        min_samples_leaf: 3,
        features_per_split: 4,
    };
    let opts = mmk_predictor::TrainOptions {
        seed: 1,
        folds: 2,
        grid: vec![params],
        final_trees: 2,
    };
    let model = mmk_predictor::Predictor::train(&data, &opts).expect("a small forest");
    let bytes = model.to_bytes().expect("bytes");
    fuzz("model file", vec![bytes], |bytes| {
        let _ = mmk_predictor::Predictor::from_bytes(bytes, "fuzz.model");
    });
}

#[test]
fn fuzz_the_gate_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("real.gate");
    let config = mmk_kernel_sched::GateConfig::new(132, mmk_kernel_sched::PolicyKind::Mmk);
    drop(mmk_kernel_sched::Gate::create(&real, &config).expect("a gate"));
    let seed = std::fs::read(&real).expect("read");
    let path = dir.path().join("fuzz.gate");
    // Gate files are larger than the random inputs: mutate the real one, and also try
    // random bytes padded to its size.
    let size = seed.len();
    fuzz("gate file", vec![seed], move |bytes| {
        let mut b = bytes.to_vec();
        if b.len() < size && b.len() % 2 == 0 {
            b.resize(size, 0);
        }
        std::fs::write(&path, &b).expect("write");
        if let Ok(gate) = mmk_kernel_sched::Gate::open(&path) {
            let _ = gate.config();
            let _ = gate.totals();
            let _ = gate.slots();
            let _ = gate.live_slots();
            let _ = gate.in_flight();
        }
    });
}
