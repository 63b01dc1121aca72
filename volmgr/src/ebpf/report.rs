//! `volmgr trace` and `volmgr profile`: the tracer on its own, without the
//! agent. `trace` prints a line per syscall; `profile` collects for a while
//! and prints latency percentiles, text histograms and optionally an SVG.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use super::decode::{self, ExtraArgs};
use super::{
    own_mount_namespace, EbpfError, EbpfTracer, KernelHistogram, ProfileRow, ProgramRunStats,
    SyscallEvent, SyscallStats, TraceFilter,
};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The tracer could not start.
    #[error("cannot start the eBPF tracer: {0}")]
    Tracer(#[from] EbpfError),
    /// Reading our mount namespace or writing output failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Options of `volmgr trace`.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// One JSON object per line instead of text.
    pub json: bool,
    /// Every mount namespace, not only the caller's.
    pub all_namespaces: bool,
    /// Stop after this many events.
    pub count: Option<u64>,
}

/// Options of `volmgr profile`.
#[derive(Debug, Clone, Default)]
pub struct ProfileOptions {
    /// How long to collect.
    pub duration: Duration,
    /// Print JSON instead of text.
    pub json: bool,
    /// Also write an SVG plot of the distributions here.
    pub svg: Option<std::path::PathBuf>,
    /// Every mount namespace, not only the caller's.
    pub all_namespaces: bool,
    /// Turn on the kernel's BPF run-time statistics while profiling and
    /// report the tracer programs' own run time.
    pub bpf_stats: bool,
}

fn filter(all_namespaces: bool) -> Result<TraceFilter, ReportError> {
    Ok(TraceFilter {
        mnt_ns: if all_namespaces {
            None
        } else {
            Some(own_mount_namespace()?)
        },
    })
}

/// Wall-clock time minus CLOCK_MONOTONIC (what `bpf_ktime_get_ns` reads), ns.
fn monotonic_to_wall_offset() -> i128 {
    let mono = i128::from(crate::util::clock::monotonic_ns());
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    wall - mono
}

/// `HH:MM:SS.micros` (UTC) of a wall-clock time in ns since the epoch.
fn clock_text(wall_ns: i128) -> String {
    let secs = wall_ns.div_euclid(1_000_000_000);
    let micros = wall_ns.rem_euclid(1_000_000_000) / 1000;
    let day = secs.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        micros
    )
}

/// A latency for people: `850ns`, `12.3us`, `4.56ms`, `1.20s`.
pub fn duration_text(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", v / 1e6)
    } else {
        format!("{:.2}s", v / 1e9)
    }
}

/// One event as a line of text.
pub fn event_line(ev: &SyscallEvent, x: &ExtraArgs, wall_offset: i128) -> String {
    format!(
        "{} {:<16} {:>7} {:>10} {} = {} [{}]",
        clock_text(i128::from(ev.boot_ns) + wall_offset),
        ev.comm,
        ev.pid,
        ev.mnt_ns,
        decode::call_text(ev, x),
        decode::ret_text(ev.ret),
        duration_text(ev.latency_ns)
    )
}

/// One event as a JSON object.
pub fn event_json(ev: &SyscallEvent, x: &ExtraArgs, wall_offset: i128) -> serde_json::Value {
    let wall_ns = i128::from(ev.boot_ns) + wall_offset;
    json!({
        "time": clock_text(wall_ns),
        "time_unix_ns": wall_ns as i64,
        "boot_ns": ev.boot_ns,
        "comm": ev.comm,
        "pid": ev.pid,
        "tid": ev.tid,
        "mnt_ns": ev.mnt_ns,
        "cgroup_id": ev.cgroup_id,
        "syscall": ev.syscall.name(),
        "flags": ev.flags,
        "flags_decoded": decode::flags_of(ev),
        "fstype": ev.fstype,
        "source": ev.source,
        "target": ev.target,
        "fds": x.fds,
        "aux": x.aux,
        "call": decode::call_text(ev, x),
        "ret": ev.ret,
        "errno": decode::errno_name(ev.ret),
        "latency_ns": ev.latency_ns,
    })
}

