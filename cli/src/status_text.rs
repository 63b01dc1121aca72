//! The text `volmgr status` prints: the status document a line per fact,
//! section by section.

use std::fmt::Write as _;

use volmgr::status::{DeviceStatus, OutOfBandEvent, PodStatus, Status, VolumeStatus};
use volmgr::util::escape::Printable as P;

/// The status document as `volmgr status` prints it (without `--json`).
pub fn status_text(s: &Status) -> String {
    let mut out = String::new();
    agent_lines(&mut out, s);
    for p in &s.pods {
        pod_lines(&mut out, p, s.observe.is_some());
    }
    for d in &s.devices {
        device_line(&mut out, d);
    }
    if let Some(o) = &s.observe {
        crate::findings_text::observe_lines(&mut out, o);
    }
    tracer_lines(&mut out, s);
    syscall_lines(&mut out, s);
    for o in &s.operations {
        let _ = writeln!(
            out,
            "op {} {} {}: n={} p50={:.6}s p99={:.6}s max={:.6}s",
            o.operation, o.plugin, o.status, o.count, o.p50_seconds, o.p99_seconds, o.max_seconds
        );
    }
    crate::stuck_text::stuck_text(&mut out, &s.stuck_syscalls);
    crate::stuck_text::stuck_tools_text(&mut out, &s.stuck_tools);
    out
}

/// Whether the agent is synced, its tracer, the sources' errors and the
/// registered CSI drivers.
fn agent_lines(out: &mut String, s: &Status) {
    let _ = writeln!(
        out,
        "synced: {}  tracer: {} ({})",
        s.synced, s.tracer, s.tracer_reason
    );
    let _ = writeln!(out, "root propagation: {}", s.root_propagation);
    if !s.path_resolution.is_empty() {
        let _ = writeln!(out, "path resolution: {}", s.path_resolution);
    }
    for e in &s.errors {
        let _ = writeln!(out, "error: {}: {}", P(&e.source), P(&e.error));
    }
    for d in &s.csi_drivers {
        let _ = writeln!(
            out,
            "csi driver {} at {} (versions: {})",
            P(&d.name),
            P(&d.endpoint),
            P(d.versions.join(", "))
        );
    }
}

/// A pod, why it was rejected, and a line per volume (in observe mode,
/// the kubelet's state of it).
fn pod_lines(out: &mut String, p: &PodStatus, observe: bool) {
    let _ = writeln!(
        out,
        "pod {}/{} ({})",
        P(&p.namespace),
        P(&p.name),
        P(&p.uid)
    );
    if let Some(e) = &p.error {
        // A rejected pod has no volumes; a pod with volumes kept as they
        // were (no longer resolving) has.
        let what = if p.volumes.is_empty() {
            "rejected"
        } else {
            "error"
        };
        let _ = writeln!(out, "  {what}: {}", P(e));
    }
    for v in &p.volumes {
        if observe {
            observed_volume_line(out, v);
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<20} {:<26} {:<10} attempts={:<3} {}{}{}",
            P(&v.name).to_string(),
            v.plugin,
            v.state,
            v.attempts,
            volume_detail(v),
            volume_out_of_band(v),
            volume_stats(v)
        );
    }
}

/// Observe mode: a volume as the kubelet has it (observe mode starts no
/// operation: no attempts to show).
fn observed_volume_line(out: &mut String, v: &VolumeStatus) {
    let since = v.since.as_deref().unwrap_or("?");
    let state = match v.state.as_str() {
        "mounted" => "mounted by the kubelet".to_string(),
        "not_mounted" if v.since.is_some() => format!("not mounted (since {since})"),
        "not_mounted" => "not mounted".to_string(),
        "stuck" => format!("stuck since {since}"),
        "unknown" => "not scanned yet".to_string(),
        other => other.to_string(),
    };
    let _ = writeln!(
        out,
        "  {:<20} {:<26} {} {}",
        P(&v.name).to_string(),
        v.plugin,
        state,
        volume_detail(v)
    );
}

