//! Small helpers every layer uses: lock recovery ([`sync`]), the shutdown
//! signal of long-running tasks ([`shutdown`]), the monotonic clock
//! ([`clock`]).

pub mod clock;

pub mod shutdown;
pub mod sync;