/// Runs `volmgr trace` until interrupted (SIGINT/SIGTERM) or `count` events.
/// Prints "tracing ..." on stderr once attached, and the number of events
/// lost at the end.
pub async fn trace(opts: TraceOptions) -> Result<(), ReportError> {
    let f = filter(opts.all_namespaces)?;
    let mut tracer = EbpfTracer::load(f)?;
    // Made once, before saying we are ready: a signal between two waits is
    // kept, not missed.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let wall_offset = monotonic_to_wall_offset();
    let scope = match f.mnt_ns {
        Some(ns) => format!("mount namespace {ns}"),
        None => "all mount namespaces".into(),
    };
    eprintln!("volmgr: tracing mount syscalls in {scope}; Ctrl-C to stop");
    if !opts.json {
        println!(
            "{:<15} {:<16} {:>7} {:>10} CALL = RET [LATENCY]",
            "TIME", "COMM", "PID", "MNT_NS"
        );
    }
    let mut seen = 0u64;
    let mut batch = Vec::new();
    let mut stop = false;
    while !stop {
        tokio::select! {
            r = tracer.next_events(&mut batch) => r?,
            _ = int.recv() => stop = true,
            _ = term.recv() => stop = true,
        }
        if stop {
            // Calls that returned before the signal are in the ring: print them.
            tracer.drain_now(&mut batch);
        }
        let mut out = std::io::stdout().lock();
        for (ev, x) in batch.drain(..) {
            if opts.count.is_some_and(|c| seen >= c) {
                stop = true;
                break;
            }
            seen += 1;
            let line = if opts.json {
                event_json(&ev, &x, wall_offset).to_string()
            } else {
                event_line(&ev, &x, wall_offset)
            };
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        if opts.count.is_some_and(|c| seen >= c) {
            stop = true;
        }
    }
    eprintln!("volmgr: {seen} events, {} lost", tracer.events_lost());
    Ok(())
}

/// The result of `volmgr profile`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Profile {
    /// Seconds collected.
    pub duration_seconds: f64,
    /// Mount namespace traced, `None` for all.
    pub mnt_ns: Option<u64>,
    /// Events received.
    pub events: u64,
    /// Events the kernel had no ring room for.
    pub events_lost: u64,
    /// Per (syscall, fstype).
    pub rows: Vec<ProfileRow>,
    /// With `--bpf-stats`: runs and run time of the tracer's programs
    /// (two runs per traced syscall, in any namespace).
    pub bpf_programs: Option<ProgramRunStats>,
    /// Calls counted by the in-kernel histograms, per (syscall, result):
    /// exact even if events were lost.
    pub kernel: Vec<KernelRow>,
}

/// Totals of one in-kernel histogram.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelRow {
    /// Syscall name.
    pub syscall: String,
    /// `ok` or `error`.
    pub result: String,
    /// Calls.
    pub count: u64,
    /// Mean latency, ns.
    pub mean_ns: u64,
}

fn kernel_rows(h: &[KernelHistogram]) -> Vec<KernelRow> {
    h.iter()
        .map(|k| KernelRow {
            syscall: k.syscall.name().into(),
            result: if k.error { "error" } else { "ok" }.into(),
            count: k.count(),
            mean_ns: k.sum_ns / k.count().max(1),
        })
        .collect()
}

/// Runs `volmgr profile`: collects for `duration` (or until interrupted)
/// and prints the report.
pub async fn profile(opts: ProfileOptions) -> Result<Profile, ReportError> {
    let f = filter(opts.all_namespaces)?;
    let mut tracer = EbpfTracer::load(f)?;
    let stats_fd = if opts.bpf_stats {
        Some(super::enable_run_time_stats()?)
    } else {
        None
    };
    let runs_before = tracer.program_run_stats();
    // Made once, before saying we are ready: a signal between two waits is
    // kept, not missed.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    eprintln!(
        "volmgr: profiling mount syscalls for {:.1}s",
        opts.duration.as_secs_f64()
    );
    let mut stats = SyscallStats::new();
    let start = tokio::time::Instant::now();
    let deadline = start + opts.duration;
    let mut batch = Vec::new();
    loop {
        let stop = tokio::select! {
            r = tracer.next_events(&mut batch) => { r?; false },
            _ = tokio::time::sleep_until(deadline) => true,
            _ = int.recv() => true,
            _ = term.recv() => true,
        };
        if stop {
            // Calls that returned before the end are in the ring: count them.
            tracer.drain_now(&mut batch);
        }
        for (ev, _) in batch.drain(..) {
            stats.record(&ev);
        }
        if stop {
            break;
        }
    }
    let bpf_programs = stats_fd.map(|fd| {
        let after = tracer.program_run_stats();
        drop(fd);
        ProgramRunStats {
            runs: after.runs - runs_before.runs.min(after.runs),
            run_time_ns: after.run_time_ns - runs_before.run_time_ns.min(after.run_time_ns),
        }
    });
    let profile = Profile {
        bpf_programs,
        duration_seconds: start.elapsed().as_secs_f64(),
        mnt_ns: f.mnt_ns,
        events: stats.total(),
        events_lost: tracer.events_lost(),
        rows: stats.profile_rows(),
        kernel: kernel_rows(&tracer.kernel_histograms()),
    };
    if let Some(path) = &opts.svg {
        crate::util::output::replace_file(path, svg(&profile.rows).as_bytes())?;
    }
    if opts.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&profile).unwrap_or_default()
        );
    } else {
        print!("{}", profile_text(&profile));
    }
    Ok(profile)
}

