//! The one mapping between domain errors and gRPC status codes.

use mmk_core::ServiceError;
use tonic::Status;

/// Metadata key that carries the refused field of an INVALID_ARGUMENT.
pub const FIELD_METADATA: &str = "mmk-field";

pub fn service_error_to_status(e: ServiceError) -> Status {
    match e {
        ServiceError::InvalidArgument(f) => {
            let mut s = Status::invalid_argument(f.to_string());
            // Field names are bounded by FieldError; a header value also has to be
            // visible ASCII, so anything else is escaped.
            let ascii: String = f
                .field
                .chars()
                .flat_map(|c| {
                    let escaped: Vec<char> = if c.is_ascii_graphic() || c == ' ' {
                        vec![c]
                    } else {
                        c.escape_default().collect()
                    };
                    escaped
                })
                .collect();
            if let Ok(v) = ascii.parse() {
                s.metadata_mut().insert(FIELD_METADATA, v);
            }
            s
        }
        ServiceError::NotFound { .. } => Status::not_found(e.to_string()),
        ServiceError::FailedPrecondition(m) => Status::failed_precondition(m),
        ServiceError::Unavailable(m) => Status::unavailable(m),
        ServiceError::Timeout(m) => Status::deadline_exceeded(m),
        ServiceError::PermissionDenied(m) => Status::permission_denied(m),
        ServiceError::ResourceExhausted(m) => Status::resource_exhausted(m),
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

    #[test]
    fn a_hostile_field_name_comes_back_short_and_escaped() {
        let key = format!("K\r\n\0{}", "x".repeat(20_000));
        let s = service_error_to_status(ServiceError::InvalidArgument(FieldError::new(
            format!("command.env.{key}"),
            format!("{key:?} is bad"),
        )));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().len() < 1000, "{} bytes", s.message().len());
        let field = s
            .metadata()
            .get(FIELD_METADATA)
            .and_then(|v| v.to_str().ok())
            .expect("the field is in the metadata");
        assert!(field.starts_with("command.env.K\\r\\n\\0x"), "{field}");
        assert!(field.len() < 200, "{field}");
    }
}
