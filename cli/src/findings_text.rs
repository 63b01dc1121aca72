//! Observe mode's section of `volmgr status` and the report of
//! `volmgr doctor`: the confinement, then each finding with its evidence
//! and what to do.

use std::fmt::Write as _;

use volmgr::status::{Finding, ObserveStatus};
use volmgr::util::escape::Printable as P;

/// The observe section: confinement, scans, then every finding.
pub fn observe_lines(out: &mut String, o: &ObserveStatus) {
    let _ = writeln!(out, "observe mode: landlock {}", P(&o.landlock));
    let _ = writeln!(out, "  capabilities: {}", P(&o.capabilities));
    let _ = writeln!(out, "  scans: {} (last {})", o.scans, P(&o.last_scan));
    if let Some(e) = &o.scan_error {
        let _ = writeln!(out, "  scan error: {}", P(e));
    }
    if let Some(p) = &o.write_probe {
        let _ = writeln!(out, "  write probe: {}", P(p));
    }
    let more: usize = o.findings_not_listed.values().sum();
    let _ = writeln!(out, "findings: {}", o.findings.len() + more);
    for f in &o.findings {
        finding_lines(out, f);
    }
    for (kind, n) in &o.findings_not_listed {
        let _ = writeln!(out, "- ... and {n} more {} (not listed)", P(kind));
    }
}

/// One finding: kind and summary, then who, the evidence, the syscalls and
/// events, and what to do.
pub fn finding_lines(out: &mut String, f: &Finding) {
    let _ = writeln!(out, "- {}: {}", f.kind.as_str(), P(&f.summary));
    let _ = writeln!(out, "    path: {}", P(&f.path));
    match (&f.pod, &f.pod_uid) {
        (Some(p), Some(u)) => {
            let _ = writeln!(out, "    pod: {} ({})", P(p), P(u));
        }
        (None, Some(u)) => {
            let _ = writeln!(out, "    pod: {} (no longer on the node)", P(u));
        }
        _ => {}
    }
    if let Some(v) = &f.volume {
        let _ = writeln!(out, "    volume: {}", P(v));
    }
    if let Some(s) = &f.since {
        let _ = writeln!(out, "    since: {}", P(s));
    }
    for e in &f.evidence {
        let _ = writeln!(out, "    {}", P(e));
    }
    for c in &f.recent_syscalls {
        let _ = writeln!(
            out,
            "    syscall {} {} by {}: {} after {}us",
            P(&c.time),
            P(&c.call),
            P(&c.process),
            P(&c.result),
            c.duration_us
        );
    }
    for e in &f.events {
        let _ = writeln!(
            out,
            "    event {} {} {} (x{}, {}): {}",
            P(&e.last_time),
            P(&e.type_),
            P(&e.reason),
            e.count,
            P(&e.source),
            P(&e.message)
        );
    }
    let _ = writeln!(out, "    do: {}", f.kind.action());
}
