//! One module per subcommand besides `run` (the sentinel's daemon): each owns its arguments
//! and wires the planes it needs.

pub mod deep_dive;
pub mod evaluate;
pub mod fleet;
pub mod gpu;
pub mod inject;
pub mod model;
pub mod probe;
pub mod replay;
