//! `volmgr doctor`: the node's report (observe mode's findings, the calls
//! stuck now) and, with `--pod NS/NAME`, a pod's volumes' syscall timelines (every
//! mount-family call any process made on their paths, traced with eBPF,
//! see `volmgr::tracer::timeline`) and the calls on them stuck now; as
//! text, JSON, or an SVG drawing (`--svg FILE`, hand-written, no
//! dependency). The agent answers the `timeline` request of its status
//! socket ([`answer`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use volmgr::status::{Status, StuckSyscall, StuckToolRun};
use volmgr::tracer::timeline::{PodTimeline, VolumeTimeline};
use volmgr::util::escape::printable;
use volmgr::volumemanager::VolumeManager;

use crate::api::{self, Request};

/// `volmgr doctor`'s flags.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Where the agent's status socket is: the observing agent's
    /// `--state-dir`, or a managing agent's `--root`.
    #[arg(long, visible_alias = "root", default_value = "/run/volmgr")]
    pub state_dir: PathBuf,
    /// One pod's volumes' syscall timelines instead of the node's report,
    /// as NAMESPACE/NAME or its UID.
    #[arg(long)]
    pub pod: Option<String>,
    /// With `--pod`: also draw the timelines as SVG into this file.
    #[arg(long, value_name = "FILE", requires = "pod")]
    pub svg: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the agent's answer.
    #[arg(long, default_value = "30")]
    pub timeout: f64,
}

/// Runs `volmgr doctor`: exit 0 when nothing needs a person, 1 when
/// something does (a finding, a stuck call), 2 when no agent answers.
pub async fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let timeout = Duration::try_from_secs_f64(args.timeout).context("--timeout")?;
    match &args.pod {
        Some(pod) => pod_timelines(&args, pod, timeout).await,
        None => node_report(&args, timeout).await,
    }
}

