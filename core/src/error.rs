//! The errors mmkd's services return. `mmk-proto` maps each to a gRPC code, in one place.

use thiserror::Error;

use crate::spec::FieldError;

#[derive(Debug, Error)]
pub enum ServiceError {
    /// A field of the request is wrong; nothing was stored.
    #[error("{0}")]
    InvalidArgument(FieldError),
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    /// The request is well-formed but the node's state refuses it (cancelling a job that
    /// has ended, a job larger than any partition the node can make).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller may not do this (an unidentified caller asking a root mmkd to run a
    /// process).
    #[error("{0}")]
    PermissionDenied(String),
    /// A resource of the node ran out (its disk); nothing was stored.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The operation did not finish in time; its effect may still come.
    #[error("{0}")]
    Timeout(String),
    /// The GPU, the store or another part of the node is not available now.
    #[error("{0}")]
    Unavailable(String),
    /// Something failed inside mmkd. The message is for the client and holds no internals;
    /// details are in mmkd's log.
    #[error("{0}")]
    Internal(String),
}

impl From<FieldError> for ServiceError {
    fn from(e: FieldError) -> Self {
        ServiceError::InvalidArgument(e)
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;

/// An error and its causes on one line (`cannot start "x": No such file or directory`), for
/// a job's reason, a log line or a CLI message; a cause whose text the line already ends
/// with is not repeated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
