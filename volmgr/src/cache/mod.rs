//! The two worlds: what should be mounted ([`desired_state_of_world`]) and what
//! is ([`actual_state_of_world`]).

pub mod actual_state_of_world;
pub mod desired_state_of_world;
pub mod pod_map;
