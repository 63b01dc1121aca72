//! The golden table: csi-translation-lib's own test cases (v0.37.2,
//! `plugins/*_test.go`), their inputs and expected translated fields.

use serde_json::{json, Value};

use super::*;

/// One case: a PersistentVolume (`pv`) or an inline volume (`inline`, in
/// namespace `ns`), and the expected `spec.csi` and `spec.accessModes` of
/// the translated PersistentVolume (`None`: an error).
struct Case {
    name: &'static str,
    input: Input,
    want: Option<(Value, Value)>,
}

enum Input {
    Pv(Value),
    Inline(Value, &'static str),
}

fn run(c: &Case) -> Option<Result<Migrated, TranslateError>> {
    match &c.input {
        Input::Pv(v) => translate_pv(&serde_json::from_value(v.clone()).expect(c.name)),
        Input::Inline(v, ns) => {
            translate_inline(&serde_json::from_value(v.clone()).expect(c.name), ns)
        }
    }
}

fn check(cases: &[Case]) {
    for c in cases {
        let got = run(c).unwrap_or_else(|| panic!("{}: not recognised as migratable", c.name));
        match (&c.want, got) {
            (None, Err(_)) => {}
            (None, Ok(m)) => panic!("{}: expected an error, got {m:?}", c.name),
            (Some(_), Err(e)) => panic!("{}: unexpected error {e}", c.name),
            (Some((csi, modes)), Ok(m)) => {
                assert_eq!(&serde_json::to_value(&m.csi).unwrap(), csi, "{}", c.name);
                assert_eq!(
                    &serde_json::to_value(&m.access_modes).unwrap(),
                    modes,
                    "{}",
                    c.name
                );
            }
        }
    }
}

fn pv(spec: Value) -> Input {
    Input::Pv(json!({"metadata": {}, "spec": spec}))
}

const VOL: &str = "vol-02399794d890f9375";

/// `TestKubernetesVolumeIDToEBSVolumeID`, `TestTranslateInTreeInlineVolumeToCSI` (aws_ebs).
#[test]
fn aws_ebs() {
    for (id, want) in [
        (VOL, Some(VOL)),
        ("aws:///vol-02399794d890f9375", Some(VOL)),
        ("aws://us-west-2a/vol-02399794d890f9375", Some(VOL)),
        ("aws://us-west-2a/02399794d890f9375", None),
    ] {
        assert_eq!(ebs_volume_id(id).ok().as_deref(), want, "{id}");
    }
    let inline = |id: &str| {
        Input::Inline(
            json!({"name": "volume", "awsElasticBlockStore": {"volumeID": id}}),
            "",
        )
    };
    let ok = Some((
        json!({"driver": "ebs.csi.aws.com", "volumeHandle": VOL, "volumeAttributes": {"partition": "0"}}),
        json!(["ReadWriteOnce"]),
    ));
    check(&[
        Case {
            name: "Normal ID format",
            input: inline(VOL),
            want: ok.clone(),
        },
        Case {
            name: "aws:///{volumeId} format",
            input: inline("aws:///vol-02399794d890f9375"),
            want: ok.clone(),
        },
        Case {
            name: "aws://{zone}/{volumeId} format",
            input: inline("aws://us-west-2a/vol-02399794d890f9375"),
            want: ok.clone(),
        },
        Case {
            name: "fails on invalid volume ID",
            input: inline("aws://us-west-2a/02399794d890f9375"),
            want: None,
        },
        Case {
            name: "PV: fsType, partition, readOnly, access modes kept",
            input: pv(
                json!({"accessModes": ["ReadWriteOnce"], "awsElasticBlockStore": {"volumeID": "aws://us-west-2a/vol-1", "fsType": "xfs", "partition": 2, "readOnly": true}}),
            ),
            want: Some((
                json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "xfs", "readOnly": true, "volumeAttributes": {"partition": "2"}}),
                json!(["ReadWriteOnce"]),
            )),
        },
    ]);
    assert!(
        translate_inline(
            &serde_json::from_value(json!({"name": "v", "emptyDir": {}})).unwrap(),
            ""
        )
        .is_none(),
        "fails on empty volume source"
    );
}

