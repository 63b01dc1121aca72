//! A real control plane for end-to-end tests: etcd and `kube-apiserver`
//! built from their Go modules (`scripts/kube-binaries.sh`, cached under
//! `$HOME`), started as child processes of the test on loopback ports, with
//! real certificates, `--authorization-mode=Node,RBAC`,
//! `--enable-admission-plugins=NodeRestriction`, service account signing
//! keys and an audit log at `Metadata` level that tests read
//! ([`RealApiServer::audit`]).
//!
//! Nothing here is a fake: what the server refuses, it refuses as on a
//! cluster. The server has no controller-manager or scheduler: pods are
//! created with `spec.nodeName`, claims are bound by patching both sides'
//! `status.phase`, and the `default` ServiceAccount and the
//! `kube-root-ca.crt` ConfigMap of a namespace are created by
//! [`RealApiServer::namespace`].

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::Value;

/// Set by `scripts/test.sh`: the directory holding `kube-apiserver`,
/// `kubelet`, `kubectl`, `etcd` and `fake-cri`.
pub const BIN_ENV: &str = "VOLMGR_KUBE_BIN";

/// The directory of the real Kubernetes binaries: [`BIN_ENV`], or what
/// `scripts/kube-binaries.sh` builds (or finds cached). `None`, with the
/// reason printed, where Go is missing outside CI; under CI (`CI` set)
/// a missing toolchain fails the test instead of skipping it.
pub fn kube_binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kube-binaries.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()));
    let reason = match out {
        Ok(o) if o.status.success() => {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            return Some(PathBuf::from(dir));
        }
        Ok(o) => format!("{} failed ({})", script.display(), o.status),
        Err(e) => e,
    };
    if std::env::var_os("CI").is_some() {
        panic!("the real Kubernetes binaries are needed in CI: {reason}");
    }
    eprintln!("SKIP: no real kube-apiserver ({reason}; Go and the module proxy build it)");
    None
}

/// A free TCP port on 127.0.0.1 for a server started right after (etcd,
/// kube-apiserver, the kubelet), taken below the kernel's ephemeral range:
/// a port there is never handed to a `bind(:0)` of another test (the
/// agent's metrics, fake servers) nor to an outgoing connection between
/// this check and the server's own bind. Seen in CI: a kube-apiserver's
/// port taken meanwhile by a plain-HTTP listener ("server gave HTTP
/// response to HTTPS client"). Tried from a start spread by the process id
/// (tests run as parallel processes), each checked by a bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOW).max(1);
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span.min(4_096) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A certificate authority that signs the serving and client certificates.
pub struct Ca {
    key: KeyPair,
    cert: rcgen::Certificate,
}

impl Ca {
    /// A new self-signed CA whose common name is `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Self { key, cert }
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A client certificate for `user` in `groups`: (certificate, key) PEM.
    pub fn client(&self, user: &str, groups: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A serving certificate for 127.0.0.1 and `localhost`.
    fn server(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// One request as the audit log recorded it (stage `ResponseComplete`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    /// `user.username` (`system:node:n1`).
    pub user: String,
    /// `verb` (`get`, `list`, `watch`, `create`, `patch`, ...).
    pub verb: String,
    /// `objectRef.resource` (`persistentvolumeclaims`), with
    /// `/subresource` where there is one; empty for non-resource URLs.
    pub resource: String,
    /// `objectRef.name`, where the request named one.
    pub name: String,
    /// `responseStatus.code`.
    pub code: u16,
    /// `requestURI`.
    pub uri: String,
    /// `userAgent`.
    pub user_agent: String,
}

/// etcd and kube-apiserver, stopped (by pid) when dropped.
pub struct RealApiServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    etcd: Child,
    apiserver: Child,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The cluster CA (it signs the serving and the client certificates).
    pub ca: Ca,
}

impl RealApiServer {
    /// Starts etcd and kube-apiserver and waits until the server is ready;
    /// `None` (with the reason printed) where the binaries cannot be had
    /// outside CI.
    pub fn start() -> Option<Self> {
        let bin = kube_binaries()?;
        Some(Self::start_with(&bin, &[]))
    }

