//! The Prometheus text exposition format (version 0.0.4): one writer for
//! every `/metrics` renderer, so headers, label escaping and histogram series
//! are written the same way everywhere.
//!
//! Numbers are written with Rust's `Display` (`0.1`, `1`, `0.000005`,
//! `2.80005`), which is what the exposition has always shown.

use std::collections::BTreeSet;
use std::fmt::{Display, Write};

/// The type of a metric family, as written on its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// A monotonically increasing count.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Cumulative buckets with `_bucket`, `_sum` and `_count` series.
    Histogram,
}

impl MetricType {
    /// The name on the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// A Prometheus text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    /// Families whose `# HELP`/`# TYPE` lines are written.
    families: BTreeSet<String>,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes the `# HELP` and `# TYPE` lines of family `name`, once: later
    /// calls for the same family write nothing.
    pub fn family(&mut self, name: &str, help: &str, kind: MetricType) {
        if !self.families.insert(name.to_string()) {
            return;
        }
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample: `name{label="value",...} value` (no braces without
    /// labels). Labels are written in the order given, values escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.series(name, "", labels, None, value);
    }

    /// The series of one histogram: a `_bucket` line per `(le, count)` of
    /// `buckets` (upper bounds in increasing order, counts cumulative: the
    /// samples at or below `le`), then `le="+Inf"` with `count`, `_sum` and
    /// `_count`. `le` is the last label.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: impl IntoIterator<Item = (f64, u64)>,
        count: u64,
        sum: f64,
    ) {
        for (le, n) in buckets {
            self.series(name, "_bucket", labels, Some(&le.to_string()), n);
        }
        self.series(name, "_bucket", labels, Some("+Inf"), count);
        self.series(name, "_sum", labels, None, sum);
        self.series(name, "_count", labels, None, count);
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }

    fn series(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        le: Option<&str>,
        value: impl Display,
    ) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        let le = le.map(|v| ("le", v));
        let mut all = labels.iter().copied().chain(le).peekable();
        if all.peek().is_some() {
            self.out.push('{');
            for (i, (label, v)) in all.enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(label);
                self.out.push_str("=\"");
                push_escaped(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Appends a label value escaped as the format requires: `\` as `\\`, `"`
/// as `\"`, a newline as `\n`.
fn push_escaped(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_once_per_family() {
        let mut w = Exposition::new();
        w.family("a_total", "Things.", MetricType::Counter);
        w.sample("a_total", &[("k", "x")], 1);
        w.family("a_total", "Things.", MetricType::Counter);
        w.sample("a_total", &[("k", "y")], 2);
        w.family("b", "Level.", MetricType::Gauge);
        w.sample("b", &[], 0.5);
        assert_eq!(
            w.finish(),
            concat!(
                "# HELP a_total Things.\n",
                "# TYPE a_total counter\n",
                "a_total{k=\"x\"} 1\n",
                "a_total{k=\"y\"} 2\n",
                "# HELP b Level.\n",
                "# TYPE b gauge\n",
                "b 0.5\n",
            )
        );
    }

    #[test]
    fn a_family_without_samples_keeps_its_headers() {
        let mut w = Exposition::new();
        w.family("h", "Latency.", MetricType::Histogram);
        assert_eq!(w.finish(), "# HELP h Latency.\n# TYPE h histogram\n");
    }

    #[test]
    fn escapes_label_values_and_help() {
        let mut w = Exposition::new();
        w.family(
            "m",
            "Back\\slash and\nnewline, \"quotes\" kept.",
            MetricType::Gauge,
        );
        w.sample("m", &[("path", "a\"b\\c\nd"), ("plain", "x")], 3);
        assert_eq!(
            w.finish(),
            concat!(
                "# HELP m Back\\\\slash and\\nnewline, \"quotes\" kept.\n",
                "# TYPE m gauge\n",
                "m{path=\"a\\\"b\\\\c\\nd\",plain=\"x\"} 3\n",
            )
        );
    }

    #[test]
    fn writes_histogram_series() {
        let mut w = Exposition::new();
        w.family("d_seconds", "Duration.", MetricType::Histogram);
        let buckets = [(0.000005, 1), (0.1, 2), (1.0, 2), (2.5, 3)];
        w.histogram(
            "d_seconds",
            &[("op", "m\"x"), ("ok", "true")],
            buckets,
            4,
            2.80005,
        );
        w.histogram("d_seconds", &[], [(10.0, 0)], 0, 0.0);
        assert_eq!(
            w.finish(),
            concat!(
                "# HELP d_seconds Duration.\n",
                "# TYPE d_seconds histogram\n",
                "d_seconds_bucket{op=\"m\\\"x\",ok=\"true\",le=\"0.000005\"} 1\n",
                "d_seconds_bucket{op=\"m\\\"x\",ok=\"true\",le=\"0.1\"} 2\n",
                "d_seconds_bucket{op=\"m\\\"x\",ok=\"true\",le=\"1\"} 2\n",
                "d_seconds_bucket{op=\"m\\\"x\",ok=\"true\",le=\"2.5\"} 3\n",
                "d_seconds_bucket{op=\"m\\\"x\",ok=\"true\",le=\"+Inf\"} 4\n",
                "d_seconds_sum{op=\"m\\\"x\",ok=\"true\"} 2.80005\n",
                "d_seconds_count{op=\"m\\\"x\",ok=\"true\"} 4\n",
                "d_seconds_bucket{le=\"10\"} 0\n",
                "d_seconds_bucket{le=\"+Inf\"} 0\n",
                "d_seconds_sum 0\n",
                "d_seconds_count 0\n",
            )
        );
    }
}