/// `TestTranslateAzureDiskInTreeInlineVolumeToCSI`, `TestTranslateAzureDiskInTreePVToCSI`.
#[test]
fn azure_disk() {
    let uri = "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";
    check(&[
        Case {
            name: "azure disk volume",
            input: Input::Inline(
                json!({"name": "", "azureDisk": {"diskName": "diskname", "diskURI": "datadiskuri"}}),
                "",
            ),
            want: Some((
                json!({"driver": "disk.csi.azure.com", "volumeHandle": "datadiskuri", "volumeAttributes": {"kind": "Managed"}}),
                json!(["ReadWriteOnce"]),
            )),
        },
        Case {
            name: "azure disk volume with non-managed kind",
            input: Input::Inline(
                json!({"name": "", "azureDisk": {"diskName": "diskname", "diskURI": "datadiskuri", "kind": "Dedicated"}}),
                "",
            ),
            want: None,
        },
        Case {
            name: "azure disk PV",
            input: pv(
                json!({"azureDisk": {"cachingMode": "cachingmode", "diskName": "", "diskURI": uri, "fsType": "fstype", "readOnly": true}}),
            ),
            want: Some((
                json!({"driver": "disk.csi.azure.com", "fsType": "fstype", "readOnly": true, "volumeHandle": uri,
                       "volumeAttributes": {"cachingmode": "cachingmode", "fstype": "fstype", "kind": "Managed"}}),
                Value::Null,
            )),
        },
        Case {
            name: "azure disk PV with non-managed kind",
            input: pv(
                json!({"azureDisk": {"cachingMode": "cachingmode", "diskName": "", "diskURI": uri, "fsType": "fstype", "readOnly": true, "kind": "Dedicated"}}),
            ),
            want: None,
        },
    ]);
}

