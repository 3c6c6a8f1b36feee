//! Errors of mmkd's parts as callers see them: each part (the store, the GPU backend, the
//! runner, the MPS daemons, the kernel scheduler) has its own typed error with its causes
//! as sources; this is the one place where they become the service's errors, and
//! proto/src/status.rs the one place where those become gRPC codes.

use mmk_core::ServiceError;

use crate::backend::BackendError;

pub use mmk_core::error::chain;

/// What a GPU backend's refusal means to a caller: a busy instance or a GPU whose MIG mode
/// forbids the step is the node's state (FAILED_PRECONDITION), a GPU or instance that is
/// not there is NOT_FOUND, and only the driver itself failing is UNAVAILABLE.
impl From<BackendError> for ServiceError {
    fn from(e: BackendError) -> ServiceError {
        match &e {
            BackendError::NoSuchGpu { gpu } => ServiceError::NotFound {
                what: "gpu",
                id: gpu.to_string(),
            },
            BackendError::NoSuchInstance { instance, .. } => ServiceError::NotFound {
                what: "gpu instance",
                id: instance.to_string(),
            },
            BackendError::InUse { .. }
            | BackendError::MigDisabled { .. }
            | BackendError::InvalidPlacement { .. }
            | BackendError::ReadOnly { .. }
            | BackendError::NotHanded { .. }
            | BackendError::Foreign { .. }
            | BackendError::Refused { .. } => ServiceError::FailedPrecondition(e.to_string()),
            BackendError::Nvml { .. } => ServiceError::Unavailable(chain(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_get_the_code_of_what_they_mean() {
        let busy = ServiceError::from(BackendError::InUse {
            gpu: 1,
            instance: 7,
        });
        assert!(
            matches!(&busy, ServiceError::FailedPrecondition(m) if m == "gpu 1: instance 7 is in use"),
            "{busy:?}"
        );
        let off = ServiceError::from(BackendError::MigDisabled { gpu: 0 });
        assert!(
            matches!(off, ServiceError::FailedPrecondition(_)),
            "{off:?}"
        );
        let gone = ServiceError::from(BackendError::NoSuchGpu { gpu: 9 });
        assert_eq!(gone.to_string(), "gpu 9 not found");
        let driver = ServiceError::from(BackendError::Nvml {
            context: "gpu 0: create instance".into(),
            source: nvml_wrapper::error::NvmlError::DriverNotLoaded,
        });
        assert!(
            matches!(&driver, ServiceError::Unavailable(m) if m.starts_with("nvml: gpu 0: create instance: ")),
            "{driver:?}"
        );
    }

    #[test]
    fn a_chain_names_every_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = crate::joblog::JobDirError::Io {
            what: "create",
            path: "/data/jobs/7".into(),
            source: io,
        };
        assert_eq!(
            chain(&e),
            "cannot create /data/jobs/7: No such file or directory"
        );
    }
}
