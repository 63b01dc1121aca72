//! The text of `volmgr doctor --pod`: a pod's volumes' syscall timelines.

use std::fmt::Write as _;

use volmgr::tracer::timeline::{PodTimeline, VolumeTimeline};
use volmgr::util::escape::printable;

/// A duration in ns as milliseconds.
pub(crate) fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

/// A timeline's heading: the volume (or staging path) and its plugin.
pub(crate) fn volume_title(v: &VolumeTimeline) -> String {
    let what = if v.key.pod_uid.is_some() {
        "volume"
    } else {
        "staging"
    };
    format!("{what} {}/{}", v.key.plugin, v.key.volume)
}

/// The text of `volmgr doctor --pod`: each volume's calls in order, then
/// what is stuck now.
pub fn text(t: &PodTimeline) -> String {
    let mut out = String::new();
    let name = if t.pod.is_empty() { "?" } else { &t.pod };
    let _ = writeln!(out, "pod {} (uid {})", printable(name), printable(&t.uid));
    if let Some(n) = &t.note {
        let _ = writeln!(out, "note: {}", printable(n));
    }
    if t.volumes.is_empty() {
        let _ = writeln!(out, "no calls seen on this pod's volume paths");
    }
    for v in &t.volumes {
        let _ = writeln!(
            out,
            "\n{} (driver {}): {} calls{}",
            printable(&volume_title(v)),
            printable(&v.driver),
            v.entries.len(),
            if v.dropped > 0 {
                format!(", {} older dropped", v.dropped)
            } else {
                String::new()
            }
        );
        for e in &v.entries {
            let source = e
                .source
                .as_deref()
                .map(|s| format!(" from {}", printable(s)))
                .unwrap_or_default();
            let fstype = e
                .fstype
                .as_deref()
                .map(|s| format!(" [{}]", printable(s)))
                .unwrap_or_default();
            // A file system tool's run: its command line.
            let source = match &e.command {
                Some(c) => format!("{source} ({})", printable(c)),
                None => source,
            };
            let _ = writeln!(
                out,
                "  {}  {}[{}/{}]  {} {} {}{}{}  {}  {}",
                e.time,
                printable(&e.comm),
                e.pid,
                e.tid,
                e.call,
                e.role.as_str(),
                printable(&e.path),
                source,
                fstype,
                ms(e.duration_ns),
                e.result
            );
        }
    }
    crate::stuck_text::stuck_text(&mut out, &t.stuck);
    crate::stuck_text::stuck_tools_text(&mut out, &t.stuck_tools);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::timeline_svg::svg;
    use volmgr::status::{StuckSyscall, StuckToolRun};
    use volmgr::tracer::timeline::{PathRole, TimelineEntry, VolumeKey};

    fn sample() -> PodTimeline {
        let entry = |start_ns, result: &str| TimelineEntry {
            time: "2026-01-01T00:00:00.000Z".into(),
            start_ns,
            pid: 7,
            tid: 8,
            comm: "mount".into(),
            call: "mount".into(),
            role: PathRole::Target,
            path: "/r/pods/u/volumes/p/<v>".into(),
            source: Some("tmpfs".into()),
            fstype: Some("tmpfs".into()),
            duration_ns: 1_500_000,
            result: result.into(),
            command: None,
        };
        PodTimeline {
            pod: "ns/web".into(),
            uid: "u".into(),
            volumes: vec![VolumeTimeline {
                key: VolumeKey {
                    pod_uid: Some("u".into()),
                    plugin: "p".into(),
                    volume: "<v>".into(),
                },
                driver: "p".into(),
                entries: vec![entry(1_000_000, "ok"), entry(5_000_000, "EBUSY")],
                dropped: 0,
            }],
            stuck: vec![StuckSyscall {
                call: "statfs".into(),
                path: "/r/x".into(),
                kernel_stack: vec!["fuse_simple_request+0x1/0x2".into()],
                ..Default::default()
            }],
            stuck_tools: vec![StuckToolRun {
                pid: 9,
                comm: "e2fsck".into(),
                command_line: "e2fsck -p /dev/loop7".into(),
                device: Some("/dev/loop7".into()),
                state: "D".into(),
                elapsed_seconds: 130.0,
                pod_uid: Some("u".into()),
                volume: Some("<v>".into()),
                kernel_stack: vec!["io_schedule+0x1/0x2".into()],
                ..Default::default()
            }],
            note: None,
        }
    }

    #[test]
    fn text_lists_calls_in_order_with_process_duration_and_result() {
        let t = text(&sample());
        assert!(t.contains("volume p/<v> (driver p): 2 calls"), "{t}");
        assert!(
            t.contains(
                "mount[7/8]  mount target /r/pods/u/volumes/p/<v> from tmpfs [tmpfs]  1.500ms  ok"
            ),
            "{t}"
        );
        let ok = t.find("  ok\n").unwrap();
        let busy = t.find("EBUSY").unwrap();
        assert!(ok < busy, "in order: {t}");
        assert!(t.contains("stuck now:\n  statfs(/r/x)"), "{t}");
        assert!(t.contains("fuse_simple_request"), "{t}");
        assert!(
            t.contains(
                "file system tools stuck now:\n  e2fsck[9] state D: running 130.0s (since ) (pod u, volume <v>)\n    e2fsck -p /dev/loop7\n      io_schedule+0x1/0x2\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn text_shows_a_tool_run_with_its_command_line() {
        let mut t = sample();
        let mut e = t.volumes[0].entries[0].clone();
        e.comm = "mkfs.ext4".into();
        e.call = "exec".into();
        e.role = PathRole::Staging;
        e.path = "/dev/loop0".into();
        e.source = None;
        e.fstype = None;
        e.command = Some("mkfs.ext4 -q -F /dev/loop0".into());
        e.result = "exit 1".into();
        t.volumes[0].entries = vec![e];
        let text = text(&t);
        assert!(
            text.contains(
                "mkfs.ext4[7/8]  exec staging /dev/loop0 (mkfs.ext4 -q -F /dev/loop0)  1.500ms  exit 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn svg_draws_a_bar_per_call_and_escapes_text() {
        let s = svg(&sample());
        assert!(s.starts_with("<svg "));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<rect ").count(), 2);
        assert!(s.contains("fill=\"#d22\""), "the failed call is red");
        assert!(s.contains("&lt;v&gt;"));
        assert!(!s.contains("<v>"));
    }

    #[test]
    fn names_xml_forbids_are_replaced_and_a_fuse_subtype_is_escaped() {
        let mut t = sample();
        t.volumes[0].entries[0].comm = "m\u{fffe}\u{ffff}\u{1}".into();
        t.stuck[0].comm = "s\u{fffe}".into();
        t.stuck[0].fstype = "fuse.\u{1b}]0;owned\u{7}\u{1b}[2J".into();
        let s = svg(&t);
        for bad in ['\u{fffe}', '\u{ffff}', '\u{1}'] {
            assert!(!s.contains(bad), "{s}");
        }
        assert!(s.contains("m\u{fffd}\u{fffd}\u{fffd}[7/8]"), "{s}");
        let text = text(&t);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
        assert!(
            text.contains("on fuse.\\u{1b}]0;owned\\u{7}\\u{1b}[2J:"),
            "{text}"
        );
    }
}