    /// [`Self::start`] with more `kube-apiserver` flags.
    pub fn start_with(bin: &Path, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("volmgr-real-apiserver")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let ca = Ca::new("volmgr-test-ca");
        write_keys(d, &ca);
        let (etcd, etcd_url) = start_etcd(bin, d);
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut cmd = Command::new(bin.join("kube-apiserver"));
        cmd.arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!(
                "--tls-cert-file={}",
                d.join("serving.crt").display()
            ))
            .arg(format!(
                "--tls-private-key-file={}",
                d.join("serving.key").display()
            ))
            .arg(format!("--client-ca-file={}", d.join("ca.crt").display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                d.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg(format!(
                "--audit-log-path={}",
                d.join("audit.log").display()
            ))
            .arg(format!(
                "--audit-policy-file={}",
                d.join("audit-policy.yaml").display()
            ))
            .arg("--audit-log-mode=blocking")
            .arg("--audit-log-maxsize=0")
            .arg("--endpoint-reconciler-type=none")
            // As on real clusters: manager mode's DaemonSet is privileged.
            .arg("--allow-privileged=true")
            .arg("--v=1")
            .args(extra);
        let apiserver = spawn(&mut cmd, &d.join("kube-apiserver.log"));
        let server = Self {
            dir,
            bin: bin.to_path_buf(),
            etcd,
            apiserver,
            url,
            ca,
        };
        server.write_kubeconfig("admin", "admin", &["system:masters"]);
        server.wait_ready();
        server
    }

    /// The test's directory (certificates, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of the real binaries.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The cluster admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir().join("admin.kubeconfig")
    }

    /// A kubeconfig with the node's own credentials, as the kubelet's: a
    /// client certificate for `system:node:<node>` in `system:nodes`.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let file = format!("node-{node}");
        let path = self.dir().join(format!("{file}.kubeconfig"));
        if !path.exists() {
            self.write_kubeconfig(&file, &format!("system:node:{node}"), &["system:nodes"]);
        }
        path
    }

    /// A kubeconfig `name.kubeconfig` for `user` in `groups`; its path.
    pub fn write_kubeconfig(&self, name: &str, user: &str, groups: &[&str]) -> PathBuf {
        let d = self.dir();
        let (cert, key) = self.ca.client(user, groups);
        let cert_file = d.join(format!("{name}.crt"));
        let key_file = d.join(format!("{name}.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        let path = d.join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: {name}\ncurrent-context: real\n",
                self.url,
                d.join("ca.crt").display(),
                cert_file.display(),
                key_file.display()
            ),
        )
        .unwrap();
        path
    }

