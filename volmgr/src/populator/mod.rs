//! Sources of pods and the populator that turns them into desired-state
//! changes (the kubelet's `desired_state_of_world_populator`; the conversion
//! itself is [`crate::volumemanager::VolumeManager::upsert_pod`]).

pub mod manifests;
pub mod objects;
pub mod pod;
