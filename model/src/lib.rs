//! stallscope's sentinel model, pure computation with no I/O: iteration features, a GBDT
//! baseline of decode latency, the out-of-fold UCL of its positive prediction error, the
//! windowed alert detector, stage classification and anchor discovery.

pub mod anchor;
pub mod baseline;
pub mod compiled;
pub mod dataset;
pub mod detector;
pub mod eval;
pub mod features;
pub mod gbdt;
pub mod recalibration;
pub mod root_cause;
pub mod sentinel;
pub mod stage;
pub mod steps;
pub mod synthetic;

pub use baseline::{Baseline, BaselineParams, Fingerprint, Sample};
pub use features::Workload;
pub use sentinel::{Iteration, ModelState, Sentinel, SentinelParams, Verdict};
pub use stage::Stage;

/// What can go wrong in the model crate.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The training data cannot be fitted.
    #[error("cannot fit the baseline: {0}")]
    Training(String),
    /// An input table is unusable.
    #[error("bad iteration table: {0}")]
    Data(String),
    /// A persisted model is unreadable or inconsistent.
    #[error("the model file is corrupt or not a stallscope model ({0}); delete it or fit a new one with `stallscope fit`")]
    Corrupt(String),
    /// A persisted model of another format than this build reads: written by another version
    /// of stallscope.
    #[error("the model file is in format {found}, written by another version of stallscope; this one reads format {supported}: fit a new one with `stallscope fit`")]
    Format { found: u32, supported: u32 },
}