/// The text report.
pub fn profile_text(p: &Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} events in {:.1}s ({}), {} lost",
        p.events,
        p.duration_seconds,
        p.mnt_ns.map_or("all mount namespaces".into(), |n| format!(
            "mount namespace {n}"
        )),
        p.events_lost
    );
    let _ = writeln!(
        out,
        "{:<14} {:<12} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "SYSCALL", "FSTYPE", "COUNT", "ERRORS", "P50", "P90", "P99", "P99.9", "MAX"
    );
    for r in &p.rows {
        let _ = writeln!(
            out,
            "{:<14} {:<12} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            r.syscall,
            if r.fstype.is_empty() { "-" } else { &r.fstype },
            r.count,
            r.errors,
            duration_text(r.p50_ns),
            duration_text(r.p90_ns),
            duration_text(r.p99_ns),
            duration_text(r.p999_ns),
            duration_text(r.max_ns)
        );
    }
    for r in &p.rows {
        let _ = writeln!(
            out,
            "\n{} {}",
            r.syscall,
            if r.fstype.is_empty() { "" } else { &r.fstype }
        );
        out.push_str(&text_histogram(&r.buckets));
    }
    if let Some(b) = &p.bpf_programs {
        let _ = writeln!(
            out,
            "\ntracer programs: {} runs (an enter and an exit per call, in any mount namespace), {} each",
            b.runs,
            duration_text(b.run_time_ns / b.runs.max(1))
        );
    }
    if !p.kernel.is_empty() {
        let _ = writeln!(
            out,
            "\nin-kernel histograms (every call, even lost events):"
        );
        for k in &p.kernel {
            let _ = writeln!(
                out,
                "  {:<14} {:<6} count={:<8} mean={}",
                k.syscall,
                k.result,
                k.count,
                duration_text(k.mean_ns)
            );
        }
    }
    out
}

/// Bars per power of two: `[lo, hi) ████ count`.
fn text_histogram(buckets: &[(u64, u64)]) -> String {
    // Merge the log-linear buckets into powers of two of microseconds.
    let mut pow: Vec<(u64, u64)> = Vec::new();
    for &(hi, c) in buckets {
        // Powers of two of whole microseconds: 1-2 us, 2-4 us, ...
        let top = (hi.saturating_sub(1) / 1000 + 1).next_power_of_two() * 1000;
        match pow.last_mut() {
            Some((t, n)) if *t == top => *n += c,
            _ => pow.push((top, c)),
        }
    }
    let max = pow.iter().map(|p| p.1).max().unwrap_or(1).max(1);
    let mut out = String::new();
    for (top, c) in pow {
        let width = ((c as f64 / max as f64) * 40.0).ceil() as usize;
        let _ = writeln!(
            out,
            "  {:>9} .. {:<9} {:<40} {c}",
            duration_text(if top <= 1000 { 0 } else { top / 2 }),
            duration_text(top),
            "#".repeat(width)
        );
    }
    out
}