/// `TestTranslateAzureFileInTreePVToCSI`, `TestGetStorageAccount`.
#[test]
fn azure_file() {
    let file_pv = |annotations: Value, ns: Option<&str>, claim_ns: Option<&str>| {
        let mut src =
            json!({"shareName": "sharename", "secretName": "secretname", "readOnly": true});
        if let Some(ns) = ns {
            src["secretNamespace"] = json!(ns);
        }
        let mut spec = json!({"azureFile": src});
        if let Some(ns) = claim_ns {
            spec["claimRef"] = json!({"namespace": ns});
        }
        Input::Pv(json!({"metadata": {"name": "uuid", "annotations": annotations}, "spec": spec}))
    };
    let want = |handle: &str| {
        Some((
            json!({"driver": "file.csi.azure.com", "readOnly": true,
                   "nodeStageSecretRef": {"name": "secretname", "namespace": "secretnamespace"},
                   "volumeAttributes": {"sharename": "sharename"}, "volumeHandle": handle}),
            Value::Null,
        ))
    };
    let rg = json!({"kubernetes.io/azure-file-resource-group": "rg"});
    check(&[
        Case {
            name: "return error if secret namespace could not be found",
            input: file_pv(rg.clone(), None, None),
            want: None,
        },
        Case {
            name: "azure file volume",
            input: file_pv(json!({}), Some("secretnamespace"), None),
            want: want("#secretname#sharename#uuid#secretnamespace"),
        },
        Case {
            name: "azure file volume with rg annotation",
            input: file_pv(rg.clone(), Some("secretnamespace"), None),
            want: want("rg#secretname#sharename#uuid#secretnamespace"),
        },
        Case {
            name: "get secret namespace from ClaimRef when it's missing in pv spec source",
            input: file_pv(rg, None, Some("secretnamespace")),
            want: want("rg#secretname#sharename#uuid#secretnamespace"),
        },
        Case {
            name: "inline: the pod's namespace, account from the secret name, RWX",
            input: Input::Inline(
                json!({"name": "vol", "azureFile": {"shareName": "share", "secretName": "azure-storage-account-acct-secret"}}),
                "ns1",
            ),
            want: Some((
                json!({"driver": "file.csi.azure.com", "volumeHandle": "#acct#share#vol#ns1", "volumeAttributes": {"sharename": "share"},
                       "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "ns1"}}),
                json!(["ReadWriteMany"]),
            )),
        },
    ]);
    assert_eq!(
        storage_account("azure-storage-account-accountname-secret"),
        "accountname"
    );
    assert_eq!(
        storage_account("azure-storage-account-accountname-secret-abc"),
        "accountname"
    );
    assert_eq!(
        storage_account("azure-storage-account--secret"),
        "azure-storage-account--secret"
    );
}

/// `TestBackwardCompatibleAccessModes`, `TestInlineReadOnly`,
/// `TestTranslateInTreePVToCSIVolIDFmt` (gce_pd).
#[test]
fn gce_pd() {
    for (modes_in, want) in [
        (vec!["ReadOnlyMany"], "ReadOnlyMany"),
        (vec!["ReadWriteOnce"], "ReadWriteOnce"),
        (vec!["ReadWriteMany"], "ReadWriteOnce"),
        (vec!["ReadOnlyMany", "ReadWriteOnce"], "ReadWriteOnce"),
        (vec!["ReadWriteOnce", "ReadWriteMany"], "ReadWriteOnce"),
        (vec!["ReadWriteMany", "ReadOnlyMany"], "ReadWriteOnce"),
        (
            vec!["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
            "ReadWriteOnce",
        ),
    ] {
        let m: Vec<String> = modes_in.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            backward_compatible_access_modes(Some(&m)),
            Some(vec![want.to_string()]),
            "{modes_in:?}"
        );
    }
    check(&[Case {
        name: "TestInlineReadOnly",
        input: Input::Inline(
            json!({"name": "", "gcePersistentDisk": {"pdName": "foo", "readOnly": true}}),
            "",
        ),
        want: Some((
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/foo", "readOnly": true, "volumeAttributes": {"partition": ""}}),
            json!(["ReadOnlyMany"]),
        )),
    }]);
    for (key, value, want) in [
        (
            "failure-domain.beta.kubernetes.io/zone",
            "us-east1-a",
            "projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name",
        ),
        (
            "topology.kubernetes.io/zone",
            "us-east1-a",
            "projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name",
        ),
        (
            "failure-domain.beta.kubernetes.io/zone",
            "us-central1-a__us-central1-c",
            "projects/UNSPECIFIED/regions/us-central1/disks/pd-name",
        ),
        (
            "topology.kubernetes.io/zone",
            "us-central1-a__us-central1-c",
            "projects/UNSPECIFIED/regions/us-central1/disks/pd-name",
        ),
    ] {
        let pv = json!({"metadata": {"labels": {key: value}}, "spec": {"gcePersistentDisk": {"pdName": "pd-name"}}});
        let m = translate_pv(&serde_json::from_value(pv).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(m.csi.volume_handle, want, "{key}={value}");
    }
}

/// Cinder (no PV/inline case in `openstack_cinder_test.go`; the fields
/// `openstack_cinder.go` sets).
#[test]
fn cinder() {
    check(&[Case {
        name: "cinder PV",
        input: pv(
            json!({"accessModes": ["ReadWriteOnce"], "cinder": {"volumeID": "id-1", "fsType": "ext4", "readOnly": true}}),
        ),
        want: Some((
            json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "id-1", "fsType": "ext4", "readOnly": true, "volumeAttributes": {}}),
            json!(["ReadWriteOnce"]),
        )),
    }]);
}

/// `TestTranslatePortworxInTreeInlineVolumeToCSI`, `TestTranslatePortworxInTreePVToCSI`.
#[test]
fn portworx() {
    let secret = json!({"name": "test-secret", "namespace": "test-namespace"});
    let px_pv = |annotations: Value| {
        Input::Pv(
            json!({"metadata": {"name": "pxd.portworx.com", "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteOnce"], "claimRef": {"name": "test-pvc", "namespace": "default"},
                     "portworxVolume": {"volumeID": "ID1111", "fsType": "type", "readOnly": false}}}),
        )
    };
    check(&[
        Case {
            name: "normal (inline)",
            input: Input::Inline(
                json!({"name": "PortworxVol", "portworxVolume": {"volumeID": "ID", "fsType": "type", "readOnly": false}}),
                "ns",
            ),
            want: Some((
                json!({"driver": "pxd.portworx.com", "volumeHandle": "ID", "fsType": "type", "volumeAttributes": {}}),
                json!(["ReadWriteOnce"]),
            )),
        },
        Case {
            name: "normal",
            input: px_pv(json!({})),
            want: Some((
                json!({"driver": "pxd.portworx.com", "volumeHandle": "ID1111", "fsType": "type", "volumeAttributes": {}}),
                json!(["ReadWriteOnce"]),
            )),
        },
        Case {
            name: "with secret annotations",
            input: px_pv(
                json!({"openstorage.io/auth-secret-name": "test-secret", "openstorage.io/auth-secret-namespace": "test-namespace"}),
            ),
            want: Some((
                json!({"driver": "pxd.portworx.com", "volumeHandle": "ID1111", "fsType": "type", "volumeAttributes": {},
                       "controllerPublishSecretRef": secret, "nodeStageSecretRef": secret, "nodePublishSecretRef": secret,
                       "controllerExpandSecretRef": secret, "nodeExpandSecretRef": secret}),
                json!(["ReadWriteOnce"]),
            )),
        },
    ]);
    let no_px = json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
    assert!(
        translate_pv(&serde_json::from_value(no_px).unwrap()).is_none(),
        "no Portworx volume"
    );
}

