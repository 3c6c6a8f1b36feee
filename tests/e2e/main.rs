//! End-to-end tests: the real `mmkd` on a temporary socket with the simulated node, driven
//! by the real `mmkctl` and by a tonic client. One test binary; each test owns its daemon.

mod harness;
mod house;

mod admission;
mod bad_input;
mod cluster;
mod contain;
mod deploy;
mod jobs;
mod k8s;
mod ksched;
mod learn;
mod metrics;
mod mig_nvml;
mod mps;
mod predictor;
mod python;
mod readme;
mod restart;
mod security;
mod sharing;
mod slo;
mod slurm;
