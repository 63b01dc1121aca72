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
    /// The CSI socket path.
    pub endpoint: PathBuf,
    /// State directory (absolute): images/, faults.json, calls.jsonl.
    pub state_dir: PathBuf,
    faults: Faults,
    journal: Journal,
    busy: Mutex<HashSet<String>>,
}

/// Marks a volume as having an operation in flight; cleared on drop.
struct Busy<'a> {
    set: &'a Mutex<HashSet<String>>,
    id: String,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.remove(&self.id);
        }
    }
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
            endpoint,
            state_dir,
        }
    }

    fn mark_busy(&self, volume_id: &str) -> Result<Busy<'_>, Status> {
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
            set: &self.busy,
            id: volume_id.to_string(),
        })
    }

    /// Runs one RPC: `work` runs on a blocking thread. `volume_id` (when the
    /// call is about a volume) serializes calls per volume: a second call
    /// while one is in flight gets ABORTED, as the spec asks.
    pub async fn call<T, F>(
        self: &Arc<Self>,
        method: &'static str,
        volume_id: Option<String>,
        work: F,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let start = SystemTime::now();
        let t0 = Instant::now();
        let result = self.call_inner(method, volume_id.as_deref(), work).await;
        let code = match &result {
            Ok(_) => "OK",
            Err(s) => faults::code_name(s.code()),
        };
        self.journal
            .record(method, volume_id.as_deref(), start, t0.elapsed(), code);
        match &result {
            Ok(_) => tracing::info!(method, volume_id = volume_id.as_deref(), "ok"),
            Err(s) => tracing::warn!(
                method,
                volume_id = volume_id.as_deref(),
                code,
                "{}",
                s.message()
            ),
        }
        result.map(Response::new)
    }

    async fn call_inner<T, F>(
        self: &Arc<Self>,
        method: &'static str,
        volume_id: Option<&str>,
        work: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let start = SystemTime::now();
        let t0 = Instant::now();
        let _busy = match volume_id {
            Some(id) => Some(self.mark_busy(id)?),
            None => None,
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
        let crash = |when: &str| {
            tracing::warn!(method, volume_id, "injected exit {when}");
            self.journal
                .record(method, volume_id, start, t0.elapsed(), "EXIT");
            std::process::exit(faults::EXIT_STATUS);
        };
        if plan.exit == Some(ExitWhen::BeforeWork) {
            crash("before the work");
        }
        if let Some(status) = plan.error {
            return Err(status);
        }
        let me = Arc::clone(self);
        let result = tokio::task::spawn_blocking(move || work(&me))
            .await
            .map_err(|e| Status::internal(format!("worker failed: {e}")))?;
        if plan.exit == Some(ExitWhen::AfterWork) {
            crash("after the work");
        }
        result
    }
}

impl Driver {
    /// Records the kubelet's NotifyRegistrationStatus in
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
