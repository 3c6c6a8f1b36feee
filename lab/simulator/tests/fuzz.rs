//! Fuzzing the trace CSV parser (`mmk-lab simulate --trace`): any bytes give a trace or an
//! error, never a panic or a hang; a small accepted trace also simulates without either
//! (core/tests/support/fuzz.rs says how inputs are made; `MMK_FUZZ_CASES` sets how many).

#[path = "../../../core/tests/support/fuzz.rs"]
mod support;

use std::sync::Arc;

use mmk_partitioner::{AnalyticModel, planner};
use mmk_simulator::trace::{HEADER, generate};
use mmk_simulator::{SimConfig, Trace, TraceSpec, simulate};

fn seeds() -> Vec<Vec<u8>> {
    let generated = generate(TraceSpec {
        online: 3,
        offline: 3,
        mean_interval_s: 30.0,
        seed: 1,
        checkpointable: 1.0,
        durations: mmk_simulator::trace::Durations::Uniform,
        burst: 1.0,
    })
    .to_csv();
    vec![
        generated.into_bytes(),
        format!(
            "# a comment\n{HEADER}\n\n0,resnet50-inference,online,60,4096,false\n  \
             12.5 , bert-train , offline , 3600 , 30720 , true \n"
        )
        .into_bytes(),
        b"arrival_s, workload, class, duration_s, gpu_memory_mib, checkpoint\r\n\
         1,resnet18-inference,online,0.001,1,false\r\n"
            .to_vec(),
    ]
}

const DICT: &[&[u8]] = &[
    b",",
    b"\n",
    b"\r",
    b"#",
    b" ",
    b"0",
    b"-0",
    b"1e308",
    b"1e309",
    b"inf",
    b"NaN",
    b"0.0000001",
    b"18446744073709551615",
    b"18446744073709551616",
    b"online",
    b"offline",
    b"true",
    b"false",
    b"resnet50-inference",
    b"bert-train",
    b"\xc3\xa9",
];

#[test]
fn trace_csv() {
    support::fuzz("trace_csv", seeds(), DICT, |bytes| {
        let Ok(trace) = Trace::parse(&String::from_utf8_lossy(bytes)) else {
            return false;
        };
        if trace.jobs.len() <= 8 {
            let cfg = SimConfig::new("a100-80gb", 1);
            let model = Arc::new(AnalyticModel::default());
            for name in ["first-fit", "mmk"] {
                let Some(p) = planner(name, model.clone()) else {
                    panic!("no planner {name}");
                };
                let _ = simulate(&trace, &cfg, p.as_ref(), model.as_ref(), &mut |_, _| {});
            }
        }
        true
    });
}

/// Found by `trace_csv`: a job arriving after 1.5e22 s passed the parser, and the
/// simulation of it never ended (its clock no longer moved).
#[test]
fn times_beyond_the_simulators_clock_are_refused() {
    let e = Trace::parse(&format!(
        "{HEADER}\n15184467440737095516151.066,vgg19-train,offline,1493.820,14336,true\n"
    ))
    .expect_err("too late");
    assert_eq!(
        e.to_string(),
        "line 2, column arrival_s: \"15184467440737095516151.066\" is not a number from 0 to \
         1e9 (about 31 years)"
    );
    let e = Trace::parse(&format!(
        "{HEADER}\n0,vgg19-train,offline,1e10,14336,true\n"
    ))
    .expect_err("too long");
    assert!(
        e.to_string()
            .starts_with("line 2, column duration_s: \"1e10\""),
        "{e}"
    );
}