/// A volume's device mount: state, pods using it, and its operation's
/// error (else its path).
fn device_line(out: &mut String, d: &DeviceStatus) {
    let detail = match (&d.error, &d.path) {
        (Some(e), _) => format!("{} error: {}", d.operation.as_deref().unwrap_or(""), P(e)),
        (None, Some(p)) => P(p).to_string(),
        (None, None) => String::new(),
    };
    let _ = writeln!(
        out,
        "device {} {} {} pods={} attempts={} {}",
        P(&d.volume),
        d.plugin,
        d.state,
        d.pods,
        d.attempts,
        detail
    );
}

/// A volume's error, else its path (`(ro)` when set up read-only).
fn volume_detail(v: &VolumeStatus) -> String {
    match (&v.error, &v.path) {
        (Some(e), _) => format!("error: {}", P(e)),
        (None, Some(p)) if v.read_only => format!("{} (ro)", P(p)),
        (None, Some(p)) => P(p).to_string(),
        (None, None) => String::new(),
    }
}

/// How often a volume was changed behind the agent's back, and when last.
fn volume_out_of_band(v: &VolumeStatus) -> String {
    match &v.last_out_of_band {
        Some(t) if v.out_of_band_changes > 0 => {
            format!(" out-of-band={} (last {t})", v.out_of_band_changes)
        }
        _ => String::new(),
    }
}

/// A volume's last stats: usage, inodes, health, staleness.
fn volume_stats(v: &VolumeStatus) -> String {
    let Some(s) = &v.stats else {
        return String::new();
    };
    let health = match (&s.abnormal, &s.message) {
        (true, Some(m)) => format!(" ABNORMAL: {m}"),
        (true, None) => " ABNORMAL".to_string(),
        (false, _) => String::new(),
    };
    let stale = if s.stale { " (stale)" } else { "" };
    format!(
        " used={}/{}B inodes={}/{}{health}{stale}",
        s.used_bytes, s.capacity_bytes, s.inodes_used, s.inodes
    )
}

/// The tracer's counters (when it runs) and the out-of-band changes it or
/// a resync found.
fn tracer_lines(out: &mut String, s: &Status) {
    let t = &s.tracer_stats;
    if s.observe.is_some() && s.tracer != "off" {
        // Observe mode manages nothing: no change is out of band.
        let _ = writeln!(
            out,
            "tracer events: {}  events lost: {}",
            t.events, t.events_lost
        );
    } else if s.tracer != "off" {
        let _ = writeln!(
            out,
            "tracer events: {}  out-of-band: {}  mount-table checks: {}  events lost: {}",
            t.events, t.out_of_band_events, t.checks, t.events_lost
        );
    }
    if !s.out_of_band.is_empty() {
        let _ = writeln!(out, "out-of-band changes (oldest first):");
    }
    for e in &s.out_of_band {
        out_of_band_line(out, e);
    }
}

/// One out-of-band change: what, where, how it was found and what became
/// of it.
fn out_of_band_line(out: &mut String, e: &OutOfBandEvent) {
    let cause = e
        .cause
        .as_deref()
        .map(|c| format!(" {}", P(c)))
        .unwrap_or_default();
    let after = e
        .detected_after_us
        .map(|us| format!(" (confirmed {us} µs after the syscall)"))
        .unwrap_or_default();
    let repaired = e
        .repaired_after_ms
        .map(|ms| format!(" after {ms:.3} ms"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  {} {} pod {} volume {} ({}): found by {}{}{}; {}{}",
        e.time,
        e.kind,
        P(&e.pod_uid),
        P(&e.volume),
        P(&e.path),
        e.detected_by,
        cause,
        after,
        e.outcome,
        repaired
    );
}

/// The table of mount-table syscall latencies, per syscall, filesystem
/// type and result.
fn syscall_lines(out: &mut String, s: &Status) {
    if !s.syscalls.is_empty() {
        let _ = writeln!(
            out,
            "{:<14} {:<10} {:<6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "syscall", "fstype", "result", "count", "p50", "p90", "p99", "p99.9", "max"
        );
    }
    for c in &s.syscalls {
        let us = |sec: f64| format!("{:.1}µs", sec * 1e6);
        let _ = writeln!(
            out,
            "{:<14} {:<10} {:<6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            c.syscall,
            c.fstype,
            c.result,
            c.count,
            us(c.p50_seconds),
            us(c.p90_seconds),
            us(c.p99_seconds),
            us(c.p999_seconds),
            us(c.max_seconds)
        );
    }
}
