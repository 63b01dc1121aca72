//! The two worlds: what should be mounted ([`desired_state_of_world`]) and what
//! is ([`actual_state_of_world`]), the [`world::World`] that holds both and
//! wakes the reconciler, and the [`out_of_band`] record of changes made behind
//! the manager's back; [`operations`] lets observers see the operations in
//! flight without being able to start one.

pub mod actual_state_of_world;
pub mod desired_state_of_world;
pub mod operations;
pub mod out_of_band;
pub mod pod_map;
pub mod selinux;
pub mod world;
