//! Small helpers every layer uses: lock recovery ([`sync`]), the shutdown
//! signal of long-running tasks ([`shutdown`]), the monotonic clock
//! ([`clock`]), the Prometheus text exposition ([`prometheus`]).

pub mod clock;

pub mod prometheus;
pub mod shutdown;
pub mod sync;
