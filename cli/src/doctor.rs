//! `volmgr doctor`: the node's report (observe mode's findings, the calls
//! stuck now) and, with `--pod NS/NAME`, a pod's volumes' syscall timelines (every
//! mount-family call any process made on their paths, traced with eBPF,
//! see `volmgr::tracer::timeline`) and the calls on them stuck now; as
//! text, JSON, or an SVG drawing (`--svg FILE`, hand-written, no
//! dependency: [`crate::timeline_text`], [`crate::timeline_svg`]). The
//! agent answers the `timeline` request of its status socket
//! ([`volmgr::volumemanager::VolumeManager::pod_timeline`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use volmgr::status::Status;
use volmgr::tracer::timeline::PodTimeline;

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
        crate::stuck_text::stuck_text(&mut out, &s.stuck_syscalls);
        crate::stuck_text::stuck_tools_text(&mut out, &s.stuck_tools);
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
        print!("{}", crate::timeline_text::text(&t));
    }
    if let Some(file) = &args.svg {
        // A new file renamed over FILE: a symlink or hard link planted
        // there is replaced, never written through.
        volmgr::util::output::replace_file(file, crate::timeline_svg::svg(&t).as_bytes())
            .with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(if t.stuck.is_empty() && t.stuck_tools.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
