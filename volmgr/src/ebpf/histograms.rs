//! Latency histograms of traced syscalls (user side, `hdrhistogram`) and
//! their Prometheus text, including the in-kernel histograms.
//!
//! Any process can make these calls, with any file system type string and
//! on any path, so the histograms are keyed by bounded labels only: the
//! type by [`super::fstypes::label`] (a fixed set), at most
//! [`MAX_DRIVERS`] driver labels (the rest `other`) and at most
//! [`MAX_HISTOGRAMS`] histograms (the rest into one overflow histogram per
//! syscall and result). Failed calls of unprivileged callers (uid not 0)
//! are only counted, per syscall, apart from the histograms.

use std::collections::{BTreeMap, BTreeSet};

use hdrhistogram::Histogram;

use super::loader::KernelHistogram;
use super::wire;
use super::{MountSyscall, SyscallEvent};
use crate::util::prometheus::{Exposition, MetricType};

/// Prometheus bucket bounds (seconds) of `volmgr_mount_syscall_duration_seconds`:
/// 1 µs to 10 s.
pub const SYSCALL_BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Highest latency tracked: one hour, in ns.
const MAX_NS: u64 = 3_600_000_000_000;
/// Significant digits of the histograms (1 %: about 36 KiB each).
const SIGFIG: u8 = 2;

/// Distinct driver labels kept (a node's CSI drivers and volume plugins);
/// later ones are labelled `other`.
pub const MAX_DRIVERS: usize = 64;
/// Histograms kept; later keys go into their syscall's and result's
/// overflow histogram (`fstype="other",driver="other"`).
pub const MAX_HISTOGRAMS: usize = 512;

/// Key of one histogram.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    syscall: MountSyscall,
    /// A label of [`super::fstypes::label`] (of [`super::fstypes::mount_label`]
    /// for `mount(2)`).
    fstype: &'static str,
    error: bool,
    /// The CSI driver (or volume plugin) whose volume path the call
    /// touched, `""` when it touched none.
    driver: String,
}

#[derive(Debug, Clone)]
struct Entry {
    hist: Histogram<u64>,
    sum_ns: u128,
}

/// User-side latency histograms (hdrhistogram) per (syscall, fstype,
/// ok/error, driver), bounded (see the module).
#[derive(Debug, Default, Clone)]
pub struct SyscallStats {
    by_key: BTreeMap<Key, Entry>,
    drivers: BTreeSet<String>,
    /// Failed calls of unprivileged callers, per syscall (wire id).
    unprivileged_failures: BTreeMap<MountSyscall, u64>,
}

/// One row of [`SyscallStats::summary`]; latencies in nanoseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SyscallSummary {
    /// Syscall name.
    pub syscall: String,
    /// Filesystem type, `""` when the call has none.
    pub fstype: String,
    /// `ok` or `error`.
    pub result: String,
    /// Number of calls.
    pub count: u64,
    /// Median latency.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest latency.
    pub max_ns: u64,
}

fn result_label(error: bool) -> &'static str {
    if error {
        "error"
    } else {
        "ok"
    }
}