/// `TestTranslateVSphereInTreePVToCSI`, `TestTranslatevSphereInTreeInlineVolumeToCSI`.
#[test]
fn vsphere() {
    let path = "[vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-68734c9f-a679-42e6-a694-39632c51e31f.vmdk";
    let mut cases = vec![];
    for labels in [
        json!({}),
        json!({"failure-domain.beta.kubernetes.io/zone": "z1", "failure-domain.beta.kubernetes.io/region": "r1"}),
        json!({"topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1"}),
    ] {
        cases.push(Case {
            name: "translate valid vSphere in-tree PV to vSphere CSI PV",
            input: Input::Pv(json!({"metadata": {"labels": labels}, "spec": {"accessModes": ["ReadWriteOnce"],
                "vsphereVolume": {"volumePath": path, "fsType": "ext4", "storagePolicyName": "vSAN Default Storage Policy"}}})),
            want: Some((
                json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": path, "fsType": "ext4", "volumeAttributes": {"storagepolicyname": "vSAN Default Storage Policy"}}),
                json!(["ReadWriteOnce"]),
            )),
        });
    }
    cases.push(Case {
        name: "translate valid in-tree vsphere volume to vSphere CSI PV",
        input: Input::Inline(json!({"name": "", "vsphereVolume": {"volumePath": "[vsanDatastore] volume/inlinevolume.vmdk", "fsType": "ext4"}}), ""),
        want: Some((
            json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "[vsanDatastore] volume/inlinevolume.vmdk", "fsType": "ext4", "volumeAttributes": {}}),
            json!(["ReadWriteOnce"]),
        )),
    });
    check(&cases);
}