    /// `kubectl` as the cluster admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.arg(format!(
            "--kubeconfig={}",
            self.admin_kubeconfig().display()
        ));
        cmd
    }

    /// Runs `kubectl ARGS` as the admin with `stdin`; its stdout, or a
    /// panic with stderr.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut cmd = self.kubectl();
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply --server-side -f -` of `manifest` (YAML or JSON), as
    /// the admin.
    pub fn apply(&self, manifest: &str) {
        self.kubectl_ok(
            &[
                "apply",
                "--server-side",
                "--field-manager=volmgr-test",
                "--force-conflicts",
                "-f",
                "-",
            ],
            Some(manifest),
        );
    }

    /// Creates namespace `ns` with what the controllers this server lacks
    /// would add: the `default` ServiceAccount and the `kube-root-ca.crt`
    /// ConfigMap (projected into every service account token volume).
    pub fn namespace(&self, ns: &str) {
        let ca = serde_json::to_string(&self.ca.pem()).unwrap();
        let mut docs = Vec::new();
        if ns != "default" {
            docs.push(format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"{ns}\"}}}}"
            ));
        }
        docs.push(format!("{{\"apiVersion\":\"v1\",\"kind\":\"ServiceAccount\",\"metadata\":{{\"name\":\"default\",\"namespace\":\"{ns}\"}}}}"));
        docs.push(format!("{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"kube-root-ca.crt\",\"namespace\":\"{ns}\"}},\"data\":{{\"ca.crt\":{ca}}}}}"));
        for d in docs {
            self.apply(&d);
        }
    }

    /// Binds claim `ns/claim` to volume `pv` as the PV controller would:
    /// both sides' references set, then both `status.phase` `Bound`.
    pub fn bind(&self, ns: &str, claim: &str, pv: &str) {
        let uid = self.kubectl_ok(
            &[
                "get",
                "pvc",
                "-n",
                ns,
                claim,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        );
        self.kubectl_ok(
            &[
                "patch",
                "pv",
                pv,
                "--type=merge",
                "-p",
                &format!(
                    "{{\"spec\":{{\"claimRef\":{{\"namespace\":\"{ns}\",\"name\":\"{claim}\",\"uid\":\"{uid}\"}}}}}}"
                ),
            ],
            None,
        );
        self.kubectl_ok(
            &[
                "patch",
                "pvc",
                "-n",
                ns,
                claim,
                "--type=merge",
                "-p",
                &format!("{{\"spec\":{{\"volumeName\":\"{pv}\"}}}}"),
            ],
            None,
        );
        self.kubectl_ok(
            &[
                "patch",
                "pv",
                pv,
                "--subresource=status",
                "--type=merge",
                "-p",
                "{\"status\":{\"phase\":\"Bound\"}}",
            ],
            None,
        );
        self.kubectl_ok(
            &[
                "patch",
                "pvc",
                "-n",
                ns,
                claim,
                "--subresource=status",
                "--type=merge",
                "-p",
                "{\"status\":{\"phase\":\"Bound\",\"accessModes\":[\"ReadWriteOnce\"],\"capacity\":{\"storage\":\"1Gi\"}}}",
            ],
            None,
        );
    }

    /// Every completed request in the audit log so far.
    pub fn audit(&self) -> Vec<Audited> {
        let Ok(f) = std::fs::File::open(self.dir().join("audit.log")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for line in BufReader::new(f).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["stage"] != "ResponseComplete" && v["stage"] != "Panic" {
                continue;
            }
            let s = |p: &Value| p.as_str().unwrap_or_default().to_string();
            let mut resource = s(&v["objectRef"]["resource"]);
            if let Some(sub) = v["objectRef"]["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            out.push(Audited {
                user: s(&v["user"]["username"]),
                verb: s(&v["verb"]),
                resource,
                name: s(&v["objectRef"]["name"]),
                code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                uri: s(&v["requestURI"]),
                user_agent: s(&v["userAgent"]),
            });
        }
        out
    }

    /// The requests by `user` that the server refused with 403.
    pub fn forbidden(&self, user: &str) -> Vec<Audited> {
        self.audit()
            .into_iter()
            .filter(|a| a.user == user && a.code == 403)
            .collect()
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("kube-apiserver.log")).unwrap_or_default()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self
                .kubectl()
                .args(["get", "--raw=/readyz"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            if out.status.success() {
                // The bootstrap RBAC policy (system:node-proxier, the
                // node's rules) is in place once readyz says so.
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "kube-apiserver not ready in 120 s: {}\n--- log tail\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    tail(&self.log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes the CA, the serving certificate and key, the service account
/// key pair and the audit policy into `d`.
fn write_keys(d: &Path, ca: &Ca) {
    std::fs::write(d.join("ca.crt"), ca.pem()).unwrap();
    let (cert, key) = ca.server();
    std::fs::write(d.join("serving.crt"), cert).unwrap();
    std::fs::write(d.join("serving.key"), key).unwrap();
    let sa = KeyPair::generate().unwrap();
    std::fs::write(d.join("sa.key"), sa.serialize_pem()).unwrap();
    std::fs::write(d.join("sa.pub"), sa.public_key_pem()).unwrap();
    std::fs::write(
        d.join("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .unwrap();
}

/// Starts etcd with its data in `d/etcd` on loopback ports; the process
/// and its client URL.
fn start_etcd(bin: &Path, d: &Path) -> (Child, String) {
    let (etcd_port, peer_port) = (free_port(), free_port());
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd = spawn(
        Command::new(bin.join("etcd"))
            .arg(format!("--data-dir={}", d.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            .arg("--log-level=warn")
            .arg("--quota-backend-bytes=1073741824"),
        &d.join("etcd.log"),
    );
    (etcd, etcd_url)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Starts `cmd` with its output in `log`, killed if the test process dies
/// first (`PR_SET_PDEATHSIG`).
pub(crate) fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()))
}

/// Socket address of a URL `https://127.0.0.1:PORT`.
pub fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("https://").parse().unwrap()
}