impl SyscallStats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one event's latency.
    pub fn record(&mut self, ev: &SyscallEvent) {
        self.record_for_driver(ev, "");
    }

    /// Records one event's latency for the volume `driver` whose path it
    /// touched (the CSI driver's name, or the plugin's, see
    /// `tracer::timeline::attribute`).
    pub fn record_for_driver(&mut self, ev: &SyscallEvent, driver: &str) {
        let error = ev.ret < 0;
        if error && ev.uid != 0 {
            *self.unprivileged_failures.entry(ev.syscall).or_default() += 1;
            return;
        }
        let mut key = Key {
            syscall: ev.syscall,
            fstype: match ev.syscall {
                MountSyscall::Mount => super::fstypes::mount_label(ev.flags, ev.fstype.as_deref()),
                _ => super::fstypes::label(ev.fstype.as_deref()),
            },
            error,
            driver: self.driver_label(driver),
        };
        if !self.by_key.contains_key(&key) && self.by_key.len() >= MAX_HISTOGRAMS {
            key.fstype = super::fstypes::OTHER;
            key.driver = super::fstypes::OTHER.to_string();
        }
        let entry = match self.by_key.get_mut(&key) {
            Some(e) => e,
            None => {
                // Constant bounds that `new_with_bounds` accepts.
                let Ok(hist) = Histogram::new_with_bounds(1, MAX_NS, SIGFIG) else {
                    return;
                };
                self.by_key.entry(key).or_insert(Entry { hist, sum_ns: 0 })
            }
        };
        entry.hist.saturating_record(ev.latency_ns.max(1));
        entry.sum_ns += u128::from(ev.latency_ns);
    }

    /// `driver`, or `other` once [`MAX_DRIVERS`] others are known.
    fn driver_label(&mut self, driver: &str) -> String {
        if driver.is_empty() || self.drivers.contains(driver) {
            return driver.to_string();
        }
        if self.drivers.len() >= MAX_DRIVERS {
            return super::fstypes::OTHER.to_string();
        }
        self.drivers.insert(driver.to_string());
        driver.to_string()
    }

    /// Failed calls of unprivileged callers (uid not 0), counted apart.
    pub fn unprivileged_failures(&self) -> u64 {
        self.unprivileged_failures.values().sum()
    }

    /// Number of histograms kept.
    pub fn histograms(&self) -> usize {
        self.by_key.len()
    }

    /// Total number of recorded calls.
    pub fn total(&self) -> u64 {
        self.by_key.values().map(|e| e.hist.len()).sum()
    }

    /// `volmgr_mount_syscall_duration_seconds{syscall,fstype,result,driver}`
    /// histogram (Prometheus text) plus `volmgr_trace_events_lost_total`.
    pub fn prometheus_text(&self, events_lost: u64) -> String {
        let mut w = Exposition::new();
        let name = "volmgr_mount_syscall_duration_seconds";
        w.family(
            name,
            "Latency of mount-table syscalls, entry to exit, traced with eBPF.",
            MetricType::Histogram,
        );
        for (k, e) in &self.by_key {
            let labels = [
                ("syscall", k.syscall.name()),
                ("fstype", k.fstype),
                ("result", result_label(k.error)),
                ("driver", k.driver.as_str()),
            ];
            let buckets =
                SYSCALL_BUCKETS.map(|le| (le, e.hist.count_between(0, (le * 1e9) as u64)));
            let sum = e.sum_ns as f64 / 1e9;
            w.histogram(name, &labels, buckets, e.hist.len(), sum);
        }
        if !self.unprivileged_failures.is_empty() {
            let name = "volmgr_mount_syscall_unprivileged_failures_total";
            w.family(
                name,
                "Failed mount-table syscalls of callers with a uid other than 0, counted apart from the histograms.",
                MetricType::Counter,
            );
            for (syscall, n) in &self.unprivileged_failures {
                w.sample(name, &[("syscall", syscall.name())], *n);
            }
        }
        let name = "volmgr_trace_events_lost_total";
        w.family(
            name,
            "Trace events the kernel had no ring-buffer room for.",
            MetricType::Counter,
        );
        w.sample(name, &[], events_lost);
        w.finish()
    }

    /// Summary rows for status/profile: syscall, fstype, result, count,
    /// p50/p90/p99/p99.9/max (ns), sorted by syscall, fstype, result.
    pub fn summary(&self) -> Vec<SyscallSummary> {
        self.merged_over_drivers()
            .iter()
            .map(|(k, e)| SyscallSummary {
                syscall: k.syscall.name().into(),
                fstype: k.fstype.into(),
                result: result_label(k.error).into(),
                count: e.hist.len(),
                p50_ns: e.hist.value_at_quantile(0.5),
                p90_ns: e.hist.value_at_quantile(0.9),
                p99_ns: e.hist.value_at_quantile(0.99),
                p999_ns: e.hist.value_at_quantile(0.999),
                max_ns: e.hist.max(),
            })
            .collect()
    }

    /// The histograms per (syscall, fstype, ok/error), all drivers together.
    fn merged_over_drivers(&self) -> BTreeMap<Key, Entry> {
        let mut out: BTreeMap<Key, Entry> = BTreeMap::new();
        for (k, e) in &self.by_key {
            let key = Key {
                driver: String::new(),
                ..k.clone()
            };
            match out.get_mut(&key) {
                Some(m) => {
                    // Same bounds: adding cannot fail.
                    let _ = m.hist.add(&e.hist);
                    m.sum_ns += e.sum_ns;
                }
                None => {
                    out.insert(key, e.clone());
                }
            }
        }
        out
    }

    /// Rows per (syscall, fstype), successes and failures together, with
    /// the number of failures, and the merged histogram.
    pub fn profile_rows(&self) -> Vec<ProfileRow> {
        let mut merged: BTreeMap<(MountSyscall, &str), (Histogram<u64>, u64)> = BTreeMap::new();
        for (k, e) in &self.by_key {
            let errors = if k.error { e.hist.len() } else { 0 };
            match merged.get_mut(&(k.syscall, k.fstype)) {
                Some((h, n)) => {
                    // Same bounds: adding cannot fail.
                    let _ = h.add(&e.hist);
                    *n += errors;
                }
                None => {
                    merged.insert((k.syscall, k.fstype), (e.hist.clone(), errors));
                }
            }
        }
        merged
            .into_iter()
            .map(|((syscall, fstype), (h, errors))| ProfileRow {
                syscall: syscall.name().into(),
                fstype: fstype.into(),
                count: h.len(),
                errors,
                p50_ns: h.value_at_quantile(0.5),
                p90_ns: h.value_at_quantile(0.9),
                p99_ns: h.value_at_quantile(0.99),
                p999_ns: h.value_at_quantile(0.999),
                max_ns: h.max(),
                buckets: log_buckets(&h),
            })
            .collect()
    }

    /// The histogram of one row of [`SyscallStats::summary`], as
    /// `(upper bound ns, count)` over the kernel's log-linear buckets.
    pub fn distribution(&self, syscall: &str, fstype: &str, error: bool) -> Vec<(u64, u64)> {
        self.merged_over_drivers()
            .iter()
            .find(|(k, _)| k.syscall.name() == syscall && k.fstype == fstype && k.error == error)
            .map(|(_, e)| log_buckets(&e.hist))
            .unwrap_or_default()
    }
}

