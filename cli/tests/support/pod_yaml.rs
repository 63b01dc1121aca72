//! Pod manifests for the tests on a real API server: one container `c`
//! (busybox) mounting each volume, built up volume by volume, so that every
//! test's pod says only what is its own.

use std::fmt::Write as _;

/// A pod in namespace `default` bound to a node (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct PodYaml {
    name: String,
    node: String,
    labels: bool,
    spec_extra: String,
    /// (name, mount path, source as a YAML flow mapping's content).
    volumes: Vec<(String, String, String)>,
}

impl PodYaml {
    /// Pod `name` on node `node`, no volume yet.
    pub fn new(name: &str, node: &str) -> Self {
        Self {
            name: name.to_string(),
            node: node.to_string(),
            labels: false,
            spec_extra: String::new(),
            volumes: Vec::new(),
        }
    }

    /// With the label `app: <name>` (what a downwardAPI volume shows).
    pub fn labelled(mut self) -> Self {
        self.labels = true;
        self
    }

    /// With `extra` (a line of YAML) in its spec.
    pub fn spec(mut self, extra: &str) -> Self {
        self.spec_extra = extra.to_string();
        self
    }

    /// With volume `name` of `source` (e.g. `emptyDir: {}`) mounted at
    /// `mount_path`.
    pub fn volume(mut self, name: &str, mount_path: &str, source: &str) -> Self {
        self.volumes
            .push((name.into(), mount_path.into(), source.into()));
        self
    }

    /// With volume `name` of the claim `claim`, mounted at `/<name>`.
    pub fn claim(self, name: &str, claim: &str) -> Self {
        let path = format!("/{name}");
        self.volume(
            name,
            &path,
            &format!("persistentVolumeClaim: {{claimName: {claim}}}"),
        )
    }

    /// With the volumes every kind of node mounts without a driver or a
    /// claim: emptyDir (disk, and Memory of 16Mi), the configMap
    /// `settings`, the Secret `creds`, a downwardAPI of the labels, and a
    /// projected service account token with the cluster's root CA
    /// (`kube-root-ca.crt`).
    pub fn with_payload_volumes(self) -> Self {
        self.labelled()
            .volume("scratch", "/scratch", "emptyDir: {}")
            .volume("cache", "/cache", "emptyDir: {medium: Memory, sizeLimit: 16Mi}")
            .volume("settings", "/settings", "configMap: {name: settings}")
            .volume("creds", "/creds", "secret: {secretName: creds}")
            .volume(
                "info",
                "/info",
                "downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}",
            )
            .volume(
                "token",
                "/var/run/secrets/kubernetes.io/serviceaccount",
                "projected: {sources: [{serviceAccountToken: {path: token, expirationSeconds: 3607}}, \
                 {configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}}]}",
            )
    }

    /// The manifest.
    pub fn build(&self) -> String {
        let labels = if self.labels {
            format!(", labels: {{app: {}}}", self.name)
        } else {
            String::new()
        };
        let mut y = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: default{labels}}}\nspec:\n  nodeName: {}\n",
            self.name, self.node
        );
        if !self.spec_extra.is_empty() {
            let _ = writeln!(y, "  {}", self.spec_extra);
        }
        y.push_str("  containers:\n  - name: c\n    image: busybox\n    volumeMounts:");
        if self.volumes.is_empty() {
            y.push_str(" []");
        }
        for (name, path, _) in &self.volumes {
            let _ = write!(y, "\n    - {{name: {name}, mountPath: {path}}}");
        }
        y.push_str("\n  volumes:");
        if self.volumes.is_empty() {
            y.push_str(" []");
        }
        for (name, _, source) in &self.volumes {
            let _ = write!(y, "\n  - {{name: {name}, {source}}}");
        }
        y.push('\n');
        y
    }
}
