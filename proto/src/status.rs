//! The one mapping between domain errors and gRPC status codes.

use mmk_core::ServiceError;
use tonic::Status;

/// Metadata key that carries the refused field of an INVALID_ARGUMENT.
pub const FIELD_METADATA: &str = "mmk-field";

pub fn service_error_to_status(e: ServiceError) -> Status {
    match e {
        ServiceError::InvalidArgument(f) => {
            let mut s = Status::invalid_argument(f.to_string());
            if let Ok(v) = f.field.parse() {
                s.metadata_mut().insert(FIELD_METADATA, v);
            }
            s
        }
        ServiceError::NotFound { .. } => Status::not_found(e.to_string()),
        ServiceError::FailedPrecondition(m) => Status::failed_precondition(m),
        ServiceError::Unavailable(m) => Status::unavailable(m),
        ServiceError::Timeout(m) => Status::deadline_exceeded(m),
        ServiceError::PermissionDenied(m) => Status::permission_denied(m),
        ServiceError::Internal(m) => Status::internal(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmk_core::FieldError;
    use tonic::Code;

    #[test]
    fn each_error_has_its_code() {
        let s = service_error_to_status(ServiceError::InvalidArgument(FieldError::new(
            "gpu_memory",
            "must be greater than zero",
        )));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "gpu_memory: must be greater than zero");
        let field = s
            .metadata()
            .get(FIELD_METADATA)
            .and_then(|v| v.to_str().ok());
        assert_eq!(field, Some("gpu_memory"));
        let s = service_error_to_status(ServiceError::NotFound {
            what: "job",
            id: "7".into(),
        });
        assert_eq!((s.code(), s.message()), (Code::NotFound, "job 7 not found"));
        let s = service_error_to_status(ServiceError::FailedPrecondition("ended".into()));
        assert_eq!(s.code(), Code::FailedPrecondition);
        let s = service_error_to_status(ServiceError::Unavailable("gpu lost".into()));
        assert_eq!(s.code(), Code::Unavailable);
        let s = service_error_to_status(ServiceError::Internal("store failed".into()));
        assert_eq!(s.code(), Code::Internal);
    }
}
