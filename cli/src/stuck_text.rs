//! The "stuck now" sections of `volmgr status` and `volmgr doctor`: calls
//! blocked in the kernel and file system tools running past their time.

use std::fmt::Write as _;

use volmgr::status::{StuckSyscall, StuckToolRun};
use volmgr::util::escape::printable;

/// The "stuck now" section.
pub fn stuck_text(out: &mut String, stuck: &[StuckSyscall]) {
    if stuck.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nstuck now:");
    if stuck.iter().any(|s| s.kernel_stack.is_empty()) {
        // Observe mode's confinement: /proc/<pid>/task/<tid>/stack needs
        // CAP_SYS_ADMIN and ptrace access, which it does not keep.
        let _ = writeln!(
            out,
            "  (no kernel stack: /proc/<pid>/task/<tid>/stack is not readable here (observe mode keeps neither CAP_SYS_ADMIN nor access to other processes); the path is the call's argument as the eBPF program copied it at entry, its first 255 bytes)"
        );
    }
    for s in stuck {
        let _ = writeln!(
            out,
            "  {}({}) by {}[{}/{}] on {}: blocked {:.1}s (since {})",
            s.call,
            printable(&s.path),
            printable(&s.comm),
            s.pid,
            s.tid,
            printable_or_unknown(&s.fstype),
            s.elapsed_seconds,
            s.since
        );
        for f in &s.kernel_stack {
            let _ = writeln!(out, "      {}", printable(f));
        }
    }
}

/// The "file system tools stuck now" section.
pub fn stuck_tools_text(out: &mut String, tools: &[StuckToolRun]) {
    if tools.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nfile system tools stuck now:");
    for t in tools {
        let volume = match (&t.pod_uid, &t.volume) {
            (Some(uid), Some(v)) => format!(" (pod {}, volume {})", printable(uid), printable(v)),
            (None, Some(v)) => format!(" (volume {})", printable(v)),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}[{}] state {}: running {:.1}s (since {}){}",
            printable(&t.comm),
            t.pid,
            printable_or_unknown(&t.state),
            t.elapsed_seconds,
            t.since,
            volume
        );
        let _ = writeln!(out, "    {}", printable(&t.command_line));
        for f in &t.kernel_stack {
            let _ = writeln!(out, "      {}", printable(f));
        }
    }
}

/// `text` made printable, `?` when empty (not known).
fn printable_or_unknown(text: &str) -> std::borrow::Cow<'_, str> {
    if text.is_empty() {
        "?".into()
    } else {
        printable(text)
    }
}
