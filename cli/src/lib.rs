//! The `volmgr` command's library half: the agent's wiring ([`agent`]), the
//! local API on `ROOT/volmgr.sock` ([`api`]) that `volmgr status` and
//! `volmgr wait` call, and the text `volmgr status` prints
//! ([`status_text`]). It sits above the `volmgr` library and is the only
//! place, with `main.rs`, that knows about the command line; `libvolmgr` (the
//! C ABI) links none of it.

pub mod agent;
pub mod api;
pub mod doctor;
pub mod findings_text;
pub mod limits;
pub mod metrics_server;
pub mod observe;
pub mod observe_events;
pub mod sandbox;
pub mod state_dir;
pub mod status_text;
pub mod stuck_text;
pub mod timeline_svg;
pub mod timeline_text;
