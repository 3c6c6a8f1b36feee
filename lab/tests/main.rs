//! The lab tools end to end: `mmk-lab simulate`, `predictor`, `measure`, `profile` and
//! `ksim` run as a user runs them, on the fake driver where they need a GPU.

mod harness;
mod kernels;
mod predictor;
mod simulate;
