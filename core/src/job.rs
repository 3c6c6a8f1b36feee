//! Job classes and the job state machine.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Online jobs are latency-sensitive services (inference); offline jobs are batch work
/// (training) that fills what online jobs leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobClass {
    Online,
    Offline,
}

impl JobClass {
    pub fn as_str(self) -> &'static str {
        match self {
            JobClass::Online => "online",
            JobClass::Offline => "offline",
        }
    }
}

impl fmt::Display for JobClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "online" => Ok(JobClass::Online),
            "offline" => Ok(JobClass::Offline),
            other => Err(format!(
                "unknown job class {other:?} (expected online or offline)"
            )),
        }
    }
}

/// The life of a job:
///
/// ```text
/// QUEUED -> STARTING -> RUNNING -> SUCCEEDED | FAILED
///    \          \           \
///     +----------+-----------+--> CANCELLED
/// ```
///
/// A job that was STARTING or RUNNING when mmkd died goes back to QUEUED (restart policy
/// allows it) or to FAILED when mmkd starts again. A STARTING job may also end directly
/// (a process that exits before it was recorded as running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "QUEUED",
            JobState::Starting => "STARTING",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
        }
    }

    /// A terminal state never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Whether the job holds a place on a GPU (it was placed and has not ended).
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Starting | JobState::Running)
    }

    /// The transitions the state machine allows. Requeue (`Starting|Running -> Queued`)
    /// happens only on daemon restart or when a restart policy says so.
    pub fn can_become(self, next: JobState) -> bool {
        use JobState::*;
        matches!(
            (self, next),
            (Queued, Starting | Cancelled | Failed)
                | (Starting, Running | Succeeded | Failed | Cancelled | Queued)
                | (Running, Succeeded | Failed | Cancelled | Queued)
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown job state {s:?} (expected one of queued, starting, running, succeeded, failed, cancelled)"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_allow_no_transition() {
        for from in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in JobState::ALL {
                assert!(!from.can_become(to), "{from} -> {to} must be refused");
            }
        }
    }

    #[test]
    fn states_parse_case_insensitively() {
        assert_eq!("running".parse::<JobState>(), Ok(JobState::Running));
        assert_eq!("QUEUED".parse::<JobState>(), Ok(JobState::Queued));
        assert!("done".parse::<JobState>().is_err());
        assert_eq!("Online".parse::<JobClass>(), Ok(JobClass::Online));
    }
}
