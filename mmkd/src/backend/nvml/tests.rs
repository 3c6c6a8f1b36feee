use super::*;
use mmk_core::ServiceError;

fn mapped(e: NvmlError, instance: Option<u32>) -> BackendError {
    refusal(1, instance, "destroy instance 7".into())(e)
}

#[test]
fn the_drivers_refusals_become_the_backends_errors_with_their_codes() {
    let busy = mapped(NvmlError::InUse, Some(7));
    assert!(
        matches!(
            busy,
            BackendError::InUse {
                gpu: 1,
                instance: 7
            }
        ),
        "{busy:?}"
    );
    assert!(matches!(
        ServiceError::from(busy),
        ServiceError::FailedPrecondition(_)
    ));
    let gone = mapped(NvmlError::NotFound, Some(7));
    assert!(matches!(
        ServiceError::from(gone),
        ServiceError::NotFound { .. }
    ));
    let full = mapped(NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES), None);
    assert_eq!(
        full.to_string(),
        "gpu 1: destroy instance 7: the driver refused it: insufficient resources (the slices are taken)"
    );
    let root = mapped(NvmlError::NoPermission, None);
    assert!(root.to_string().contains("must run as root"), "{root}");
    assert!(matches!(
        ServiceError::from(root),
        ServiceError::FailedPrecondition(_)
    ));
    let off = mapped(NvmlError::NotSupported, None);
    assert!(off.to_string().contains("MIG mode off"), "{off}");
    let driver = mapped(NvmlError::Unknown, None);
    assert!(matches!(
        ServiceError::from(driver),
        ServiceError::Unavailable(_)
    ));
}
