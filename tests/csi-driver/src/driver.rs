//! What every call goes through: the per-volume "operation pending" lock,
//! fault injection, the work itself (on a blocking thread: it makes
//! syscalls and runs mkfs/resize2fs) and the call journal.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use tonic::{Response, Status};

use crate::calls::Journal;
use crate::faults::{self, ExitWhen, Faults};

/// The driver's configuration and shared state.
#[derive(Debug)]
pub struct Driver {
    /// CSI driver name (GetPluginInfo, registration).
    pub name: String,
    /// NodeGetInfo's node_id.
    pub node_id: String,
    /// NodeGetInfo's max_volumes_per_node (0: no limit).
    pub max_volumes_per_node: i64,
    /// Whether the SINGLE_NODE_MULTI_WRITER node capability is advertised
    /// (and its two access modes accepted).
    pub single_node_multi_writer: bool,
    /// Whether the VOLUME_MOUNT_GROUP node capability is advertised (and
    /// a capability's `volume_mount_group` applied at stage; refused
    /// otherwise).
    pub volume_mount_group: bool,
    /// NodeGetInfo's accessible topology segments (none: no topology).
    pub topology: std::collections::HashMap<String, String>,
    /// Publish from the staging path without checking that the volume is
    /// staged, as many drivers do (EBS binds the staging path; ceph-csi's
    /// rbd binds the device file it put there at stage): unstaged, the pod
    /// gets what the node's disk has at that path.
    pub publish_without_stage_check: bool,
    /// Serve CSI inline ephemeral volumes: a NodePublishVolume without a
    /// staging path (the kubelet gives none for an inline volume) mounts a
    /// tmpfs of the volume attribute `size` (default 16Mi) at the target;
    /// refused with FAILED_PRECONDITION otherwise.
    pub ephemeral: bool,
    /// The CSI socket path.
    pub endpoint: PathBuf,
    /// State directory (absolute): images/, faults.json, calls.jsonl.
    pub state_dir: PathBuf,
    faults: Faults,
    journal: Journal,
    busy: Mutex<HashSet<String>>,
}

/// Marks a volume as having an operation in flight; cleared on drop (after
/// the work finished, even when the caller gave up earlier).
struct Busy {
    driver: Arc<Driver>,
    id: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut s) = self.driver.busy.lock() {
            s.remove(&self.id);
        }
    }
}

/// One call's journal entry; a call dropped before it finished (the caller
/// cancelled or its deadline passed) is recorded as CANCELLED.
struct CallRecord {
    driver: Arc<Driver>,
    method: &'static str,
    volume_id: Option<String>,
    start: SystemTime,
    t0: Instant,
    done: bool,
}

impl CallRecord {
    fn finish(&mut self, code: &str, message: &str) {
        self.done = true;
        let vid = self.volume_id.as_deref();
        self.driver
            .journal
            .record(self.method, vid, self.start, self.t0.elapsed(), code);
        if code == "OK" {
            tracing::info!(method = self.method, volume_id = vid, "ok");
        } else {
            tracing::warn!(method = self.method, volume_id = vid, code, "{message}");
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        if !self.done {
            self.finish("CANCELLED", "the caller went away before the answer");
        }
    }
}

/// Ends the process as an injected crash, after journaling the call as EXIT.
fn crash(
    driver: &Driver,
    method: &str,
    volume_id: Option<&str>,
    start: SystemTime,
    t0: Instant,
    when: &str,
) -> ! {
    tracing::warn!(method, volume_id, "injected exit {when}");
    driver
        .journal
        .record(method, volume_id, start, t0.elapsed(), "EXIT");
    std::process::exit(faults::EXIT_STATUS);
}

impl Driver {
    /// A driver keeping its state in `state_dir` (absolute, existing).
    pub fn new(name: String, node_id: String, endpoint: PathBuf, state_dir: PathBuf) -> Self {
        Self {
            faults: Faults::new(&state_dir),
            journal: Journal::new(&state_dir),
            busy: Mutex::new(HashSet::new()),
            name,
            node_id,
            max_volumes_per_node: 0,
            single_node_multi_writer: false,
            volume_mount_group: false,
            topology: std::collections::HashMap::new(),
            publish_without_stage_check: false,
            ephemeral: false,
            endpoint,
            state_dir,
        }
    }

    fn mark_busy(self: &Arc<Self>, volume_id: &str) -> Result<Busy, Status> {
        let mut set = self
            .busy
            .lock()
            .map_err(|_| Status::internal("volume lock poisoned"))?;
        if !set.insert(volume_id.to_string()) {
            return Err(Status::aborted(format!(
                "an operation for volume {volume_id} is already in progress"
            )));
        }
        Ok(Busy {
            driver: Arc::clone(self),
            id: volume_id.to_string(),
        })
    }

