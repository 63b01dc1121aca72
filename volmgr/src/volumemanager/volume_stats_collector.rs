//! Volume stats and health, as the kubelet exposes them: every
//! `--volume-stats-period` a task asks each mounted volume's usage (CSI:
//! NodeGetVolumeStats, when the driver has `GET_VOLUME_STATS`; emptyDir and
//! hostPath: statfs, the kubelet's `MetricsStatFS`) and caches the answers.
//! `/metrics` and status read the cache only: a scrape never calls a driver.
//!
//! Calls run at most [`CONCURRENCY`] at once, each bounded by the CSI
//! timeout or [`MAX_CALL_TIMEOUT`], whichever is smaller; they take no
//! lock an operation waits for. A volume whose call fails keeps its last
//! values, marked stale; once a driver did not answer (timeout, gone), its
//! other volumes are not asked again in the same collection.
//!
//! Metrics (`pkg/kubelet/metrics/collectors/volume_stats.go`): the
//! `kubelet_volume_stats_*` gauges, labelled `namespace` and
//! `persistentvolumeclaim`, only for volumes that come from a claim, once
//! per claim.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::cache::actual_state_of_world::VolumeMountState;
use crate::cache::out_of_band::rfc3339;
use crate::cache::world::World;
use crate::plugins::csi::{CsiPlugin, PLUGIN_NAME as CSI_PLUGIN};
use crate::plugins::volume_metrics::{statfs, StatsError, VolumeStats};
use crate::status::VolumeStatsStatus;
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::shutdown;
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};

/// The longest a single stats call may take.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Stats calls in flight at once.
pub const CONCURRENCY: usize = 4;

/// One mounted (volume, pod) to ask about.
#[derive(Debug, Clone)]
pub(crate) struct StatsTarget {
    /// The volume.
    pub volume: UniqueVolumeName,
    /// The pod.
    pub pod: PodUid,
    /// The pod's namespace.
    pub namespace: Arc<str>,
    /// The plugin that mounted it.
    pub plugin: Arc<str>,
    /// The pod's spec of the volume (the desired one: it has the claim).
    pub spec: Arc<VolumeSpec>,
    /// Where it is mounted for the pod.
    pub path: PathBuf,
}

impl StatsTarget {
    /// The claim the volume comes from, if any.
    fn claim(&self) -> Option<&str> {
        match &self.spec.source {
            VolumeSource::Csi(c) => c.claim_name.as_deref(),
            _ => None,
        }
    }

    /// Who answers for the volume, when one unresponsive server can fail
    /// many volumes (the CSI driver).
    fn server(&self) -> Option<&str> {
        match &self.spec.source {
            VolumeSource::Csi(c) => Some(c.driver.as_str()),
            _ => None,
        }
    }

    fn key(&self) -> Key {
        (self.volume.clone(), self.pod.clone())
    }
}

type Key = (UniqueVolumeName, PodUid);

/// Reads one volume's stats (the seam the collector is tested through).
#[async_trait::async_trait]
pub(crate) trait StatsProvider: Send + Sync + 'static {
    /// The usage of `target`, within `timeout`; `None` when its plugin
    /// reports none.
    async fn stats(
        &self,
        target: &StatsTarget,
        timeout: Duration,
    ) -> Result<Option<VolumeStats>, StatsError>;
}

/// The real provider: CSI through the plugin, statfs for emptyDir and
/// hostPath, nothing for the rest.
#[derive(Default)]
pub(crate) struct PluginStats {
    csi: OnceLock<Arc<CsiPlugin>>,
    /// Paths whose statfs has not returned (a hung file system).
    statfs_running: Arc<Mutex<HashSet<PathBuf>>>,
}

impl PluginStats {
    /// Uses `plugin` for CSI volumes (the first one set stays).
    pub fn set_csi(&self, plugin: Arc<CsiPlugin>) {
        let _ = self.csi.set(plugin);
    }

