//! (i) `teardown_blocked`: a deleted pod's volume still mounted after
//! `--stuck-after` because something holds it (`umount` answers
//! `device or resource busy`, the pod stays Terminating).
//!
//! How it relates to (b) `mounted_for_deleted_pod`: each (b) finding past
//! its wait is looked at once more, with one bounded holder scan for all
//! of them ([`super::holders`], run by [`super::holder_helper`]). It
//! becomes `teardown_blocked` when a holder is found (a process with its
//! cwd, root, an open file or a mapping under the mount; another mount
//! namespace that still has it; a holder of its block device), or when
//! the last `umount` the tracer saw on the path answered `EBUSY` and the
//! scan could not look at everything (a bound, the time limit, processes
//! it may not read). Otherwise it stays (b): nothing volmgr can see holds
//! it (an `EBUSY` seen earlier is then stale, the holder gone since: it
//! is said in the evidence). Once the holders are gone the finding goes
//! back to (b) until the volume is unmounted.

use std::path::Path;

use super::holder_helper::{self, HolderScanError};
#[cfg(doc)]
use super::holders::HOLDERS_LISTED;
use super::holders::{Scan, Target};
use super::SyscallHistory;
use crate::status::{Finding, FindingKind, RecentSyscall};
use crate::sys::mount_table::MountTable;

/// Turns the (b) findings of `out` whose mount is held into
/// [`FindingKind::TeardownBlocked`], with the holders, the `EBUSY` calls
/// and what the scan examined as evidence. No scan without a (b) finding.
pub(super) fn reclassify(out: &mut [Finding], table: &MountTable, history: &dyn SyscallHistory) {
    let left: Vec<(usize, Target)> = out
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == FindingKind::MountedForDeletedPod)
        .filter_map(|(i, f)| Some((i, target(table, Path::new(&f.path))?)))
        .collect();
    if left.is_empty() {
        return;
    }
    let targets: Vec<Target> = left.iter().map(|(_, t)| t.clone()).collect();
    let scan = holder_helper::scan(&targets);
    for (j, (i, _)) in left.iter().enumerate() {
        let f = &mut out[*i];
        f.recent_syscalls = history.recent_for_path(Path::new(&f.path));
        let (holders, total) = match &scan {
            Ok(s) => {
                let listed = s.holders.get(j).map(Vec::as_slice).unwrap_or_default();
                let total = s.holder_counts.get(j).copied().unwrap_or(listed.len());
                (listed, total)
            }
            Err(_) => (&[][..], 0),
        };
        judge(f, scan.as_ref(), holders, total);
    }
}

/// The mount on top at `path`, as a holder scan's target.
fn target(table: &MountTable, path: &Path) -> Option<Target> {
    let m = table.top(path)?;
    let same = table
        .entries()
        .iter()
        .filter(|o| (o.major, o.minor) == (m.major, m.minor) && o.root == m.root)
        .count();
    Some(Target {
        path: path.to_path_buf(),
        major: m.major,
        minor: m.minor,
        root: m.root.clone(),
        unique: same == 1,
    })
}

/// Whether `c` is an unmount.
fn is_umount(c: &RecentSyscall) -> bool {
    c.call.starts_with("umount")
}

/// Decides one (b) finding from its holders (those listed, `total` found)
/// and its recent calls.
fn judge(f: &mut Finding, scan: Result<&Scan, &HolderScanError>, holders: &[String], total: usize) {
    let busy: Vec<&RecentSyscall> = f
        .recent_syscalls
        .iter()
        .filter(|c| is_umount(c) && c.result == "EBUSY")
        .collect();
    let last_busy = f
        .recent_syscalls
        .iter()
        .rev()
        .find(|c| is_umount(c))
        .is_some_and(|c| c.result == "EBUSY");
    let (complete, examined) = match scan {
        Ok(s) => (s.complete(), s.summary()),
        Err(e) => (false, format!("holder scan: {e}")),
    };
    let busy_line = busy.last().map(|c| {
        format!(
            "{} umount calls answered EBUSY, the last at {} by {}",
            busy.len(),
            c.time,
            c.process
        )
    });
    // Blocked: a holder named, or an EBUSY the scan cannot explain.
    let blocked = !holders.is_empty() || (last_busy && !complete);
    if !blocked {
        if let Some(l) = busy_line {
            f.evidence
                .push(format!("{l}; no holder found now ({examined})"));
        }
        return;
    }
    let uid = f.pod_uid.clone().unwrap_or_default();
    f.kind = FindingKind::TeardownBlocked;
    f.summary = match holders.first() {
        // `total`, not the lines listed: past [`HOLDERS_LISTED`] the last
        // line is `... and N more holders`, no holder.
        Some(first) if total > 1 => format!(
            "pod {uid} is no longer on the node, its volume is still mounted and held: {first} (and {} more)",
            total - 1
        ),
        Some(first) => format!(
            "pod {uid} is no longer on the node, its volume is still mounted and held: {first}"
        ),
        None => format!(
            "pod {uid} is no longer on the node, its volume is still mounted: umount answered EBUSY, the holder not found"
        ),
    };
    f.evidence.extend(holders.iter().cloned());
    f.evidence.extend(busy_line);
    f.evidence.push(examined);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observer::holders::HOLDERS_LISTED;

    /// With more holders than are listed, the summary counts the holders
    /// found, not the lines: it said `(and 16 more)` for 20 holders before
    /// (the 16 listed, less the first, plus the `... and 4 more holders`
    /// line).
    #[test]
    fn the_summary_counts_every_holder_found() {
        let found = 20;
        let mut holders: Vec<String> = (0..HOLDERS_LISTED)
            .map(|i| format!("held by pid {i}"))
            .collect();
        holders.push(format!("... and {} more holders", found - HOLDERS_LISTED));
        let scan = Scan {
            holders: vec![holders.clone()],
            holder_counts: vec![found],
            ..Scan::default()
        };
        let mut f = Finding {
            kind: FindingKind::MountedForDeletedPod,
            pod_uid: Some("u".into()),
            pod: None,
            volume: None,
            path: "/k/pods/u/volumes/x/v".into(),
            summary: String::new(),
            evidence: Vec::new(),
            since: None,
            recent_syscalls: Vec::new(),
            events: Vec::new(),
        };
        judge(&mut f, Ok(&scan), &holders, found);
        assert_eq!(f.kind, FindingKind::TeardownBlocked);
        assert!(
            f.summary.ends_with("held: held by pid 0 (and 19 more)"),
            "{}",
            f.summary
        );
    }
}
