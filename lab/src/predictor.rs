//! `mmk-lab predictor`: make a dataset, train a model, evaluate it, explain it. These run
//! here, without mmkd; mmkd loads the model file with `--model`.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use mmk_predictor::eval::{self, ModelScore};
use mmk_predictor::{Dataset, Predictor, TrainOptions, groundtruth};
use serde::Serialize;

use mmk_cli::{Failure, Format};
use mmk_core::error::chain as source_chain;

#[derive(Debug, Subcommand)]
pub enum PredictorCommand {
    /// Write rows generated from the simulator's ground-truth model (a stand-in until
    /// measured data exists; docs/predictor.md).
    Generate {
        /// Where the CSV goes.
        #[arg(short = 'o', long = "out", value_name = "DATA.csv")]
        out: PathBuf,
        #[arg(long, default_value_t = 1400)]
        rows: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Turn measurements from `mmk-lab measure` into a dataset (docs/measure.md).
    Import {
        /// Measurement files (JSON lines); several are read as one.
        #[arg(required = true)]
        raw: Vec<PathBuf>,
        /// Where the CSV goes.
        #[arg(short = 'o', long = "out", value_name = "DATA.csv")]
        out: PathBuf,
    },
    /// Train the random forest on a dataset (hyper-parameters by cross-validation).
    Train {
        data: PathBuf,
        /// Where the model file goes.
        #[arg(short = 'o', long = "out", value_name = "MODEL")]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The model's errors on a dataset, and the forest against other model families on a
    /// held-out 20 % of it (the paper's Table IV).
    Eval {
        model: PathBuf,
        data: PathBuf,
        /// Seeds the 80/20 split.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The model's hyper-parameters and feature importances.
    Explain { model: PathBuf },
    /// The model's errors on measured runs when each job's profile comes from the workload
    /// table (named), from its own launches (learned), from nothing (the prior), or from
    /// GPM alone (the reference) (docs/predictor.md).
    Sources {
        /// Measurement files from `mmk-lab measure` (runs alone and in pairs, and
        /// `kernels` records); several are read as one.
        #[arg(required = true)]
        raw: Vec<PathBuf>,
        /// A model file [default: the forest built into mmkd].
        #[arg(long, value_name = "MODEL")]
        model: Option<PathBuf>,
    },
}

fn load_data(path: &Path) -> Result<Dataset, Failure> {
    Dataset::load(path)
        .map_err(|e| Failure::usage(format!("{}: {}", path.display(), source_chain(&e))))
}

fn load_model(path: &Path) -> Result<Predictor, Failure> {
    Predictor::load(path).map_err(|e| Failure::usage(source_chain(&e)))
}

fn json(v: &impl Serialize) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => eprintln!("mmk-lab: cannot write JSON: {e}"),
    }
}

/// `predictor train`: a forest cross-validated on `data`, written to `out`.
fn train(fmt: Format, data: &Path, out: &Path, seed: u64) -> Result<(), Failure> {
    let d = load_data(data)?;
    let opts = TrainOptions::standard(seed);
    eprintln!(
        "training on {} rows: {} candidates x {} folds, then {} trees",
        d.rows.len(),
        opts.grid.len(),
        opts.folds,
        opts.final_trees
    );
    let started = std::time::Instant::now();
    let model = Predictor::train(&d, &opts).map_err(|e| Failure::usage(e.to_string()))?;
    model
        .save(out)
        .map_err(|e| Failure::usage(source_chain(&e)))?;
    #[derive(Serialize)]
    struct Cv {
        params: String,
        cv_rel_error_pct: f64,
    }
    #[derive(Serialize)]
    struct Trained {
        model: String,
        rows: u64,
        seed: u64,
        chosen: String,
        seconds: f64,
        cross_validation: Vec<Cv>,
    }
    let t = Trained {
        model: out.display().to_string(),
        rows: model.rows,
        seed,
        chosen: model.params.to_string(),
        seconds: started.elapsed().as_secs_f64(),
        cross_validation: model
            .cv
            .iter()
            .map(|c| Cv {
                params: c.params.to_string(),
                cv_rel_error_pct: c.mre_pct,
            })
            .collect(),
    };
    match fmt {
        Format::Json => json(&t),
        Format::Table => {
            outln!("CANDIDATE (cross-validated)                                REL ERR");
            for c in &t.cross_validation {
                outln!("{:<58} {:>6.2} %", c.params, c.cv_rel_error_pct);
            }
            outln!(
                "wrote {} ({} rows, {:.1} s): {}",
                t.model,
                t.rows,
                t.seconds,
                t.chosen
            );
        }
    }
    Ok(())
}

pub fn run(fmt: Format, cmd: PredictorCommand) -> Result<(), Failure> {
    match cmd {
        PredictorCommand::Generate { out, rows, seed } => {
            if rows == 0 {
                return Err(Failure::usage("--rows must be at least 1"));
            }
            let data = groundtruth::generate(rows, seed);
            std::fs::write(&out, data.to_csv())
                .map_err(|e| Failure::usage(format!("cannot write {}: {e}", out.display())))?;
            eprintln!(
                "wrote {rows} rows to {} (generated from the simulator's ground-truth model, seed {seed})",
                out.display()
            );
            Ok(())
        }
        PredictorCommand::Import { raw, out } => {
            let (rows, skipped) = crate::measure::convert(&raw, &out)
                .map_err(|e| Failure::usage(mmk_core::error::chain(&e)))?;
            #[derive(Serialize)]
            struct Imported<'a> {
                out: String,
                rows: usize,
                skipped: &'a [String],
            }
            let i = Imported {
                out: out.display().to_string(),
                rows,
                skipped: &skipped,
            };
            match fmt {
                Format::Json => json(&i),
                Format::Table => {
                    for s in &skipped {
                        outln!("no row: {s}");
                    }
                    outln!(
                        "wrote {rows} rows to {} ({} runs gave none)",
                        i.out,
                        skipped.len()
                    );
                }
            }
            Ok(())
        }
        PredictorCommand::Train { data, out, seed } => train(fmt, &data, &out, seed),
        PredictorCommand::Eval { model, data, seed } => {
            let m = load_model(&model)?;
            let d = load_data(&data)?;
            let (x, y) = d.xy();
            let pred = m.predict(&x).map_err(|e| Failure::usage(e.to_string()))?;
            let own = eval::Errors::of(&pred, &y);
            let table =
                eval::compare(&d, m.params, seed).map_err(|e| Failure::usage(e.to_string()))?;
            #[derive(Serialize)]
            struct Report<'a> {
                model_on_all_rows: &'a eval::Errors,
                held_out: &'a [ModelScore],
            }
            match fmt {
                Format::Json => json(&Report {
                    model_on_all_rows: &own,
                    held_out: &table,
                }),
                Format::Table => print_eval(&model, &own, &table),
            }
            Ok(())
        }
        PredictorCommand::Sources { raw, model } => sources(fmt, &raw, model.as_deref()),
        PredictorCommand::Explain { model } => {
            let m = load_model(&model)?;
            let imp = m.importances().map_err(|e| Failure::usage(e.to_string()))?;
            #[derive(Serialize)]
            struct Explained {
                chosen: String,
                rows: u64,
                seed: u64,
                importances: Vec<(&'static str, f64)>,
            }
            let e = Explained {
                chosen: m.params.to_string(),
                rows: m.rows,
                seed: m.seed,
                importances: imp,
            };
            match fmt {
                Format::Json => json(&e),
                Format::Table => {
                    outln!("{} (trained on {} rows, seed {})", e.chosen, e.rows, e.seed);
                    outln!("FEATURE               IMPORTANCE");
                    for (name, v) in &e.importances {
                        let bar = "#".repeat((v * 50.0).round() as usize);
                        outln!("{name:<21} {v:>6.3}  {bar}");
                    }
                }
            }
            Ok(())
        }
    }
}