/// The canvas of [`svg`], px.
const SVG_W: f64 = 1000.0;
const SVG_H: f64 = 520.0;
/// The margins around [`svg`]'s plot area (the legend is on the right), px.
const SVG_LEFT: f64 = 70.0;
/// Room for the legend: 38 px of stroke and gap, then about 48 characters
/// of 12 px text (`umount2 propagation (n=1000000, p99=1.23s)`).
const SVG_RIGHT: f64 = 340.0;
const SVG_TOP: f64 = 40.0;
const SVG_BOTTOM: f64 = 60.0;
/// The curves' colours, in turn.
const SVG_COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// An SVG plot of the latency distributions: one cumulative curve per
/// (syscall, fstype) on a logarithmic time axis.
pub fn svg(rows: &[ProfileRow]) -> String {
    let plot = Plot::around(rows);
    let mut s = String::new();
    plot.header(&mut s);
    plot.grid(&mut s);
    for (i, r) in rows.iter().enumerate() {
        let color = SVG_COLORS[i % SVG_COLORS.len()];
        let total: u64 = r.buckets.iter().map(|b| b.1).sum();
        if total == 0 {
            continue;
        }
        plot.curve(&mut s, r, total, color);
        plot.legend(&mut s, i, r, color);
    }
    s.push_str("</svg>\n");
    s
}

/// The plot area of [`svg`]: latency on a logarithmic axis over whole
/// decades `d0..=d1` (log10 of ns), the cumulative share of calls upwards.
struct Plot {
    /// The first decade.
    d0: f64,
    /// The last decade.
    d1: f64,
    /// Width of the plot area, px.
    pw: f64,
    /// Height of the plot area, px.
    ph: f64,
}

impl Plot {
    /// Whole decades around the data of `rows`.
    fn around(rows: &[ProfileRow]) -> Self {
        let lo = rows
            .iter()
            .filter_map(|r| r.buckets.first().map(|b| b.0))
            .min()
            .unwrap_or(1000);
        let hi = rows
            .iter()
            .filter_map(|r| r.buckets.last().map(|b| b.0))
            .max()
            .unwrap_or(1_000_000);
        let d0 = ((lo.max(1) as f64).log10().floor() - 1.0).max(1.0);
        let d1 = (hi.max(10) as f64).log10().ceil().max(d0 + 1.0);
        Self {
            d0,
            d1,
            pw: SVG_W - SVG_LEFT - SVG_RIGHT,
            ph: SVG_H - SVG_TOP - SVG_BOTTOM,
        }
    }

    /// The x coordinate of a latency in ns.
    fn x(&self, ns: f64) -> f64 {
        SVG_LEFT + (ns.max(1.0).log10() - self.d0) / (self.d1 - self.d0) * self.pw
    }

    /// The y coordinate of a share of calls (0 to 1).
    fn y(&self, frac: f64) -> f64 {
        SVG_TOP + (1.0 - frac) * self.ph
    }

    /// The opening tag, the background and the title.
    fn header(&self, s: &mut String) {
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{SVG_H}" viewBox="0 0 {SVG_W} {SVG_H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r#"<rect width="{SVG_W}" height="{SVG_H}" fill="white"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{SVG_LEFT}" y="24" font-size="15">Mount syscall latency (cumulative share of calls)</text>"#
        );
    }

    /// The grid lines with their labels (a decade apart across, at chosen
    /// shares up), the frame and the axis label.
    fn grid(&self, s: &mut String) {
        let (pw, ph) = (self.pw, self.ph);
        let mut d = self.d0;
        while d <= self.d1 + 1e-9 {
            let px = self.x(10f64.powf(d));
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" y1="{SVG_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                SVG_TOP + ph,
                SVG_TOP + ph + 18.0,
                duration_text(10f64.powf(d) as u64)
            );
            d += 1.0;
        }
        for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
            let py = self.y(q);
            let _ = write!(
                s,
                r##"<line x1="{SVG_LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/>"##,
                SVG_LEFT + pw,
            );
            // 99 % lies 1 % of the height under 100 %: where that is less
            // than a line of text its label would overlap 100 %'s, so its
            // line stays unlabelled.
            if q == 0.99 && self.y(0.99) - self.y(1.0) < 12.0 {
                s.push('\n');
                continue;
            }
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
                SVG_LEFT - 6.0,
                py + 4.0,
                q * 100.0
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{SVG_LEFT}" y="{SVG_TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (log scale)</text>"#,
            SVG_LEFT + pw / 2.0,
            SVG_H - 16.0
        );
    }