/// The translated PV's `spec.nodeAffinity` (JSON) for PV `pv`.
fn affinity_of(name: &str, pv: Value) -> Value {
    let pv = serde_json::from_value(pv).expect(name);
    let m = translate_pv(&pv)
        .unwrap_or_else(|| panic!("{name}: not migratable"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::to_value(&m.node_affinity).unwrap()
}

fn terms(exprs: &[Value]) -> Value {
    json!({"required": {"nodeSelectorTerms": exprs.iter().map(|e| json!({"matchExpressions": e})).collect::<Vec<_>>()}})
}

fn is_in(key: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": "In", "values": values})
}

const GA_ZONE: &str = "topology.kubernetes.io/zone";
const GA_REGION: &str = "topology.kubernetes.io/region";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";

/// `TestTranslateTopologyFromInTreeToCSI` (in_tree_volume_test.go), through
/// a GCE PD PV: its zone key becomes `topology.gke.io/zone`, a beta region
/// key the GA one; the PV's labels (GA) do not matter when the affinity
/// has the zone.
#[test]
fn translate_topology_from_in_tree_to_csi() {
    let gce = |affinity: Value| {
        json!({"metadata": {"name": "gcepd", "labels": {GA_ZONE: "us-east1-a", GA_REGION: "us-east1"}},
               "spec": {"gcePersistentDisk": {"pdName": "pd"}, "nodeAffinity": affinity}})
    };
    let gke = "topology.gke.io/zone";
    for (name, input, want) in [
        (
            "Replace GA Kubernetes Zone Topology to GCE CSI Topology",
            terms(&[json!([
                is_in(GA_ZONE, &["us-east1-a"]),
                is_in(GA_REGION, &["us-east1"])
            ])]),
            terms(&[json!([
                is_in(gke, &["us-east1-a"]),
                is_in(GA_REGION, &["us-east1"])
            ])]),
        ),
        (
            "Replace Beta Kubernetes Topology to GCE CSI Topology and upgrade region label",
            terms(&[json!([
                is_in(BETA_ZONE, &["us-west2-b"]),
                is_in(BETA_REGION, &["us-west2"])
            ])]),
            terms(&[json!([
                is_in(gke, &["us-west2-b"]),
                is_in(GA_REGION, &["us-west2"])
            ])]),
        ),
    ] {
        assert_eq!(affinity_of(name, gce(input)), want, "{name}");
    }
}

/// `TestAddTopology`, through an EBS PV without affinity whose zone label
/// (`__`-separated zones) is what csi-translation-lib hands `addTopology`:
/// zones trimmed, empties dropped, sorted; none left adds nothing.
#[test]
fn add_topology_from_the_zone_label() {
    let ebs = |zones: &str| {
        json!({"metadata": {"name": "ebs", "labels": {BETA_ZONE: zones}},
               "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}}})
    };
    let key = "topology.ebs.csi.aws.com/zone";
    for (name, label, want) in [
        ("empty zones", "", Value::Null),
        ("only whitespace-named zones", " __\n__\t__  ", Value::Null),
        (
            "including whitespace-named zones",
            " __us-central1-a",
            terms(&[json!([is_in(key, &["us-central1-a"])])]),
        ),
        (
            "unsorted zones",
            "us-central1-f__us-central1-a__us-central1-c__us-central1-b",
            terms(&[json!([is_in(
                key,
                &[
                    "us-central1-a",
                    "us-central1-b",
                    "us-central1-c",
                    "us-central1-f"
                ],
            )])]),
        ),
    ] {
        assert_eq!(affinity_of(name, ebs(label)), want, "{name}");
    }
}

/// `TestTranslateVSphereInTreePVToCSI` (its topology cases), the other
/// drivers' keys, a regional GCE disk, an affinity without a zone (the
/// label's zone added to every term), and the plugins whose PVs keep their
/// affinity.
#[test]
fn topology_per_driver() {
    let vs = |labels: Value| {
        json!({"metadata": {"name": "vs", "labels": labels},
               "spec": {"vsphereVolume": {"volumePath": "[vsanDatastore] pvc/disk.vmdk"}}})
    };
    let (vz, vr) = (
        "topology.csi.vmware.com/zone",
        "topology.csi.vmware.com/region",
    );
    let want = terms(&[json!([is_in(vz, &["z1"]), is_in(vr, &["r1"])])]);
    assert_eq!(
        affinity_of(
            "translate valid vSphere in-tree PV with beta topology labels to vSphere CSI PV",
            vs(json!({BETA_ZONE: "z1", BETA_REGION: "r1"}))
        ),
        want
    );
    assert_eq!(
        affinity_of(
            "translate valid vSphere in-tree PV with GA topology labels to vSphere CSI PV",
            vs(json!({GA_ZONE: "z1", GA_REGION: "r1"}))
        ),
        want
    );
    assert_eq!(
        affinity_of(
            "translate valid vSphere in-tree PV to vSphere CSI PV",
            vs(json!({}))
        ),
        Value::Null
    );
    let regional = json!({"metadata": {"name": "gce", "labels": {BETA_ZONE: "us-central1-c__us-central1-a"}},
        "spec": {"gcePersistentDisk": {"pdName": "pd"}}});
    assert_eq!(
        affinity_of("regional GCE PD", regional),
        terms(&[json!([is_in(
            "topology.gke.io/zone",
            &["us-central1-a", "us-central1-c"]
        )])])
    );
    let cinder = json!({"metadata": {"name": "c", "labels": {GA_ZONE: "nova"}},
        "spec": {"cinder": {"volumeID": "v"},
                 "nodeAffinity": terms(&[json!([is_in("kubernetes.io/hostname", &["a"])]), json!([is_in("kubernetes.io/hostname", &["b"])])])}});
    let key = "topology.cinder.csi.openstack.org/zone";
    assert_eq!(
        affinity_of("cinder: label zone added to every term", cinder),
        terms(&[
            json!([
                is_in("kubernetes.io/hostname", &["a"]),
                is_in(key, &["nova"])
            ]),
            json!([
                is_in("kubernetes.io/hostname", &["b"]),
                is_in(key, &["nova"])
            ]),
        ])
    );
    let kept = terms(&[json!([is_in(GA_ZONE, &["1"])])]);
    let azure = json!({"metadata": {"name": "az", "labels": {GA_ZONE: "2"}},
        "spec": {"azureDisk": {"diskName": "d", "diskURI": "uri"}, "nodeAffinity": kept}});
    assert_eq!(affinity_of("azure disk PV keeps its affinity", azure), kept);
    let inline: Volume =
        serde_json::from_value(json!({"name": "v", "awsElasticBlockStore": {"volumeID": "vol-1"}}))
            .unwrap();
    let m = translate_inline(&inline, "").unwrap().unwrap();
    assert_eq!(m.node_affinity, None, "an inline volume has no affinity");
}