/// One line of `volmgr profile`: a (syscall, fstype) pair.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileRow {
    /// Syscall name.
    pub syscall: String,
    /// Filesystem type, `""` when the call has none.
    pub fstype: String,
    /// Calls, failed ones included.
    pub count: u64,
    /// Failed calls.
    pub errors: u64,
    /// Median latency, ns.
    pub p50_ns: u64,
    /// 90th percentile, ns.
    pub p90_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// 99.9th percentile, ns.
    pub p999_ns: u64,
    /// Largest latency, ns.
    pub max_ns: u64,
    /// The distribution as `[upper bound ns, count]` over the kernel's
    /// log-linear buckets, empty buckets left out.
    pub buckets: Vec<(u64, u64)>,
}

fn log_buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in h.iter_recorded() {
        let value = v.value_iterated_to();
        let (_, hi) = wire::hist_bucket_bounds_ns(wire::hist_bucket(value));
        match out.last_mut() {
            Some((h, c)) if *h == hi => *c += v.count_at_value(),
            _ => out.push((hi, v.count_at_value())),
        }
    }
    out
}

/// The in-kernel histograms as Prometheus text:
/// `volmgr_mount_syscall_kernel_duration_seconds{syscall,result}` with the
/// kernel's log-linear bucket bounds (exact counts even when events were lost).
pub fn kernel_prometheus_text(hists: &[KernelHistogram]) -> String {
    let mut w = Exposition::new();
    let name = "volmgr_mount_syscall_kernel_duration_seconds";
    w.family(
        name,
        "Latency of mount-table syscalls, from the in-kernel per-CPU histograms.",
        MetricType::Histogram,
    );
    for h in hists {
        let labels = [
            ("syscall", h.syscall.name()),
            ("result", result_label(h.error)),
        ];
        // The overflow bucket (the last) only counts in `+Inf`; only bounds
        // with something at or below them are written.
        let bounded = &h.buckets[..h.buckets.len().saturating_sub(1)];
        let buckets = bounded
            .iter()
            .enumerate()
            .scan(0u64, |cum, (i, c)| {
                *cum += c;
                Some((i, *cum))
            })
            .filter(|&(_, cum)| cum > 0)
            .map(|(i, cum)| (wire::hist_bucket_bounds_ns(i).1 as f64 / 1e9, cum));
        w.histogram(name, &labels, buckets, h.count(), h.sum_ns as f64 / 1e9);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::super::fstypes;
    use super::*;

    /// Today's `prometheus_text` for a fixed input, byte for byte.
    #[test]
    fn prometheus_text_is_unchanged() {
        let empty = SyscallStats::new().prometheus_text(0);
        let mut s = SyscallStats::new();
        for i in 1..=4u64 {
            s.record(&ev(MountSyscall::Mount, Some("tmpfs"), 0, i * 300_000));
        }
        s.record(&ev(MountSyscall::Umount, None, -22, 5000));
        s.record(&ev(
            MountSyscall::Fsconfig,
            Some("od\"d\\fs\n"),
            0,
            12_345_678_901,
        ));
        let text = s.prometheus_text(3);
        let want_empty = concat!(
            "# HELP volmgr_mount_syscall_duration_seconds Latency of mount-table syscalls, entry to exit, traced with eBPF.\n",
            "# TYPE volmgr_mount_syscall_duration_seconds histogram\n",
            "# HELP volmgr_trace_events_lost_total Trace events the kernel had no ring-buffer room for.\n",
            "# TYPE volmgr_trace_events_lost_total counter\n",
            "volmgr_trace_events_lost_total 0\n",
        );
        assert_eq!(empty, want_empty);
        let want = concat!(
            "# HELP volmgr_mount_syscall_duration_seconds Latency of mount-table syscalls, entry to exit, traced with eBPF.\n",
            "# TYPE volmgr_mount_syscall_duration_seconds histogram\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.000001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.0000025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.000005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.00001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.000025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.00005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.0001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.00025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.0005\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.001\"} 3\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.0025\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.005\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.01\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.025\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.05\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.1\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.25\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"0.5\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"1\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"2.5\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"5\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"10\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\",le=\"+Inf\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_sum{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\"} 0.003\n",
            "volmgr_mount_syscall_duration_seconds_count{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\"} 4\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.000001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.0000025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.000005\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.00001\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.000025\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.00005\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.0001\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.00025\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.0005\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.001\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.0025\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.005\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.01\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.025\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.05\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.1\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.25\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.5\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"1\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"2.5\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"5\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"10\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"+Inf\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_sum{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\"} 0.000005\n",
            "volmgr_mount_syscall_duration_seconds_count{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.000001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.0000025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.000005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.00001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.000025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.00005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.0001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.00025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.0005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.001\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.0025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.005\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.01\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.025\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.05\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.1\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.25\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"0.5\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"1\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"2.5\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"5\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"10\"} 0\n",
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\",le=\"+Inf\"} 1\n",
            "volmgr_mount_syscall_duration_seconds_sum{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\"} 12.345678901\n",
            "volmgr_mount_syscall_duration_seconds_count{syscall=\"fsconfig\",fstype=\"other\",result=\"ok\",driver=\"\"} 1\n",
            "# HELP volmgr_trace_events_lost_total Trace events the kernel had no ring-buffer room for.\n",
            "# TYPE volmgr_trace_events_lost_total counter\n",
            "volmgr_trace_events_lost_total 3\n",
        );
        assert_eq!(text, want);
    }

    /// Today's `kernel_prometheus_text` for a fixed input, byte for byte.
    #[test]
    fn kernel_prometheus_text_is_unchanged() {
        let mut buckets = vec![0; wire::HIST_BUCKETS];
        // Bounds with nothing at or below them are left out, and so is the
        // overflow bucket (it only counts in `+Inf`).
        buckets[wire::hist_bucket(8_000_000_000)] = 1;
        buckets[wire::hist_bucket(20_000_000_000)] = 2;
        buckets[wire::HIST_BUCKETS - 1] = 1;
        let busy = KernelHistogram {
            syscall: MountSyscall::Mount,
            error: true,
            buckets,
            sum_ns: 99_000_123_456,
        };
        let idle = KernelHistogram {
            syscall: MountSyscall::MoveMount,
            error: false,
            buckets: vec![0; wire::HIST_BUCKETS],
            sum_ns: 0,
        };
        let text = kernel_prometheus_text(&[busy, idle]);
        let want = concat!(
            "# HELP volmgr_mount_syscall_kernel_duration_seconds Latency of mount-table syscalls, from the in-kernel per-CPU histograms.\n",
            "# TYPE volmgr_mount_syscall_kernel_duration_seconds histogram\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"8.388608\"} 1\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"10.48576\"} 1\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"12.582912\"} 1\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"14.680064\"} 1\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"16.777216\"} 1\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"20.97152\"} 3\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"25.165824\"} 3\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"29.360128\"} 3\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"33.554432\"} 3\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"mount\",result=\"error\",le=\"+Inf\"} 4\n",
            "volmgr_mount_syscall_kernel_duration_seconds_sum{syscall=\"mount\",result=\"error\"} 99.000123456\n",
            "volmgr_mount_syscall_kernel_duration_seconds_count{syscall=\"mount\",result=\"error\"} 4\n",
            "volmgr_mount_syscall_kernel_duration_seconds_bucket{syscall=\"move_mount\",result=\"ok\",le=\"+Inf\"} 0\n",
            "volmgr_mount_syscall_kernel_duration_seconds_sum{syscall=\"move_mount\",result=\"ok\"} 0\n",
            "volmgr_mount_syscall_kernel_duration_seconds_count{syscall=\"move_mount\",result=\"ok\"} 0\n",
        );
        assert_eq!(text, want);
    }

    fn ev(syscall: MountSyscall, fstype: Option<&str>, ret: i64, latency_ns: u64) -> SyscallEvent {
        SyscallEvent {
            boot_ns: 0,
            pid: 1,
            tid: 1,
            comm: "t".into(),
            mnt_ns: 1,
            cgroup_id: 1,
            syscall,
            flags: 0,
            fstype: fstype.map(str::to_string),
            source: None,
            target: None,
            ret,
            latency_ns,
            uid: 0,
        }
    }

    #[test]
    fn summary_and_prometheus() {
        let mut s = SyscallStats::new();
        for i in 1..=100u64 {
            s.record(&ev(MountSyscall::Mount, Some("tmpfs"), 0, i * 1000));
        }
        s.record(&ev(MountSyscall::Umount, None, -22, 5000));
        let rows = s.summary();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].syscall, "mount");
        assert_eq!(rows[0].fstype, "tmpfs");
        assert_eq!(rows[0].count, 100);
        assert!((49_000..=51_000).contains(&rows[0].p50_ns), "{:?}", rows[0]);
        assert!(rows[0].max_ns >= 100_000);
        assert_eq!(rows[1].result, "error");
        let text = s.prometheus_text(3);
        assert!(text.contains(
            "volmgr_mount_syscall_duration_seconds_count{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"\"} 100"
        ));
        assert!(text.contains(
            "volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\",fstype=\"\",result=\"error\",driver=\"\",le=\"0.000005\"} 1"
        ), "{text}");
        assert!(text.contains("volmgr_trace_events_lost_total 3"));
        let dist = s.distribution("mount", "tmpfs", false);
        assert_eq!(dist.iter().map(|d| d.1).sum::<u64>(), 100);
    }

    /// 10,000 distinct type strings, drivers and failing calls of an
    /// unprivileged caller: the histograms stay within their bounds, and
    /// every label printed is one of the fixed set.
    #[test]
    fn hostile_labels_are_bounded() {
        let mut s = SyscallStats::new();
        for i in 0..10_000u64 {
            let fstype = format!("\u{1b}]0;fs{i}\u{7}");
            // Unprivileged and failing: counted apart.
            let mut e = ev(MountSyscall::Mount, Some(&fstype), -1, 1000);
            e.uid = 65534;
            s.record_for_driver(&e, &format!("evil{i}"));
            // The host's root, with invented types and drivers.
            for (syscall, ret) in [(MountSyscall::Mount, -19), (MountSyscall::Fsopen, 3)] {
                let e = ev(syscall, Some(&fstype), ret, 1000);
                s.record_for_driver(&e, &format!("driver{i}"));
            }
            let known = fstypes::KNOWN[i as usize % fstypes::KNOWN.len()];
            let e = ev(MountSyscall::Mount, Some(known), 0, 1000);
            s.record_for_driver(&e, &format!("driver{i}"));
        }
        assert_eq!(s.unprivileged_failures(), 10_000);
        assert!(s.histograms() <= MAX_HISTOGRAMS + 2 * MountSyscall::ALL.len());
        assert_eq!(s.total(), 30_000);
        let rows = s.summary();
        assert!(rows.len() <= 2 * MountSyscall::ALL.len() * (fstypes::KNOWN.len() + 2));
        for r in &rows {
            assert!(
                r.fstype == fstypes::OTHER || fstypes::KNOWN.contains(&r.fstype.as_str()),
                "{r:?}"
            );
        }
        let text = s.prometheus_text(0);
        assert!(!text.contains('\u{1b}'));
        assert!(!text.contains("evil"));
        assert!(text.contains(
            "volmgr_mount_syscall_unprivileged_failures_total{syscall=\"mount\"} 10000\n"
        ));
        let drivers: BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.split("driver=\"").nth(1)?.split('"').next())
            .collect();
        assert!(drivers.len() <= MAX_DRIVERS + 2, "{}", drivers.len());
    }

    #[test]
    fn kernel_text() {
        let mut buckets = vec![0; wire::HIST_BUCKETS];
        buckets[wire::hist_bucket(5000)] = 2;
        let h = KernelHistogram {
            syscall: MountSyscall::Fsopen,
            error: false,
            buckets,
            sum_ns: 10_000,
        };
        let t = kernel_prometheus_text(&[h]);
        assert!(t.contains(
            "volmgr_mount_syscall_kernel_duration_seconds_count{syscall=\"fsopen\",result=\"ok\"} 2"
        ));
    }

    #[test]
    fn driver_label_splits_histograms_and_summary_merges_them() {
        let mut s = SyscallStats::new();
        let mount = ev(MountSyscall::Mount, Some("ext4"), 0, 2_000_000);
        s.record_for_driver(&mount, "hostpath.csi.k8s.io");
        s.record_for_driver(&mount, "hostpath.csi.k8s.io");
        s.record_for_driver(&mount, "kubernetes.io/empty-dir");
        s.record(&mount);
        let text = s.prometheus_text(0);
        for (driver, n) in [
            ("hostpath.csi.k8s.io", 2),
            ("kubernetes.io/empty-dir", 1),
            ("", 1),
        ] {
            let line = format!(
                "volmgr_mount_syscall_duration_seconds_count{{syscall=\"mount\",fstype=\"ext4\",result=\"ok\",driver=\"{driver}\"}} {n}\n"
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        let rows = s.summary();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].count, 4);
        assert_eq!(
            s.distribution("mount", "ext4", false)
                .iter()
                .map(|b| b.1)
                .sum::<u64>(),
            4
        );
    }
}