    /// statfs on a blocking thread, never two at once on one path.
    async fn statfs(&self, path: PathBuf) -> Result<VolumeStats, StatsError> {
        if !self.statfs_running.locked().insert(path.clone()) {
            return Err(StatsError::Busy(path));
        }
        let running = Arc::clone(&self.statfs_running);
        tokio::task::spawn_blocking(move || {
            let r = statfs(&path);
            running.locked().remove(&path);
            r
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?
    }
}

#[async_trait::async_trait]
impl StatsProvider for PluginStats {
    async fn stats(
        &self,
        t: &StatsTarget,
        timeout: Duration,
    ) -> Result<Option<VolumeStats>, StatsError> {
        match &t.spec.source {
            VolumeSource::Csi(_) if *t.plugin == *CSI_PLUGIN => match self.csi.get() {
                Some(p) => p.volume_stats(&t.pod, &t.spec, timeout).await,
                None => Ok(None),
            },
            VolumeSource::EmptyDir { .. } | VolumeSource::HostPath { .. } => {
                self.statfs(t.path.clone()).await.map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// The last stats of one (volume, pod).
#[derive(Debug, Clone)]
struct Cached {
    namespace: Arc<str>,
    claim: Option<String>,
    stats: Option<VolumeStats>,
    collected_at: Option<SystemTime>,
    error: Option<String>,
}

/// What one collection did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassReport {
    /// Volumes asked (or skipped).
    pub volumes: usize,
    /// Of these, answered.
    pub ok: usize,
    /// Of these, failed or skipped: their values are stale.
    pub failed: usize,
}

/// The collector: the cache, and how a collection asks.
pub(crate) struct StatsCollector {
    provider: Arc<dyn StatsProvider>,
    /// Per-call timeout, in milliseconds.
    timeout_ms: AtomicU64,
    concurrency: usize,
    cache: Mutex<HashMap<Key, Cached>>,
    /// Where each call's duration goes
    /// (`kubelet_volume_metric_collection_duration_seconds`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl StatsCollector {
    /// A collector asking `provider`, [`CONCURRENCY`] calls at once.
    pub fn new(provider: Arc<dyn StatsProvider>) -> Self {
        Self {
            provider,
            timeout_ms: AtomicU64::new(millis(MAX_CALL_TIMEOUT)),
            concurrency: CONCURRENCY,
            cache: Mutex::default(),
            metrics: None,
        }
    }

    /// Records each call's duration in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Bounds each call by `timeout` (at most [`MAX_CALL_TIMEOUT`]).
    pub fn set_timeout(&self, timeout: Duration) {
        let t = millis(timeout.min(MAX_CALL_TIMEOUT)).max(1);
        self.timeout_ms.store(t, Ordering::Relaxed);
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Asks every target, updates the cache, and forgets volumes no longer
    /// among the targets.
    pub async fn collect(&self, targets: Vec<StatsTarget>) -> PassReport {
        let timeout = self.timeout();
        let keys: HashSet<Key> = targets.iter().map(StatsTarget::key).collect();
        let permits = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let unresponsive = Arc::new(Mutex::new(HashSet::new()));
        let mut report = PassReport::default();
        let mut calls = JoinSet::new();
        for t in targets {
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                break;
            };
            while let Some(done) = calls.try_join_next() {
                self.record_joined(done, &mut report);
            }
            let provider = Arc::clone(&self.provider);
            let unresponsive = Arc::clone(&unresponsive);
            let metrics = self.metrics.clone();
            calls.spawn(async move {
                let started = std::time::Instant::now();
                let r = ask(provider.as_ref(), &t, timeout, &unresponsive).await;
                if let (Some(m), false) = (metrics, matches!(r, Ok(None))) {
                    m.kubelet
                        .record_collection(metric_source(&t), started.elapsed());
                }
                drop(permit);
                (t, r)
            });
        }
        while let Some(done) = calls.join_next().await {
            self.record_joined(done, &mut report);
        }
        self.cache.locked().retain(|k, _| keys.contains(k));
        report
    }

    fn record_joined(
        &self,
        done: Result<
            (StatsTarget, Result<Option<VolumeStats>, StatsError>),
            tokio::task::JoinError,
        >,
        report: &mut PassReport,
    ) {
        match done {
            Ok((t, r)) => {
                report.volumes += 1;
                match &r {
                    Ok(_) => report.ok += 1,
                    Err(_) => report.failed += 1,
                }
                self.record(&t, r);
            }
            Err(e) => tracing::warn!(error = %e, "volume stats call failed"),
        }
    }

    /// Records one answer: new values, no values (forgotten), or an error
    /// (the last values stay, stale).
    fn record(&self, t: &StatsTarget, r: Result<Option<VolumeStats>, StatsError>) {
        let mut cache = self.cache.locked();
        let stats = match r {
            Ok(None) => {
                cache.remove(&t.key());
                return;
            }
            Ok(Some(s)) => s,
            Err(e) => {
                let entry = cache.entry(t.key()).or_insert_with(|| Cached {
                    namespace: Arc::clone(&t.namespace),
                    claim: t.claim().map(str::to_string),
                    stats: None,
                    collected_at: None,
                    error: None,
                });
                if entry.error.is_none() {
                    tracing::warn!(volume = %t.volume, pod = %t.pod, error = %e, "volume stats: marked stale");
                }
                entry.error = Some(e.to_string());
                return;
            }
        };
        cache.insert(
            t.key(),
            Cached {
                namespace: Arc::clone(&t.namespace),
                claim: t.claim().map(str::to_string),
                stats: Some(stats),
                collected_at: Some(SystemTime::now()),
                error: None,
            },
        );
    }

    /// The status of one (volume, pod), if anything was collected.
    pub fn status_of(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<VolumeStatsStatus> {
        let c = self
            .cache
            .locked()
            .get(&(volume.clone(), pod.clone()))?
            .clone();
        let s = c.stats.unwrap_or_default();
        let condition = s.condition.unwrap_or_default();
        Some(VolumeStatsStatus {
            capacity_bytes: s.capacity_bytes,
            available_bytes: s.available_bytes,
            used_bytes: s.used_bytes,
            inodes: s.inodes,
            inodes_free: s.inodes_free,
            inodes_used: s.inodes_used,
            abnormal: condition.abnormal,
            message: Some(condition.message).filter(|m| !m.is_empty()),
            collected_at: c.collected_at.map(rfc3339),
            stale: c.error.is_some(),
            error: c.error,
        })
    }

    /// The `kubelet_volume_stats_*` text of the cached values of volumes
    /// from a claim for which `live` holds (still desired and mounted).
    /// `live` runs after the cache's lock is released.
    pub fn prometheus_text(&self, live: impl Fn(&UniqueVolumeName, &PodUid) -> bool) -> String {
        let snapshot: Vec<(Key, Arc<str>, String, VolumeStats)> = self
            .cache
            .locked()
            .iter()
            .filter_map(|(k, c)| {
                let claim = c.claim.clone()?;
                let stats = c.stats.clone()?;
                Some((k.clone(), Arc::clone(&c.namespace), claim, stats))
            })
            .collect();
        let mut rows: Vec<Row> = snapshot
            .into_iter()
            .filter(|((v, p), ..)| live(v, p))
            .map(|(_, ns, claim, stats)| (ns, claim, stats))
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        rows.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        render(&rows)
    }
}

/// A claim's namespace and name, and its volume's stats.
type Row = (Arc<str>, String, VolumeStats);

/// The kubelet's families: name, HELP, and the value of a row.
type Family = (&'static str, &'static str, fn(&VolumeStats) -> u64);

const FAMILIES: [Family; 6] = [
    (
        "kubelet_volume_stats_capacity_bytes",
        "Capacity in bytes of the volume",
        |s| s.capacity_bytes,
    ),
    (
        "kubelet_volume_stats_available_bytes",
        "Number of available bytes in the volume",
        |s| s.available_bytes,
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "Number of used bytes in the volume",
        |s| s.used_bytes,
    ),
    (
        "kubelet_volume_stats_inodes",
        "Maximum number of inodes in the volume",
        |s| s.inodes,
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "Number of free inodes in the volume",
        |s| s.inodes_free,
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "Number of used inodes in the volume",
        |s| s.inodes_used,
    ),
];

const HEALTH: &str = "kubelet_volume_stats_health_status_abnormal";
const HEALTH_HELP: &str = "Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy";

/// The gauges of `rows` (sorted, one per claim); nothing without rows. The
/// health gauge only for volumes whose driver reports a condition, as the
/// kubelet does.
fn render(rows: &[Row]) -> String {
    let mut w = Exposition::new();
    let sample = |w: &mut Exposition, name: &str, (ns, claim, _): &Row, v: u64| {
        w.sample(
            name,
            &[("namespace", ns), ("persistentvolumeclaim", claim)],
            v,
        );
    };
    if rows.is_empty() {
        return w.finish();
    }
    for (name, help, value) in FAMILIES {
        w.family(name, help, MetricType::Gauge);
        for row in rows {
            sample(&mut w, name, row, value(&row.2));
        }
    }
    for row in rows {
        let Some(c) = &row.2.condition else { continue };
        w.family(HEALTH, HEALTH_HELP, MetricType::Gauge);
        sample(&mut w, HEALTH, row, u64::from(c.abnormal));
    }
    w.finish()
}

/// One call: skipped when the target's server did not answer earlier in
/// this collection, bounded by `timeout` (plus a moment, so a CSI call's
/// own deadline ends it first and is counted as such).
async fn ask(
    provider: &dyn StatsProvider,
    t: &StatsTarget,
    timeout: Duration,
    unresponsive: &Mutex<HashSet<String>>,
) -> Result<Option<VolumeStats>, StatsError> {
    if let Some(s) = t.server().filter(|s| unresponsive.locked().contains(*s)) {
        return Err(StatsError::Skipped(s.to_string()));
    }
    let slack = (timeout / 10).min(Duration::from_millis(500));
    let r = match tokio::time::timeout(timeout + slack, provider.stats(t, timeout)).await {
        Ok(r) => r,
        Err(_) => Err(StatsError::Timeout(timeout)),
    };
    if let (Err(e), Some(s)) = (&r, t.server()) {
        if e.is_unresponsive() {
            unresponsive.locked().insert(s.to_string());
        }
    }
    r
}

/// The manager's collector: asking `provider`, each call's duration
/// recorded in `metrics`.
pub(crate) fn plugin_collector(
    provider: &Arc<PluginStats>,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Arc<StatsCollector> {
    let provider = Arc::clone(provider) as Arc<dyn StatsProvider>;
    Arc::new(StatsCollector::new(provider).with_metrics(Arc::clone(metrics)))
}

/// The kubelet's `metric_source` of a volume's stats call: the CSI
/// driver's name (`csi_metrics.go`), `statfs` for the others
/// (`metrics_statfs.go`).
fn metric_source(t: &StatsTarget) -> &str {
    match &t.spec.source {
        VolumeSource::Csi(c) => &c.driver,
        _ => "statfs",
    }
}

/// Every desired (volume, pod) that is mounted, with the desired spec.
pub(crate) fn targets(world: &World) -> Vec<StatsTarget> {
    let dsw = world.dsw();
    let asw = world.asw();
    let mut out = Vec::new();
    for (name, v) in dsw.volumes() {
        for (uid, want) in v.pods.iter() {
            let Some(m) = asw.pod_mount(name, uid) else {
                continue;
            };
            let Some(pod) = dsw.pod(uid) else { continue };
            if m.state != VolumeMountState::Mounted {
                continue;
            }
            out.push(StatsTarget {
                volume: name.clone(),
                pod: uid.clone(),
                namespace: Arc::clone(&pod.namespace),
                plugin: Arc::clone(&v.plugin_name),
                spec: Arc::clone(&want.spec),
                path: m.path.clone(),
            });
        }
    }
    out
}

/// Whether `pod` still wants `volume` and has it mounted.
pub(crate) fn is_live(world: &World, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
    world.dsw().pod_exists_in_volume(volume, pod) && world.asw().pod_mount(volume, pod).is_some()
}

/// The collection task: a collection every `period` (the first at once),
/// never two at once, until shutdown.
pub(crate) async fn run(
    collector: Arc<StatsCollector>,
    world: Arc<World>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown::requested(&mut stop) => return,
        }
        let targets = targets(&world);
        let started = Instant::now();
        tokio::select! {
            r = collector.collect(targets) => tracing::debug!(
                volumes = r.volumes, ok = r.ok, failed = r.failed,
                ms = started.elapsed().as_secs_f64() * 1e3, "volume stats collected"
            ),
            () = shutdown::requested(&mut stop) => return,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::volume_metrics::VolumeCondition;
    use crate::volume::{CsiVolumeSource, StorageMedium};
    use std::sync::atomic::AtomicUsize;

    /// What the fake answers for a volume.
    #[derive(Clone)]
    enum Answer {
        Stats(VolumeStats),
        Fail,
        Hang,
        Unsupported,
    }

    #[derive(Default)]
    struct Fake {
        answers: Mutex<HashMap<String, Answer>>,
        calls: Mutex<Vec<String>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    impl Fake {
        fn set(&self, volume: &str, a: Answer) {
            self.answers.locked().insert(volume.to_string(), a);
        }
        fn calls_of(&self, volume: &str) -> usize {
            self.calls.locked().iter().filter(|c| *c == volume).count()
        }
    }

    #[async_trait::async_trait]
    impl StatsProvider for Fake {
        async fn stats(
            &self,
            t: &StatsTarget,
            _timeout: Duration,
        ) -> Result<Option<VolumeStats>, StatsError> {
            let name = t.volume.to_string();
            self.calls.locked().push(name.clone());
            let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(n, Ordering::SeqCst);
            // Counted out even when the call is dropped (a timeout).
            let _out = InFlight(&self.in_flight);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let answer = self.answers.locked().get(&name).cloned();
            match answer {
                Some(Answer::Stats(s)) => Ok(Some(s)),
                Some(Answer::Fail) => Err(StatsError::Invalid("injected".into())),
                Some(Answer::Hang) => std::future::pending().await,
                Some(Answer::Unsupported) | None => Ok(None),
            }
        }
    }

    struct InFlight<'a>(&'a AtomicUsize);

    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn csi_target(volume: &str, pod: &str, driver: &str, claim: Option<&str>) -> StatsTarget {
        let src = CsiVolumeSource {
            ephemeral: claim.is_none(),
            claim_name: claim.map(str::to_string),
            ..CsiVolumeSource::new(driver, volume)
        };
        target(volume, pod, VolumeSource::Csi(Box::new(src)))
    }

    fn target(volume: &str, pod: &str, source: VolumeSource) -> StatsTarget {
        StatsTarget {
            volume: UniqueVolumeName::new(volume.to_string()),
            pod: PodUid::new(pod).unwrap(),
            namespace: "ns".into(),
            plugin: CSI_PLUGIN.into(),
            spec: Arc::new(VolumeSpec {
                name: "v".into(),
                source,
            }),
            path: PathBuf::from("/nowhere"),
        }
    }

    fn stats(capacity: u64, condition: Option<bool>) -> VolumeStats {
        VolumeStats {
            capacity_bytes: capacity,
            available_bytes: capacity / 2,
            used_bytes: capacity / 4,
            inodes: 100,
            inodes_free: 90,
            inodes_used: 10,
            condition: condition.map(|abnormal| VolumeCondition {
                abnormal,
                message: if abnormal {
                    "broken".into()
                } else {
                    String::new()
                },
            }),
        }
    }

    fn collector(fake: &Arc<Fake>) -> StatsCollector {
        let c = StatsCollector::new(Arc::clone(fake) as Arc<dyn StatsProvider>);
        c.set_timeout(Duration::from_millis(100));
        c
    }

    fn key(v: &str, p: &str) -> (UniqueVolumeName, PodUid) {
        (
            UniqueVolumeName::new(v.to_string()),
            PodUid::new(p).unwrap(),
        )
    }

    #[tokio::test]
    async fn renders_the_kubelet_gauges_for_claims_only_once_each() {
        let fake = Arc::new(Fake::default());
        fake.set("a", Answer::Stats(stats(1000, Some(false))));
        fake.set("b", Answer::Stats(stats(2000, None)));
        fake.set("inline", Answer::Stats(stats(3000, Some(true))));
        let c = collector(&fake);
        let targets = vec![
            csi_target("a", "p1", "d", Some("claim-a")),
            // The same claim in a second pod: one series.
            csi_target("a", "p2", "d", Some("claim-a")),
            csi_target("b", "p1", "d", Some("claim-b")),
            csi_target("inline", "p1", "d", None),
        ];
        let r = c.collect(targets).await;
        assert_eq!((r.volumes, r.ok, r.failed), (4, 4, 0));
        let text = c.prometheus_text(|_, _| true);
        let expect = [
            "# HELP kubelet_volume_stats_capacity_bytes Capacity in bytes of the volume\n# TYPE kubelet_volume_stats_capacity_bytes gauge\n",
            "kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 1000\n",
            "kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-b\"} 2000\n",
            "kubelet_volume_stats_available_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 500\n",
            "kubelet_volume_stats_used_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-b\"} 500\n",
            "kubelet_volume_stats_inodes{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 100\n",
            "kubelet_volume_stats_inodes_free{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 90\n",
            "kubelet_volume_stats_inodes_used{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 10\n",
            "# TYPE kubelet_volume_stats_health_status_abnormal gauge\nkubelet_volume_stats_health_status_abnormal{namespace=\"ns\",persistentvolumeclaim=\"claim-a\"} 0\n",
        ];
        for e in expect {
            assert!(text.contains(e), "{e} in\n{text}");
        }
        assert_eq!(
            text.matches("claim-a").count(),
            7,
            "once per family\n{text}"
        );
        // No condition reported: no health series (the kubelet's rule);
        // no claim: no series at all.
        assert!(!text
            .contains("health_status_abnormal{namespace=\"ns\",persistentvolumeclaim=\"claim-b\""));
        assert!(!text.contains("3000"));
        // Status has every volume, claim or not.
        let (v, p) = key("inline", "p1");
        let st = c.status_of(&v, &p).unwrap();
        assert_eq!((st.capacity_bytes, st.abnormal), (3000, true));
        assert_eq!(st.message.as_deref(), Some("broken"));
        assert!(st.collected_at.is_some() && !st.stale && st.error.is_none());
        // Volumes no longer live are not rendered; none at all: no text.
        let text = c.prometheus_text(|v, _| v.to_string() == "b");
        assert!(!text.contains("claim-a") && text.contains("claim-b"));
        assert_eq!(c.prometheus_text(|_, _| false), "");
    }

    #[tokio::test]
    async fn failures_keep_the_last_values_stale_and_gone_volumes_are_forgotten() {
        let fake = Arc::new(Fake::default());
        fake.set("a", Answer::Stats(stats(1000, Some(false))));
        fake.set("b", Answer::Stats(stats(2000, None)));
        let c = collector(&fake);
        let a = csi_target("a", "p1", "d1", Some("claim-a"));
        let b = csi_target("b", "p1", "d2", Some("claim-b"));
        c.collect(vec![a.clone(), b.clone()]).await;
        fake.set("a", Answer::Fail);
        fake.set("b", Answer::Stats(stats(4000, Some(true))));
        let r = c.collect(vec![a.clone(), b.clone()]).await;
        assert_eq!((r.ok, r.failed), (1, 1));
        let (va, p) = key("a", "p1");
        let st = c.status_of(&va, &p).unwrap();
        assert_eq!(st.capacity_bytes, 1000, "the last values stay");
        assert!(st.stale && st.error.as_deref() == Some("injected"));
        let text = c.prometheus_text(|_, _| true);
        assert!(
            text.contains("persistentvolumeclaim=\"claim-a\"} 1000"),
            "{text}"
        );
        assert!(text.contains("kubelet_volume_stats_health_status_abnormal{namespace=\"ns\",persistentvolumeclaim=\"claim-b\"} 1"), "{text}");
        // A volume that fails before any success shows only the error.
        let fresh = csi_target("c", "p1", "d1", Some("claim-c"));
        fake.set("c", Answer::Fail);
        c.collect(vec![a.clone(), b.clone(), fresh]).await;
        let (vc, _) = key("c", "p1");
        let st = c.status_of(&vc, &p).unwrap();
        assert!(st.stale && st.collected_at.is_none() && st.capacity_bytes == 0);
        assert!(!c.prometheus_text(|_, _| true).contains("claim-c"));
        // Unsupported or gone from the targets: forgotten.
        fake.set("a", Answer::Unsupported);
        c.collect(vec![a]).await;
        assert!(c.status_of(&va, &p).is_none());
        let (vb, _) = key("b", "p1");
        assert!(c.status_of(&vb, &p).is_none());
        assert_eq!(c.prometheus_text(|_, _| true), "");
    }

    #[tokio::test]
    async fn a_hung_driver_only_makes_its_own_volumes_stale() {
        let fake = Arc::new(Fake::default());
        let mut targets = Vec::new();
        for i in 0..6 {
            let (slow, fast) = (format!("slow-{i}"), format!("fast-{i}"));
            fake.set(&slow, Answer::Hang);
            fake.set(&fast, Answer::Stats(stats(1000 + i, None)));
            targets.push(csi_target(&slow, "p", "slow.csi", Some(slow.as_str())));
            targets.push(csi_target(&fast, "p", "fast.csi", Some(fast.as_str())));
        }
        targets.push(target(
            "dir",
            "p",
            VolumeSource::EmptyDir {
                medium: StorageMedium::Default,
                size_limit: None,
            },
        ));
        fake.set("dir", Answer::Stats(stats(7, None)));
        let c = collector(&fake);
        let started = Instant::now();
        let r = c.collect(targets).await;
        assert_eq!((r.volumes, r.ok, r.failed), (13, 7, 6));
        // One timeout, the driver's other volumes skipped (not one timeout
        // each): the collection takes about one timeout, not six.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let asked: usize = (0..6).map(|i| fake.calls_of(&format!("slow-{i}"))).sum();
        assert!(asked <= CONCURRENCY, "{asked} calls to the hung driver");
        assert!(fake.max_in_flight.load(Ordering::SeqCst) <= CONCURRENCY);
        let p = PodUid::new("p").unwrap();
        let slow = c
            .status_of(&UniqueVolumeName::new("slow-5".to_string()), &p)
            .unwrap();
        assert!(slow.stale, "{slow:?}");
        for i in 0..6 {
            let v = UniqueVolumeName::new(format!("fast-{i}"));
            assert!(!c.status_of(&v, &p).unwrap().stale);
        }
    }

    #[test]
    fn the_timeout_is_the_csi_one_or_ten_seconds() {
        let c = StatsCollector::new(Arc::new(Fake::default()));
        assert_eq!(c.timeout(), MAX_CALL_TIMEOUT);
        c.set_timeout(Duration::from_secs(120));
        assert_eq!(c.timeout(), MAX_CALL_TIMEOUT);
        c.set_timeout(Duration::from_secs(3));
        assert_eq!(c.timeout(), Duration::from_secs(3));
    }
}