fn sources(fmt: Format, raw: &[PathBuf], model: Option<&Path>) -> Result<(), Failure> {
    let m = match model {
        Some(path) => load_model(path)?,
        None => mmk_predictor::shipped::load().map_err(|e| Failure::usage(source_chain(&e)))?,
    };
    let mut records = Vec::new();
    for path in raw {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
        records.extend(
            mmk_predictor::measured::parse(&text)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
        );
    }
    let c =
        mmk_predictor::sources::compare(&records, &m).map_err(|e| Failure::usage(e.to_string()))?;
    match fmt {
        Format::Json => json(&c),
        Format::Table => {
            for l in &c.left_out {
                outln!("left out: {l}");
            }
            let rows = c.scores.first().map_or(0, |s| s.overall.rows);
            outln!(
                "{} jobs, {rows} configurations; relative error (absolute error)",
                c.jobs.len()
            );
            outln!("PROFILE     ALL                 ONLINE              OFFLINE");
            let cell =
                |e: &eval::Errors| format!("{:>6.2} % ({:.4})", e.rel_error_pct, e.abs_error);
            for s in &c.scores {
                outln!(
                    "{:<11} {:<19} {:<19} {}",
                    s.source.as_str(),
                    cell(&s.overall),
                    cell(&s.online),
                    cell(&s.offline)
                );
            }
        }
    }
    Ok(())
}

fn print_eval(model: &Path, own: &eval::Errors, table: &[ModelScore]) {
    outln!(
        "{} on all {} rows: absolute error {:.4}, relative error {:.2} %",
        model.display(),
        own.rows,
        own.abs_error,
        own.rel_error_pct
    );
    let held = table.first().map_or(0, |s| s.overall.rows);
    outln!();
    outln!("held out: {held} rows (20 %), each model trained on the other 80 %");
    outln!("MODEL                          ABS ERR   REL ERR");
    for s in table {
        outln!(
            "{:<30} {:>7.4} {:>8.2} %",
            s.model,
            s.overall.abs_error,
            s.overall.rel_error_pct
        );
    }
    outln!();
    outln!("relative error per workload (held-out rows)");
    let mut header = format!("{:<28}", "WORKLOAD");
    for s in table {
        header.push_str(&format!(" {:>8}", short(&s.model)));
    }
    outln!("{header}");
    if let Some(first) = table.first() {
        for (w, e) in &first.per_workload {
            let mut line = format!("{:<28}", format!("{w} ({})", e.rows));
            for s in table {
                let v = s.per_workload.get(w).map_or(f64::NAN, |e| e.rel_error_pct);
                line.push_str(&format!(" {:>6.2} %", v));
            }
            outln!("{line}");
        }
    }
    outln!();
    outln!(
        "absolute error: mean |predicted - measured| normalized performance; relative: the same over measured, in percent"
    );
}

fn short(model: &str) -> &str {
    match model.split_whitespace().next() {
        Some("random") => "RF",
        Some("linear") => "LR",
        Some("SVR") => "SVR",
        Some("k-nearest") => "kNN",
        Some("analytic") => "analytic",
        _ => model,
    }
}
