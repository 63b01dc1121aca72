//! `volmgr doctor --pod --svg FILE`: a pod's volumes' timelines drawn, a
//! row per volume, a bar per call.

use std::fmt::Write as _;

use volmgr::tracer::timeline::PodTimeline;

use crate::timeline_text::{ms, volume_title};

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