    /// The cumulative curve of `r` (`total` calls): a step curve, flat until
    /// a bucket's upper bound, then up by its share.
    fn curve(&self, s: &mut String, r: &ProfileRow, total: u64, color: &str) {
        let point = |ns: f64, cum: u64| {
            format!("{:.1},{:.1}", self.x(ns), self.y(cum as f64 / total as f64))
        };
        let mut pts = Vec::new();
        let mut cum = 0u64;
        let first_lo = r.buckets.first().map_or(1.0, |b| b.0 as f64 / 1.25);
        pts.push(format!("{:.1},{:.1}", self.x(first_lo), self.y(0.0)));
        for &(b_hi, c) in &r.buckets {
            pts.push(point(b_hi as f64, cum));
            cum += c;
            pts.push(point(b_hi as f64, cum));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
    }

    /// The legend entry of `r`, the `i`th row: a stroke of its colour and
    /// its counts.
    fn legend(&self, s: &mut String, i: usize, r: &ProfileRow, color: &str) {
        let pw = self.pw;
        let ly = SVG_TOP + 16.0 + 18.0 * i as f64;
        let label = format!(
            "{} {} (n={}, p99={})",
            r.syscall,
            r.fstype,
            r.count,
            duration_text(r.p99_ns)
        );
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            SVG_LEFT + pw + 12.0,
            SVG_LEFT + pw + 32.0,
            SVG_LEFT + pw + 38.0,
            ly + 4.0,
            xml_escape(&label)
        );
    }
}

/// Text for the SVG: markup escaped, what XML forbids replaced (an fstype
/// is any string a caller of `mount()` passes).
fn xml_escape(s: &str) -> String {
    crate::util::escape::xml_text(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        assert_eq!(duration_text(850), "850ns");
        assert_eq!(duration_text(12_345), "12.3us");
        assert_eq!(clock_text(3_723_000_001_000), "01:02:03.000001");
        let row = ProfileRow {
            syscall: "mount".into(),
            fstype: "tmpfs".into(),
            count: 3,
            errors: 1,
            p50_ns: 5000,
            p90_ns: 9000,
            p99_ns: 9000,
            p999_ns: 9000,
            max_ns: 9000,
            buckets: vec![(5000, 2), (10000, 1)],
        };
        let svg = svg(std::slice::from_ref(&row));
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("<polyline"));
        assert!(svg.contains("mount tmpfs (n=3"));
        // An fstype XML does not allow: replaced, the document stays valid.
        let odd = ProfileRow {
            fstype: "fuse.\u{fffe}<x>\u{1b}".into(),
            ..row.clone()
        };
        let svg_odd = super::svg(std::slice::from_ref(&odd));
        assert!(
            svg_odd.contains("mount fuse.\u{fffd}&lt;x&gt;\u{fffd} (n=3"),
            "{svg_odd}"
        );
        assert!(!svg_odd.contains('\u{fffe}') && !svg_odd.contains('\u{1b}'));
        let h = text_histogram(&row.buckets);
        assert_eq!(h.lines().count(), 2, "{h}");
    }

    /// The legend was clipped at the right edge (230 px for labels of up to
    /// 300 px) and the 99 % axis label overlapped 100 %'s.
    #[test]
    fn svg_legend_fits_and_axis_labels_do_not_overlap() {
        let row = ProfileRow {
            syscall: "umount2".into(),
            fstype: "propagation".into(),
            count: 1_000_000,
            errors: 0,
            p50_ns: 5000,
            p90_ns: 9000,
            p99_ns: 1_230_000_000,
            p999_ns: 1_230_000_000,
            max_ns: 1_230_000_000,
            buckets: vec![(5000, 2), (1_230_000_000, 1)],
        };
        let svg = svg(std::slice::from_ref(&row));
        let label = "umount2 propagation (n=1000000, p99=1.23s)";
        assert!(svg.contains(label), "{svg}");
        // 12 px sans-serif: at most 7 px a character.
        let x = SVG_W - SVG_RIGHT + 38.0;
        assert!(x + 7.0 * label.len() as f64 <= SVG_W, "legend clipped: {x}");
        assert!(svg.contains(">100%<") && svg.contains(">90%<"));
        assert!(!svg.contains(">99%<"), "99 % overlaps 100 %");
    }
}
