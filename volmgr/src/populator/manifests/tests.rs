use super::*;

/// A pod with one `emptyDir{medium: Memory}`, as block YAML.
pub(crate) const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns, uid: uid-a}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, emptyDir: {medium: Memory}}]
"#;

#[test]
fn multi_document_yaml_and_lists() {
    let text = format!(
            "{POD}---\n{}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {{name: c}}\n  spec: {{containers: []}}\n",
            POD.replace("name: a,", "name: b,").replace("uid-a", "uid-b")
        );
    let p = parse_manifest(&text, false);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.complete);
    assert_eq!(p.pods.len(), 3);
    assert_eq!(p.pods[0].uid.as_str(), "uid-a");
    assert_eq!(p.pods[1].uid.as_str(), "uid-b");
}

#[test]
fn yaml_is_read_with_the_core_schema_of_yaml_1_2() {
    // The block reader takes this file, serde_norway the same with an
    // anchor; both read `yes` as a string, so the pod is refused.
    let block = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  uid: uid-a\nspec:\n  containers:\n  - name: c\n    image: i\n    volumeMounts:\n    - name: v\n      mountPath: /v\n      readOnly: yes\n  volumes:\n  - name: v\n    emptyDir: {}\n";
    let anchored = block.replace("name: c", "name: &n c");
    assert!(super::block_yaml::parse(block).is_some());
    assert!(super::block_yaml::parse(&anchored).is_none());
    for text in [block.to_string(), anchored] {
        let p = parse_manifest(&text, false);
        assert!(p.pods.is_empty(), "{text}");
        assert!(
            p.errors.len() == 1
                && p.errors[0].contains("invalid type: string \"yes\", expected a boolean"),
            "{:?}",
            p.errors
        );
        assert!(!p.complete);
        let ok = parse_manifest(&text.replace("readOnly: yes", "readOnly: true"), false);
        assert_eq!(ok.pods.len(), 1, "{:?}", ok.errors);
    }
}

#[test]
fn json_stream() {
    let one =
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[]}}"#;
    let p = parse_manifest(&format!("{one}\n{}", one.replace("\"a\"", "\"b\"")), true);
    assert_eq!(p.pods.len(), 2);
    assert!(p.complete);
}

#[test]
fn errors_are_reported_per_document() {
    let p = parse_manifest("kind: Pod\nmetadata: [\n", false);
    assert!(!p.complete);
    assert!(p.errors[0].contains("invalid YAML"), "{:?}", p.errors);
    let p = parse_manifest("apiVersion: v1\nmetadata: {name: a}\n", false);
    assert!(p.errors[0].contains("missing \"kind\""));
    let p = parse_manifest(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: ../x}\nspec: {containers: []}\n",
        false,
    );
    assert!(p.complete);
    assert_eq!(p.rejected.len(), 1);
    let p = parse_manifest(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: 3}\n",
        false,
    );
    assert!(!p.complete);
    assert!(p.errors[0].contains("not a valid v1.Pod"), "{:?}", p.errors);
}

#[test]
fn manifest_names() {
    assert_eq!(is_manifest_name("a.yaml".as_ref()), Some(false));
    assert_eq!(is_manifest_name("a.yml".as_ref()), Some(false));
    assert_eq!(is_manifest_name("a.json".as_ref()), Some(true));
    assert_eq!(is_manifest_name(".a.yaml".as_ref()), None);
    assert_eq!(is_manifest_name("a.yaml.swp".as_ref()), None);
}

#[test]
fn reads_volume_objects_and_defers_pods_that_need_them() {
    let text = r#"
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-1}
spec: {csi: {driver: d, volumeHandle: h}}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: c, namespace: ns}, spec: {volumeName: pv-1}}
- {apiVersion: v1, kind: Secret, metadata: {name: s}, stringData: {password: hunter2}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: uid-p}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: c}}]
"#;
    let p = parse_manifest(text, false);
    assert!(p.errors.is_empty() && p.complete, "{:?}", p.errors);
    assert!(p.pods.is_empty());
    assert_eq!(p.unresolved.len(), 1);
    let refs: Vec<String> = p
        .objects
        .iter()
        .map(|o| o.reference().to_string())
        .collect();
    assert_eq!(
        refs,
        vec![
            "PersistentVolume pv-1",
            "PersistentVolumeClaim ns/c",
            "Secret default/s"
        ]
    );
    assert!(!format!("{p:?}").contains("hunter2"));

    // Typed lists, whose items carry no kind.
    let p = parse_manifest(
        r#"{"apiVersion":"v1","kind":"PersistentVolumeList","items":[{"metadata":{"name":"a"},"spec":{}}]}
{"apiVersion":"v1","kind":"SecretList","items":[{"metadata":{"name":"s"},"data":{}}]}
{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"p"},"spec":{"containers":[]}}]}"#,
        true,
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.objects.len(), 2);
    assert_eq!(p.pods.len(), 1);

    // A JSON Secret is not mistaken for a pod by the fast path.
    let p = parse_manifest(
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"dg=="}}"#,
        true,
    );
    assert_eq!(p.objects.len(), 1, "{:?}", p.errors);

    // Errors: a nameless object; a bad Secret never quotes its values.
    let p = parse_manifest(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: [hunter2]}\n",
            false,
        );
    assert!(!p.complete);
    assert_eq!(p.errors.len(), 2, "{:?}", p.errors);
    assert!(
        p.errors[0].contains("metadata.name is required"),
        "{:?}",
        p.errors
    );
    assert!(
        p.errors[1].contains("not a valid v1.Secret"),
        "{:?}",
        p.errors
    );
    assert!(!p.errors[1].contains("hunter2"), "{:?}", p.errors);
}

/// 100,000 levels of `{a: …}` (about 500 KB), or of `[…]` in JSON.
pub(crate) fn deep(json: bool) -> String {
    let n = 100_000;
    if json {
        format!("{}1{}", "[".repeat(n), "]".repeat(n))
    } else {
        format!("{}x{}", "{a: ".repeat(n), "}".repeat(n))
    }
}

#[test]
fn deeply_nested_documents_are_rejected() {
    let p = parse_manifest(&format!("{POD}---\n{}\n", deep(false)), false);
    assert!(!p.complete);
    assert_eq!(p.pods.len(), 1, "the document before is read");
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(
        p.errors[0].contains(
            "document 2: invalid YAML: collections nested deeper than 64 levels (line 9, column"
        ),
        "{:?}",
        p.errors
    );
    // JSON: serde_json's recursion limit (128) stops a deep value...
    let p = parse_manifest(&deep(true), true);
    assert!(!p.complete);
    assert!(
        p.errors[0].contains("invalid JSON: recursion limit exceeded"),
        "{:?}",
        p.errors
    );
    // ... and skips an unknown field however deep without recursing
    // (in linear time), as any unknown field.
    let n = 100_000;
    let text = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"p\",\"namespace\":\"ns\"}},\"x\":{}1{}}}",
            "{\"a\":".repeat(n),
            "}".repeat(n)
        );
    let p = parse_manifest(&text, true);
    assert!(p.complete && p.pods.len() == 1, "{:?}", p.errors);
}
