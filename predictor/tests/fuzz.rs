//! Fuzzing the predictor's inputs: the dataset CSV (`mmk-lab predictor train`), the
//! measurement records (`mmk-lab measure`) and the model file (`mmkd --model`, `mmkctl
//! simulate --model`). Any bytes give a value or an error, never a panic or a hang; what is
//! accepted is then used as its readers use it (core/tests/support/fuzz.rs says how inputs
//! are made; `MMK_FUZZ_CASES` sets how many).

#[path = "../../core/tests/support/fuzz.rs"]
mod support;

use mmk_predictor::forest::{FORMAT_VERSION, MAGIC};
use mmk_predictor::{Dataset, ForestParams, Predictor, TrainOptions, groundtruth, measured};

/// Training small enough to run on every accepted input.
fn quick() -> TrainOptions {
    TrainOptions {
        seed: 3,
        folds: 2,
        grid: vec![ForestParams {
            n_trees: 3,
            max_depth: Some(6),
            min_samples_leaf: 1,
            features_per_split: 8,
        }],
        final_trees: 3,
    }
}

const CSV_DICT: &[&[u8]] = &[
    b",",
    b",,",
    b"\n",
    b"\r\n",
    b"#",
    b" ",
    b"0",
    b"1",
    b"64",
    b"100",
    b"1.5",
    b"-0",
    b"1e-300",
    b"1e309",
    b"NaN",
    b"inf",
    b"online",
    b"offline",
    b"\xc3\xa9",
];

#[test]
fn dataset_csv() {
    let seeds = vec![
        groundtruth::generate(12, 1).to_csv().into_bytes(),
        include_str!("../../data/gpu/h200-2026-11-21/dataset.csv")
            .lines()
            .take(8)
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes(),
    ];
    support::fuzz("dataset_csv", seeds, CSV_DICT, |bytes| {
        let Ok(data) = Dataset::parse(&String::from_utf8_lossy(bytes)) else {
            return false;
        };
        let _ = data.xy();
        if data.rows.len() <= 64 {
            // What `mmk-lab predictor train` does with it.
            if let Ok(model) = Predictor::train(&data, &quick()) {
                let _ = model.predict(&data.xy().0);
            }
        }
        true
    });
}

/// The first `n` lines of a measurement file of data/gpu.
fn head(text: &str, n: usize) -> String {
    text.lines().take(n).map(|l| format!("{l}\n")).collect()
}

#[test]
fn measured_jsonl() {
    let alone = include_str!("../../data/gpu/h200-2026-11-21/raw-alone.jsonl");
    let pairs = include_str!("../../data/gpu/h200-2026-11-21/raw-pairs.jsonl");
    let groups = include_str!("../../data/gpu/h200-2026-11-21/raw-groups.jsonl");
    let deep = include_str!("../../data/gpu/h200-2026-11-21/raw-deep.jsonl");
    let kernels = include_str!("../../data/gpu/h200-2026-11-21/raw-kernels.jsonl");
    let seeds = vec![
        head(alone, 12).into_bytes(),
        format!(
            "{}{}",
            head(alone, 30),
            pairs
                .lines()
                .skip(1)
                .take(3)
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        )
        .into_bytes(),
        head(groups, 3).into_bytes(),
        head(deep, 2).into_bytes(),
        head(kernels, 3).into_bytes(),
    ];
    let dict: &[&[u8]] = &[
        b"\"",
        b",",
        b":",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\n",
        b"null",
        b"0",
        b"-1",
        b"1e309",
        b"4294967296",
        b"\"alone\"",
        b"\"pair\"",
        b"\"group\"",
        b"\"deep\"",
        b"\"kernels\"",
        b"\"run\"",
        b"\"failed\"",
        b"\"header\"",
        b"\\u0000",
    ];
    support::fuzz("measured_jsonl", seeds, dict, |bytes| {
        let Ok(records) = measured::parse(&String::from_utf8_lossy(bytes)) else {
            return false;
        };
        // What `mmk-lab measure` does with them.
        let _ = measured::to_dataset(&records);
        true
    });
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `bytes` with a valid header for what follows it (magic, version, length, checksum), so
/// that a mutated payload reaches the decoder.
fn with_header(bytes: &[u8]) -> Vec<u8> {
    let payload = bytes.get(28..).unwrap_or_default();
    let mut out = Vec::with_capacity(payload.len() + 28);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

#[test]
fn model_file() {
    let data = groundtruth::generate(40, 2);
    let model = Predictor::train(&data, &quick()).expect("train");
    let seeds = vec![model.to_bytes().expect("model bytes")];
    let (x, _) = data.xy();
    let probe: Vec<Vec<f64>> = x.into_iter().take(4).collect();
    let features = data.rows[0].features;
    support::fuzz(
        "model_file",
        seeds,
        &[b"\x00", b"\xff\xff\xff\xff\x0f"],
        |bytes| {
            let mut accepted = false;
            for b in [bytes.to_vec(), with_header(bytes)] {
                // What mmkd and mmkctl do with a model they load.
                if let Ok(m) = Predictor::from_bytes(&b, "fuzz.mmk") {
                    accepted = true;
                    let _ = m.predict(&probe);
                    let _ = m.predict_one(&features);
                    let _ = m.importances();
                }
            }
            accepted
        },
    );
}