    /// Runs one RPC: `work` runs on a blocking thread. With `serialize`,
    /// calls for one volume are serialized: a second call while one is in
    /// flight gets ABORTED, as the spec asks ("operation pending for volume").
    pub async fn call<T, F>(
        self: &Arc<Self>,
        method: &'static str,
        volume_id: Option<String>,
        serialize: bool,
        work: F,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let mut record = CallRecord {
            driver: Arc::clone(self),
            method,
            volume_id,
            start: SystemTime::now(),
            t0: Instant::now(),
            done: false,
        };
        let result = self.call_inner(&record, serialize, work).await;
        match &result {
            Ok(_) => record.finish("OK", ""),
            Err(s) => record.finish(faults::code_name(s.code()), s.message()),
        }
        result.map(Response::new)
    }

    async fn call_inner<T, F>(
        self: &Arc<Self>,
        record: &CallRecord,
        serialize: bool,
        work: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let method = record.method;
        let volume_id = record.volume_id.as_deref();
        let (start, t0) = (record.start, record.t0);
        let busy = match volume_id {
            Some(id) if serialize => Some(self.mark_busy(id)?),
            _ => None,
        };
        let plan = self.faults.plan(method, volume_id)?;
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        if let Some(bytes) = &plan.hang_until_changed_from {
            tracing::warn!(
                method,
                volume_id,
                "injected hang: waiting for faults.json to change"
            );
            self.faults.wait_changed(bytes).await;
        }
        if plan.exit == Some(ExitWhen::BeforeWork) {
            crash(self, method, volume_id, start, t0, "before the work");
        }
        if let Some(status) = plan.error {
            return Err(status);
        }
        let me = Arc::clone(self);
        let exit_after = plan.exit == Some(ExitWhen::AfterWork);
        let vid = record.volume_id.clone();
        // The work, the crash after it and the release of the volume happen
        // on the blocking thread even if the caller gives up meanwhile.
        tokio::task::spawn_blocking(move || {
            let _busy = busy;
            let result = work(&me);
            if exit_after {
                crash(&me, method, vid.as_deref(), start, t0, "after the work");
            }
            result
        })
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
    }
}

impl Driver {
    /// Records the kubelet's NotifyRegistrationStatus in
    /// Appends what a NodeStage or NodePublish call was given to
    /// `state_dir/contexts.jsonl`: `{"method", "volume_id",
    /// "volume_context", "publish_context", "access_mode", "mount_flags",
    /// "volume_mount_group"}`
    /// (what the CO passes from the CSIDriver object, the VolumeAttachment
    /// and the PV).
    pub fn record_contexts(
        &self,
        method: &str,
        volume_id: &str,
        volume_context: &std::collections::HashMap<String, String>,
        publish_context: &std::collections::HashMap<String, String>,
        capability: Option<&crate::proto::csi::VolumeCapability>,
    ) {
        use crate::proto::csi::volume_capability::AccessType;
        use std::io::Write;
        let access_mode = capability
            .and_then(|c| c.access_mode.as_ref())
            .map(|m| m.mode().as_str_name());
        let (mount_flags, mount_group) = match capability.and_then(|c| c.access_type.as_ref()) {
            Some(AccessType::Mount(m)) => (m.mount_flags.clone(), m.volume_mount_group.clone()),
            _ => (Vec::new(), String::new()),
        };
        let line = serde_json::json!({
            "method": method,
            "volume_id": volume_id,
            "volume_context": volume_context,
            "publish_context": publish_context,
            "access_mode": access_mode,
            "mount_flags": mount_flags,
            "volume_mount_group": mount_group,
        });
        let path = self.state_dir.join("contexts.jsonl");
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = res {
            tracing::warn!(path = %path.display(), "cannot append to contexts.jsonl: {e}");
        }
    }

    /// `state_dir/registration.json` and logs it.
    pub fn record_registration(&self, registered: bool, error: &str) -> Result<(), Status> {
        if registered {
            tracing::info!(driver = %self.name, "registered with the kubelet's plugin watcher");
        } else {
            tracing::error!(driver = %self.name, "registration failed: {error}");
        }
        let unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let body = serde_json::json!({
            "plugin_registered": registered,
            "error": error,
            "unix_ns": unix_ns,
        });
        let path = self.state_dir.join("registration.json");
        let tmp = self.state_dir.join("registration.json.tmp");
        std::fs::write(&tmp, format!("{body}\n"))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| Status::internal(format!("writing {}: {e}", path.display())))
    }
}
