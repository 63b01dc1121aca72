//! Small helpers every layer uses: lock recovery ([`sync`]), the shutdown
//! signal of long-running tasks ([`shutdown`]), the monotonic clock
//! ([`clock`]), the Prometheus text exposition ([`prometheus`]), printable
//! untrusted text ([`escape`]), `$(VAR)` references ([`expansion`]), files
//! written where a user says ([`output`]), retry delays ([`backoff`]).

pub mod backoff;
pub mod clock;
pub mod escape;
pub mod expansion;
pub mod fast_map;
pub mod output;

pub mod prometheus;
pub mod shutdown;
pub mod sync;
