//! The simulator's error type: every refusal names its kind, and failures
//! of a run carry the seed that replays them.

use std::fmt;

/// Why a scenario could not be loaded or a run could not finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The scenario file is not valid TOML or has an unknown field.
    Parse,
    /// A scenario value is out of range or inconsistent.
    Invalid,
    /// A mode names an unknown policy or cache layer.
    UnknownMode,
    /// A bound of the engine (events, simulated time, tables) was reached.
    Bound,
    /// The scheduling core refused a call the simulator relies on.
    Scheduler,
    /// The run ended with work left undone (a deadlock in the model).
    Stuck,
    /// A report could not be drawn or written.
    Output,
    /// A recorded trace cannot be replayed (`whatif`).
    Trace,
}

/// An error from the simulator. `seed` is set for failures during a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub detail: String,
    pub seed: Option<u64>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, detail: impl Into<String>) -> Error {
        Error { kind, detail: detail.into(), seed: None }
    }

    pub(crate) fn with_seed(mut self, seed: u64) -> Error {
        self.seed = Some(seed);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::Parse => "scenario parse error",
            ErrorKind::Invalid => "invalid scenario",
            ErrorKind::UnknownMode => "unknown mode",
            ErrorKind::Bound => "simulation bound reached",
            ErrorKind::Scheduler => "scheduler refused",
            ErrorKind::Stuck => "simulation stuck",
            ErrorKind::Output => "cannot write output",
            ErrorKind::Trace => "cannot replay the trace",
        };
        write!(f, "{what}: {}", self.detail)?;
        if let Some(seed) = self.seed {
            write!(f, " (replay with --seed {seed})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