/// The node's report: observe mode's findings (when the agent observes)
/// and the syscalls stuck now.
async fn node_report(args: &DoctorArgs, timeout: Duration) -> anyhow::Result<ExitCode> {
    let v = match api::call(&args.state_dir, &Request::Status, timeout).await {
        Ok(v) => v,
        Err(e @ api::ApiError::Untrusted { .. }) => {
            eprintln!("volmgr: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => {
            eprintln!(
                "volmgr: no agent answers on {}: {e} (start `volmgr agent --observe --state-dir {}`)",
                api::socket_path(&args.state_dir).display(),
                args.state_dir.display()
            );
            return Ok(ExitCode::from(2));
        }
    };
    let s: Status = serde_json::from_value(v)?;
    let findings = s.observe.as_ref().map_or(0, |o| o.findings.len());
    if args.json {
        // Observe mode's status (findings, sandbox, scans) with the stuck
        // calls beside it; a managing agent has no findings scan.
        let mut report = match &s.observe {
            Some(o) => serde_json::to_value(o)?,
            None => serde_json::json!({"mode": "manager", "findings": []}),
        };
        if let Some(m) = report.as_object_mut() {
            m.insert(
                "stuck_syscalls".into(),
                serde_json::to_value(&s.stuck_syscalls)?,
            );
            m.insert("stuck_tools".into(), serde_json::to_value(&s.stuck_tools)?);
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let mut out = String::new();
        match &s.observe {
            Some(o) => crate::findings_text::observe_lines(&mut out, o),
            None => out.push_str(
                "manager mode: no findings scan (findings come from `volmgr agent --observe`)\n",
            ),
        }
        stuck_text(&mut out, &s.stuck_syscalls);
        stuck_tools_text(&mut out, &s.stuck_tools);
        print!("{out}");
    }
    let needs_a_person = findings > 0 || !s.stuck_syscalls.is_empty() || !s.stuck_tools.is_empty();
    Ok(if needs_a_person {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One pod's timelines: exit 0, or 1 when a call or a file system tool on
/// the pod's volumes is stuck now.
async fn pod_timelines(
    args: &DoctorArgs,
    pod: &str,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let req = Request::Timeline {
        pod: pod.to_string(),
    };
    let v = api::call(&args.state_dir, &req, timeout)
        .await
        .context("asking the agent (is it running on this root or state directory?)")?;
    let t: PodTimeline = serde_json::from_value(v.clone())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", text(&t));
    }
    if let Some(file) = &args.svg {
        // A new file renamed over FILE: a symlink or hard link planted
        // there is replaced, never written through.
        volmgr::util::output::replace_file(file, svg(&t).as_bytes())
            .with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(if t.stuck.is_empty() && t.stuck_tools.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The agent's answer to `{"method":"timeline","pod":...}`: the pod by
/// `namespace/name` or UID among the manager's pods (a UID it does not
/// know is taken as given: a pod that left may still have timelines).
pub fn answer(vm: &VolumeManager, pod: &str) -> Result<PodTimeline, String> {
    let status = vm.status();
    let found = status
        .pods
        .iter()
        .find(|p| format!("{}/{}", p.namespace, p.name) == pod || p.uid == pod);
    let (name, uid) = match found {
        Some(p) => (format!("{}/{}", p.namespace, p.name), p.uid.clone()),
        None if pod.contains('/') => return Err(format!("no pod {pod} on this node")),
        None => (String::new(), pod.to_string()),
    };
    let ctx = vm.tracer_context();
    let note = (status.tracer != "ebpf").then(|| {
        format!(
            "timelines need the eBPF tracer; the active tracer is {} ({})",
            status.tracer, status.tracer_reason
        )
    });
    Ok(PodTimeline {
        pod: name,
        volumes: ctx.status.timelines().for_pod(&uid),
        stuck: ctx.status.stuck().for_pod(&uid),
        stuck_tools: ctx.status.stuck().tools_for_pod(&uid),
        uid,
        note,
    })
}

fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn volume_title(v: &VolumeTimeline) -> String {
    let what = if v.key.pod_uid.is_some() {
        "volume"
    } else {
        "staging"
    };
    format!("{what} {}/{}", v.key.plugin, v.key.volume)
}

/// The text report.
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
    stuck_text(&mut out, &t.stuck);
    stuck_tools_text(&mut out, &t.stuck_tools);
    out
}

/// The "stuck now" section (also used by status text).
pub fn stuck_text(out: &mut String, stuck: &[StuckSyscall]) {
    if stuck.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nstuck now:");
    if stuck.iter().any(|s| s.path.is_empty()) {
        // Observe mode's confinement: /proc/<pid>/mem is not readable.
        let _ = writeln!(
            out,
            "  (a call's path could not be read: the agent reads it from the caller's memory, which observe mode's confinement forbids; known for each call: the call, the caller's pid/tid, how long it has been blocked; its file system and kernel stack as far as readable)"
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
            if s.fstype.is_empty() {
                "?".into()
            } else {
                printable(&s.fstype)
            },
            s.elapsed_seconds,
            s.since
        );
        for f in &s.kernel_stack {
            let _ = writeln!(out, "      {}", printable(f));
        }
    }
}

/// The "file system tools stuck now" section (also used by status text).
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
            if t.state.is_empty() {
                "?".into()
            } else {
                printable(&t.state)
            },
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

/// Text for the SVG: markup escaped, what XML forbids replaced (process
/// names and paths are anyone's).
fn xml(s: &str) -> String {
    volmgr::util::escape::xml_text(s)
}

const LABEL_W: f64 = 320.0;
const PLOT_W: f64 = 800.0;
const ROW_H: f64 = 28.0;
const TOP: f64 = 50.0;

/// Five time ticks from `t0` to `t1` (offsets from `t0`).
fn axis(o: &mut String, t0: u64, t1: u64, rows: f64, x: &dyn Fn(u64) -> f64) {
    for i in 0..=4u64 {
        let ns = t0 + (t1 - t0) * i / 4;
        let xi = x(ns);
        let _ = writeln!(
            o,
            r##"<line x1="{xi:.1}" y1="{}" x2="{xi:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xi:.1}" y="{}" text-anchor="middle">+{}</text>"##,
            TOP - 10.0,
            TOP + rows * ROW_H,
            TOP - 14.0,
            ms(ns - t0)
        );
    }
}

/// The SVG drawing: a row per volume, a bar per call from its start for
/// its duration (green ok, red failed; at least 2 px wide), on one time axis.
pub fn svg(t: &PodTimeline) -> String {
    let all = t.volumes.iter().flat_map(|v| v.entries.iter());
    let t0 = all.clone().map(|e| e.start_ns).min().unwrap_or(0);
    let t1 = all
        .map(|e| e.start_ns + e.duration_ns)
        .max()
        .unwrap_or(1)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |ns: u64| LABEL_W + (ns.saturating_sub(t0)) as f64 / span * PLOT_W;
    let rows = t.volumes.len().max(1) as f64;
    let height = TOP + rows * ROW_H + 40.0 + 16.0 * t.stuck.len() as f64;
    let width = LABEL_W + PLOT_W + 20.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r#"<text x="8" y="18" font-size="14">pod {} (uid {}): mount-family syscalls on its volumes</text>"#,
        xml(&t.pod),
        xml(&t.uid)
    );
    axis(&mut o, t0, t1, rows, &x);
    for (i, v) in t.volumes.iter().enumerate() {
        let y = TOP + i as f64 * ROW_H;
        let _ = writeln!(
            o,
            r#"<text x="8" y="{:.1}">{}</text>"#,
            y + ROW_H / 2.0 + 4.0,
            xml(&volume_title(v))
        );
        for e in &v.entries {
            let x0 = x(e.start_ns);
            let w = (x(e.start_ns + e.duration_ns) - x0).max(2.0);
            let color = if e.result == "ok" { "#2a2" } else { "#d22" };
            let _ = writeln!(
                o,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{color}"><title>{} {}[{}/{}] {} {} {} {}</title></rect>"#,
                y + 4.0,
                ROW_H - 8.0,
                xml(&e.time),
                xml(&e.comm),
                e.pid,
                e.tid,
                xml(&e.call),
                xml(&e.path),
                ms(e.duration_ns),
                xml(&e.result)
            );
        }
    }
    let mut y = TOP + rows * ROW_H + 24.0;
    for s in &t.stuck {
        let _ = writeln!(
            o,
            r##"<text x="8" y="{y:.1}" fill="#c60">stuck: {}({}) by {}[{}/{}] blocked {:.1}s</text>"##,
            xml(&s.call),
            xml(&s.path),
            xml(&s.comm),
            s.pid,
            s.tid,
            s.elapsed_seconds
        );
        y += 16.0;
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
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
