//! The test CSI driver, end to end: the real binary, a tonic client over its
//! Unix socket, real loop devices, ext4 and mounts, in a private mount
//! namespace per test (root only; skips with a reason otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use support::*;
use tonic::Code;

const MI: i64 = 1 << 20;

fn bytes_usage(resp: &csi::NodeGetVolumeStatsResponse) -> &csi::VolumeUsage {
    resp.usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .expect("a BYTES usage")
}

#[test]
fn identity_and_node_info() {
    isolated("identity_and_node_info", |dir| {
        let d = Driver::start(dir, &["--name", "test.csi.example"]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let info = c
                .identity
                .get_plugin_info(csi::GetPluginInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.name, "test.csi.example");
            assert!(!info.vendor_version.is_empty());
            let probe = c.identity.probe(csi::ProbeRequest {}).await.unwrap();
            assert_eq!(probe.into_inner().ready, Some(true));
            let caps = c
                .identity
                .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
                .await
                .unwrap()
                .into_inner();
            assert!(!caps.capabilities.is_empty());
            let node_caps = c
                .node
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await
                .unwrap()
                .into_inner();
            use csi::node_service_capability::{rpc::Type, Type as Cap};
            let mut got: Vec<i32> = node_caps
                .capabilities
                .iter()
                .map(|c| match &c.r#type {
                    Some(Cap::Rpc(r)) => r.r#type,
                    None => 0,
                })
                .collect();
            got.sort();
            let mut want = vec![
                Type::StageUnstageVolume as i32,
                Type::ExpandVolume as i32,
                Type::GetVolumeStats as i32,
                Type::VolumeCondition as i32,
            ];
            want.sort();
            assert_eq!(got, want);
            let ni = c
                .node
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(ni.node_id, "test-node");
        });
        // Every call is in the journal with its code and timing.
        let calls = d.calls();
        let methods: Vec<&str> = calls
            .iter()
            .map(|c| c["method"].as_str().unwrap())
            .collect();
        for m in [
            "GetPluginInfo",
            "Probe",
            "GetPluginCapabilities",
            "NodeGetCapabilities",
            "NodeGetInfo",
        ] {
            assert!(methods.contains(&m), "{m} missing from {methods:?}");
        }
        for c in &calls {
            assert_eq!(c["code"], "OK");
            assert!(c["start_unix_ns"].as_u64().unwrap() > 0);
            assert!(c["duration_ns"].as_u64().is_some());
        }
    });
}

#[test]
fn filesystem_stage_publish_unpublish_unstage() {
    isolated("filesystem_stage_publish_unpublish_unstage", |dir| {
        let d = Driver::start(dir, &[]);
        let staging = dir.join("staging/vol-1");
        let (a, b, ro) = (dir.join("pod-a"), dir.join("pod-b"), dir.join("pod-ro"));
        let cap = mount_cap(&["noatime"]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            // Missing fields.
            let mut bad = stage_req("", &staging, cap.clone(), None);
            let e = c.node.node_stage_volume(bad.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            bad.volume_id = "vol-1".into();
            bad.volume_capability = None;
            let e = c.node.node_stage_volume(bad).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            // No staging path: FAILED_PRECONDITION (the spec's answer).
            let mut p = publish_req("vol-1", &staging, &a, cap.clone(), false);
            p.staging_target_path.clear();
            let e = c.node.node_publish_volume(p).await.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            // Publish before stage.
            let e = c
                .node
                .node_publish_volume(publish_req("vol-1", &staging, &a, cap.clone(), false))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

            // Stage (twice: idempotent), one loop device.
            for _ in 0..2 {
                c.node
                    .node_stage_volume(stage_req("vol-1", &staging, cap.clone(), Some("32Mi")))
                    .await
                    .unwrap();
            }
            assert!(is_mount(&staging));
            assert_eq!(loops_under(dir).len(), 1);
            let image = d.state.join("images/vol-1.img");
            assert_eq!(std::fs::metadata(&image).unwrap().len(), 32 << 20);

            // Two read-write publishes and a read-only one.
            for t in [&a, &b] {
                for _ in 0..2 {
                    c.node
                        .node_publish_volume(publish_req("vol-1", &staging, t, cap.clone(), false))
                        .await
                        .unwrap();
                }
            }
            c.node
                .node_publish_volume(publish_req("vol-1", &staging, &ro, cap.clone(), true))
                .await
                .unwrap();
            std::fs::write(a.join("hello.txt"), b"written in pod a").unwrap();
            assert_eq!(
                std::fs::read(b.join("hello.txt")).unwrap(),
                b"written in pod a"
            );
            assert_eq!(
                std::fs::read(ro.join("hello.txt")).unwrap(),
                b"written in pod a"
            );
            let e = std::fs::write(ro.join("nope.txt"), b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
            // Same target, other read-only mode: ALREADY_EXISTS.
            let e = c
                .node
                .node_publish_volume(publish_req("vol-1", &staging, &ro, cap.clone(), false))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

            // Stats: bytes and inodes; unknown path or volume: NOT_FOUND.
            let st = c
                .node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: "vol-1".into(),
                    volume_path: a.to_string_lossy().into_owned(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            let bytes = bytes_usage(&st);
            assert!(bytes.total > 16 * MI && bytes.total <= 32 * MI, "{bytes:?}");
            assert!(bytes.used > 0 && bytes.available > 0);
            let inodes = st
                .usage
                .iter()
                .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
                .expect("INODES usage");
            assert!(inodes.total > 0 && inodes.used > 0);
            // VOLUME_CONDITION: healthy until conditions.json says otherwise.
            let cond = st.volume_condition.expect("a volume condition");
            assert!(!cond.abnormal, "{cond:?}");
            let tmp = d.state.join("conditions.json.tmp");
            std::fs::write(&tmp, r#"{"vol-1": {"abnormal": true, "message": "bad"}}"#).unwrap();
            std::fs::rename(&tmp, d.state.join("conditions.json")).unwrap();
            let cond = c
                .node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: "vol-1".into(),
                    volume_path: a.to_string_lossy().into_owned(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .volume_condition
                .unwrap();
            assert!(cond.abnormal && cond.message == "bad", "{cond:?}");
            for (id, path) in [
                ("vol-1", dir.join("nowhere")),
                ("vol-1", dir.to_path_buf()),
                ("vol-x", a.clone()),
            ] {
                let e = c
                    .node
                    .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                        volume_id: id.into(),
                        volume_path: path.to_string_lossy().into_owned(),
                        staging_target_path: String::new(),
                    })
                    .await
                    .unwrap_err();
                assert_eq!(e.code(), Code::NotFound, "{id} {path:?}: {e:?}");
            }

            // Unpublish (twice: idempotent) removes the targets.
            for t in [&a, &b, &ro] {
                for _ in 0..2 {
                    c.node
                        .node_unpublish_volume(unpublish_req("vol-1", t))
                        .await
                        .unwrap();
                }
                assert!(!t.exists(), "{t:?} still there");
            }
            for _ in 0..2 {
                c.node
                    .node_unstage_volume(unstage_req("vol-1", &staging))
                    .await
                    .unwrap();
            }
            assert_clean(dir);

            // Staged again later: the data is still there.
            c.node
                .node_stage_volume(stage_req("vol-1", &staging, cap.clone(), None))
                .await
                .unwrap();
            assert_eq!(
                std::fs::read(staging.join("hello.txt")).unwrap(),
                b"written in pod a"
            );
            c.node
                .node_unstage_volume(unstage_req("vol-1", &staging))
                .await
                .unwrap();
            assert_clean(dir);
        });
    });
}

#[test]
fn block_mode() {
    isolated("block_mode", |dir| {
        let d = Driver::start(dir, &[]);
        let staging = dir.join("staging/blk");
        std::fs::create_dir_all(&staging).unwrap();
        let (t1, t2) = (dir.join("dev-a"), dir.join("dev-b"));
        rt().block_on(async {
            let mut c = connect(&d).await;
            let e = c
                .node
                .node_publish_volume(publish_req("blk", &staging, &t1, block_cap(), false))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            c.node
                .node_stage_volume(stage_req("blk", &staging, block_cap(), Some("8Mi")))
                .await
                .unwrap();
            for t in [&t1, &t2] {
                for _ in 0..2 {
                    c.node
                        .node_publish_volume(publish_req("blk", &staging, t, block_cap(), false))
                        .await
                        .unwrap();
                }
                let m = std::fs::metadata(t).unwrap();
                assert!(m.file_type().is_block_device(), "{t:?} is not a device");
                assert_eq!(libc::major(m.rdev()), 7, "not a loop device");
            }
            // Raw bytes written through one device file are read through
            // the other, at an offset past anything a file system would use.
            let pattern = b"raw block data 0123456789";
            {
                let mut f = std::fs::OpenOptions::new().write(true).open(&t1).unwrap();
                f.seek(SeekFrom::Start(5 << 20)).unwrap();
                f.write_all(pattern).unwrap();
                f.sync_all().unwrap();
            }
            {
                let mut f = std::fs::File::open(&t2).unwrap();
                f.seek(SeekFrom::Start(5 << 20)).unwrap();
                let mut buf = vec![0u8; pattern.len()];
                f.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, pattern);
            }
            let st = c
                .node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: "blk".into(),
                    volume_path: t1.to_string_lossy().into_owned(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(bytes_usage(&st).total, 8 * MI);
            // Expansion of a block volume: the device grows, no resize2fs.
            let r = c
                .node
                .node_expand_volume(csi::NodeExpandVolumeRequest {
                    volume_id: "blk".into(),
                    volume_path: t1.to_string_lossy().into_owned(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 16 * MI,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(block_cap()),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.capacity_bytes, 16 * MI);
            let len = std::fs::File::open(&t2)
                .unwrap()
                .seek(SeekFrom::End(0))
                .unwrap();
            assert_eq!(len, 16 << 20);
            for t in [&t1, &t2] {
                c.node
                    .node_unpublish_volume(unpublish_req("blk", t))
                    .await
                    .unwrap();
                assert!(!t.exists());
            }
            c.node
                .node_unstage_volume(unstage_req("blk", &staging))
                .await
                .unwrap();
            assert_clean(dir);
        });
    });
}

/// Stage + publish a `fs` volume of `size` MiB, write a file, expand it to
/// `grow_to` MiB; returns the expansion's answer (after checking the growth
/// in statfs when it succeeded), cleaned up either way.
fn expand_case(dir: &Path, fs: &str, size: i64, grow_to: i64) -> Result<(), tonic::Status> {
    let d = Driver::start(dir, &[]);
    let id = format!("grow-{fs}");
    let staging = dir.join(format!("staging/{id}"));
    let target = dir.join(format!("pod-{fs}"));
    let cap = mount_cap_fs(fs, &[]);
    rt().block_on(async {
        let mut c = connect(&d).await;
        c.node
            .node_stage_volume(stage_req(
                &id,
                &staging,
                cap.clone(),
                Some(&format!("{size}Mi")),
            ))
            .await
            .unwrap();
        c.node
            .node_publish_volume(publish_req(&id, &staging, &target, cap.clone(), false))
            .await
            .unwrap();
        std::fs::write(target.join("keep"), b"still here").unwrap();
        let before = nix::sys::statvfs::statvfs(&target).unwrap();
        let before = before.blocks() * before.fragment_size();
        let req = csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: grow_to * MI,
                limit_bytes: 0,
            }),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(cap.clone()),
            secrets: Default::default(),
        };
        let result = c.node.node_expand_volume(req.clone()).await;
        if let Ok(first) = &result {
            let first = *first.get_ref();
            // Again: a no-op with the same answer.
            for r in [
                first,
                c.node
                    .node_expand_volume(req.clone())
                    .await
                    .unwrap()
                    .into_inner(),
            ] {
                assert_eq!(r.capacity_bytes, grow_to * MI);
            }
            let after = nix::sys::statvfs::statvfs(&target).unwrap();
            let after = after.blocks() * after.fragment_size();
            let grown = ((grow_to - size) * MI) as u64;
            assert!(
                after >= before + grown / 2,
                "{fs}: statfs {before} -> {after}"
            );
            let st = c
                .node
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: id.clone(),
                    volume_path: target.to_string_lossy().into_owned(),
                    staging_target_path: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(bytes_usage(&st).total as u64, after);
            // The file system is intact.
            assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"still here");
            // Over the limit: OUT_OF_RANGE. Unknown volume: NOT_FOUND.
            let mut over = req.clone();
            over.capacity_range = Some(csi::CapacityRange {
                required_bytes: (grow_to + 100) * MI,
                limit_bytes: (grow_to + 50) * MI,
            });
            let e = c.node.node_expand_volume(over).await.unwrap_err();
            assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
            let mut unknown = req.clone();
            unknown.volume_id = "nope".into();
            let e = c.node.node_expand_volume(unknown).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
        }
        c.node
            .node_unpublish_volume(unpublish_req(&id, &target))
            .await
            .unwrap();
        c.node
            .node_unstage_volume(unstage_req(&id, &staging))
            .await
            .unwrap();
        assert_clean(dir);
        result.map(|_| ())
    })
}

#[test]
fn expansion_xfs_visible_in_statfs() {
    isolated("expansion_xfs_visible_in_statfs", |dir| {
        expand_case(dir, "xfs", 320, 480).unwrap();
    });
}

#[test]
fn expansion_ext4_visible_in_statfs() {
    isolated("expansion_ext4_visible_in_statfs", |dir| {
        let r = expand_case(dir, "ext4", 32, 96);
        if has_cap_sys_resource() {
            r.unwrap();
        } else {
            // The kernel refuses online ext4 growth without
            // CAP_SYS_RESOURCE: the driver says so instead of pretending.
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition);
            assert!(e.message().contains("CAP_SYS_RESOURCE"), "{e:?}");
            eprintln!("NOTE: no CAP_SYS_RESOURCE here: checked the ext4 refusal only");
        }
    });
}

/// Stages and publishes vol-f at dir/staging, dir/pod; returns the requests.
async fn staged(c: &mut Clients, dir: &Path) -> csi::NodePublishVolumeRequest {
    let staging = dir.join("staging");
    c.node
        .node_stage_volume(stage_req("vol-f", &staging, mount_cap(&[]), Some("16Mi")))
        .await
        .unwrap();
    publish_req("vol-f", &staging, &dir.join("pod"), mount_cap(&[]), false)
}

async fn teardown(c: &mut Clients, dir: &Path) {
    c.node
        .node_unpublish_volume(unpublish_req("vol-f", &dir.join("pod")))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("vol-f", &dir.join("staging")))
        .await
        .unwrap();
    assert_clean(dir);
}

#[test]
fn fault_error_code_count_is_consumed() {
    isolated("fault_error_code_count_is_consumed", |dir| {
        let mut d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let publish = staged(&mut c, dir).await;
            d.set_faults(
                r#"[{"method":"NodePublishVolume","code":"UNAVAILABLE","count":3},
                    {"method":"NodeGetInfo","code":"RESOURCE_EXHAUSTED","message":"busy"}]"#,
            );
            for left in [2, 1] {
                let e = c
                    .node
                    .node_publish_volume(publish.clone())
                    .await
                    .unwrap_err();
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert_eq!(d.faults()[0]["count"], left);
            }
            assert!(
                !is_mount(&dir.join("pod")),
                "an injected error did the work"
            );
            // A restart does not give the consumed faults back.
            d.kill();
            d.spawn();
            let mut c = connect(&d).await;
            let e = c
                .node
                .node_publish_volume(publish.clone())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unavailable, "{e:?}");
            // Consumed rules are removed; the uncounted one stays.
            assert_eq!(d.faults().as_array().unwrap().len(), 1);
            let e = c
                .node
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap_err();
            assert_eq!((e.code(), e.message()), (Code::ResourceExhausted, "busy"));
            c.node.node_publish_volume(publish.clone()).await.unwrap();
            assert!(is_mount(&dir.join("pod")));
            let codes: Vec<String> = d
                .calls()
                .iter()
                .filter(|c| c["method"] == "NodePublishVolume")
                .map(|c| c["code"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(codes, ["UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE", "OK"]);
            // A file that does not parse fails calls with INTERNAL.
            d.set_faults("[{");
            let e = c
                .node
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Internal, "{e:?}");
            d.set_faults("[]");
            teardown(&mut c, dir).await;
        });
    });
}

#[test]
fn fault_delay_is_in_the_journal() {
    isolated("fault_delay_is_in_the_journal", |dir| {
        let d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            d.set_faults(r#"[{"method":"NodeGetInfo","delay_ms":300,"count":1}]"#);
            c.node
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap();
            c.node
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap();
            let calls: Vec<_> = d
                .calls()
                .into_iter()
                .filter(|c| c["method"] == "NodeGetInfo")
                .collect();
            assert_eq!(calls.len(), 2);
            // The driver's own handling time includes the injected delay
            // (a lower bound: sleeping never takes less).
            assert!(calls[0]["duration_ns"].as_u64().unwrap() >= 300_000_000);
            assert_eq!(calls[0]["code"], "OK");
        });
    });
}

#[test]
fn fault_hang_until_faults_change() {
    isolated("fault_hang_until_faults_change", |dir| {
        let d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let publish = staged(&mut c, dir).await;
            d.set_faults(r#"[{"method":"NodePublishVolume","hang":true}]"#);
            let mut c2 = c.clone();
            let p2 = publish.clone();
            let hung = tokio::spawn(async move { c2.node.node_publish_volume(p2).await });
            // Wait until the driver says the call hangs.
            for _ in 0..6000 {
                if d.log().contains("injected hang") {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert!(d.log().contains("injected hang"), "{}", d.log());
            // While it hangs the volume has an operation in flight: another
            // call for it is ABORTED, as the spec asks.
            let e = c
                .node
                .node_publish_volume(publish.clone())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Aborted, "{e:?}");
            assert!(!hung.is_finished());
            assert!(!is_mount(&dir.join("pod")));
            d.set_faults("[]");
            hung.await.unwrap().unwrap();
            assert!(is_mount(&dir.join("pod")));
            teardown(&mut c, dir).await;
        });
    });
}

#[test]
fn fault_exit_before_and_after_work() {
    isolated("fault_exit_before_and_after_work", |dir| {
        let mut d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let publish = staged(&mut c, dir).await;
            let pod = dir.join("pod");

            d.set_faults(r#"[{"method":"NodePublishVolume","exit":"before_work","count":1}]"#);
            let e = c
                .node
                .node_publish_volume(publish.clone())
                .await
                .unwrap_err();
            assert_ne!(e.code(), Code::Ok);
            assert_eq!(d.wait_exit(), Some(70));
            assert!(!is_mount(&pod), "exit before the work did the work");
            d.spawn();
            let mut c = connect(&d).await;
            c.node.node_publish_volume(publish.clone()).await.unwrap();
            assert!(is_mount(&pod));

            c.node
                .node_unpublish_volume(unpublish_req("vol-f", &pod))
                .await
                .unwrap();
            d.set_faults(r#"[{"method":"NodePublishVolume","exit":"after_work","count":1}]"#);
            let e = c
                .node
                .node_publish_volume(publish.clone())
                .await
                .unwrap_err();
            assert_ne!(e.code(), Code::Ok);
            assert_eq!(d.wait_exit(), Some(70));
            assert!(is_mount(&pod), "exit after the work did not do the work");
            d.spawn();
            let mut c = connect(&d).await;
            // The caller does not know; calling again is fine (idempotent).
            c.node.node_publish_volume(publish.clone()).await.unwrap();
            let exits = d.calls().iter().filter(|c| c["code"] == "EXIT").count();
            assert_eq!(exits, 2);
            teardown(&mut c, dir).await;
        });
    });
}

#[test]
fn restarted_driver_finds_its_staged_volume() {
    isolated("restarted_driver_finds_its_staged_volume", |dir| {
        let mut d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let publish = staged(&mut c, dir).await;
            c.node.node_publish_volume(publish.clone()).await.unwrap();
            std::fs::write(dir.join("pod/data"), b"before the crash").unwrap();
            let loops = loops_under(dir);
            assert_eq!(loops.len(), 1);
            // SIGKILL, then a new process.
            d.kill();
            d.spawn();
            let mut c = connect(&d).await;
            c.node
                .node_stage_volume(stage_req(
                    "vol-f",
                    &dir.join("staging"),
                    mount_cap(&[]),
                    Some("16Mi"),
                ))
                .await
                .unwrap();
            c.node.node_publish_volume(publish.clone()).await.unwrap();
            // Same loop device, no second mount.
            assert_eq!(loops_under(dir), loops);
            let mounts = mounts_under(dir);
            assert_eq!(mounts.len(), 2, "{mounts:?}");
            assert_eq!(
                std::fs::read(dir.join("pod/data")).unwrap(),
                b"before the crash"
            );
            teardown(&mut c, dir).await;
        });
    });
}

#[test]
fn secrets_are_never_logged() {
    isolated("secrets_are_never_logged", |dir| {
        let d = Driver::start(dir, &[]);
        let secret = "s3cr3t-Value-Never-Logged";
        rt().block_on(async {
            let mut c = connect(&d).await;
            let staging = dir.join("staging");
            let mut req = stage_req("vol-s", &staging, mount_cap(&["bogus_option_xyz"]), None);
            req.secrets = [("password".to_string(), secret.to_string())].into();
            // A failing call (the bad mount option) logs its error...
            let e = c.node.node_stage_volume(req.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            // ...and a successful one logs too.
            req.volume_capability = Some(mount_cap(&[]));
            c.node.node_stage_volume(req).await.unwrap();
            c.node
                .node_unstage_volume(unstage_req("vol-s", &staging))
                .await
                .unwrap();
            assert_clean(dir);
        });
        let log = d.log();
        assert!(log.contains("NodeStageVolume"), "nothing logged: {log}");
        assert!(!log.contains(secret), "secret in the log:\n{log}");
        let journal = std::fs::read_to_string(d.state.join("calls.jsonl")).unwrap();
        assert!(!journal.contains(secret));
    });
}

#[test]
fn plugin_registration_socket() {
    isolated("plugin_registration_socket", |dir| {
        let reg_dir = dir.join("plugins_registry");
        let d = Driver::start(
            dir,
            &[
                "--name",
                "reg.csi.example",
                "--registration-dir",
                reg_dir.to_str().unwrap(),
            ],
        );
        rt().block_on(async {
            connect(&d).await;
            let sock = reg_dir.join("reg.csi.example-reg.sock");
            let ch = channel(&sock).await.unwrap();
            let mut reg = registration::registration_client::RegistrationClient::new(ch);
            let info = reg
                .get_info(registration::InfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.r#type, "CSIPlugin");
            assert_eq!(info.name, "reg.csi.example");
            assert_eq!(Path::new(&info.endpoint), d.socket.as_path());
            assert_eq!(info.supported_versions, ["1.0.0"]);
            reg.notify_registration_status(registration::RegistrationStatus {
                plugin_registered: false,
                error: "version mismatch".into(),
            })
            .await
            .unwrap();
            let r: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.state.join("registration.json")).unwrap())
                    .unwrap();
            assert_eq!(r["plugin_registered"], false);
            assert_eq!(r["error"], "version mismatch");
            reg.notify_registration_status(registration::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
            let r: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.state.join("registration.json")).unwrap())
                    .unwrap();
            assert_eq!(r["plugin_registered"], true);
        });
        assert!(d.log().contains("version mismatch"));
    });
}

#[test]
fn many_volumes_concurrently() {
    isolated("many_volumes_concurrently", |dir| {
        // More volumes than the 8 loop devices most systems start with, all
        // at once: the driver races for free devices (EBUSY) and wins.
        let n: usize = std::env::var("CSI_DRIVER_TEST_VOLUMES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24);
        let d = Driver::start(dir, &[]);
        rt().block_on(async {
            let c = connect(&d).await;
            let mut tasks = Vec::new();
            for i in 0..n {
                let mut c = c.clone();
                let dir = dir.to_path_buf();
                tasks.push(tokio::spawn(async move {
                    let id = format!("many-{i}");
                    let staging = dir.join(format!("staging/{id}"));
                    let target = dir.join(format!("pods/{id}"));
                    std::fs::create_dir_all(dir.join("pods")).unwrap();
                    c.node
                        .node_stage_volume(stage_req(&id, &staging, mount_cap(&[]), Some("8Mi")))
                        .await
                        .unwrap();
                    c.node
                        .node_publish_volume(publish_req(
                            &id,
                            &staging,
                            &target,
                            mount_cap(&[]),
                            false,
                        ))
                        .await
                        .unwrap();
                    std::fs::write(target.join("id"), &id).unwrap();
                    (id, staging, target)
                }));
            }
            let mut vols = Vec::new();
            for t in tasks {
                vols.push(t.await.unwrap());
            }
            assert_eq!(loops_under(dir).len(), n);
            let mut tasks = Vec::new();
            for (id, staging, target) in vols {
                let mut c = c.clone();
                tasks.push(tokio::spawn(async move {
                    // Each volume has its own file system.
                    assert_eq!(std::fs::read_to_string(target.join("id")).unwrap(), id);
                    c.node
                        .node_unpublish_volume(unpublish_req(&id, &target))
                        .await
                        .unwrap();
                    c.node
                        .node_unstage_volume(unstage_req(&id, &staging))
                        .await
                        .unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_clean(dir);
            let ok = d
                .calls()
                .iter()
                .filter(|c| c["code"] == "OK" && c["method"] != "Probe")
                .count();
            assert_eq!(ok, 4 * n);
        });
    });
}

#[test]
fn fault_hang_then_caller_deadline() {
    isolated("fault_hang_then_caller_deadline", |dir| {
        let d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            let publish = staged(&mut c, dir).await;
            d.set_faults(r#"[{"method":"NodePublishVolume","hang":true,"count":1}]"#);
            // The caller's deadline ends the hung call: the driver journals it
            // CANCELLED, does no work and frees the volume.
            let mut req = tonic::Request::new(publish.clone());
            req.set_timeout(std::time::Duration::from_millis(200));
            let e = c.node.node_publish_volume(req).await.unwrap_err();
            assert!(
                matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
                "{e:?}"
            );
            let mut cancelled = false;
            for _ in 0..6000 {
                if d.calls().iter().any(|c| c["code"] == "CANCELLED") {
                    cancelled = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert!(cancelled, "{:?}", d.calls());
            assert!(!is_mount(&dir.join("pod")));
            // The count was consumed: the retry succeeds.
            c.node.node_publish_volume(publish).await.unwrap();
            assert!(is_mount(&dir.join("pod")));
            teardown(&mut c, dir).await;
        });
    });
}

#[test]
fn sigterm_stops_and_removes_sockets() {
    isolated("sigterm_stops_and_removes_sockets", |dir| {
        let reg_dir = dir.join("registry");
        let mut d = Driver::start(dir, &["--registration-dir", reg_dir.to_str().unwrap()]);
        rt().block_on(async {
            connect(&d).await;
        });
        let reg_sock = reg_dir.join("loop.csi.volmgr.dev-reg.sock");
        assert!(d.socket.exists() && reg_sock.exists());
        let pid = d.child.as_ref().unwrap().id();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(d.wait_exit(), Some(0));
        assert!(!d.socket.exists() && !reg_sock.exists());
    });
}

#[test]
fn conflicts_and_bad_input() {
    isolated("conflicts_and_bad_input", |dir| {
        let d = Driver::start(dir, &[]);
        rt().block_on(async {
            let mut c = connect(&d).await;
            // Something else mounted at the staging path: ALREADY_EXISTS, and
            // the loop device attached for the attempt is detached again.
            let busy = dir.join("busy");
            std::fs::create_dir_all(&busy).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                &busy,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
            let e = c
                .node
                .node_stage_volume(stage_req("v", &busy, mount_cap(&[]), None))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
            assert!(loops_under(dir).is_empty());
            nix::mount::umount(&busy).unwrap();

            let staging = dir.join("staging");
            for (cap, size) in [
                (mount_cap_fs("btrfs", &[]), None),
                (mount_cap(&[]), Some("lots")),
                (mount_cap(&[]), Some("1Ki")),
                (mount_cap_fs("xfs", &[]), Some("64Mi")),
            ] {
                let e = c
                    .node
                    .node_stage_volume(stage_req("v", &staging, cap, size))
                    .await
                    .unwrap_err();
                assert!(
                    matches!(e.code(), Code::InvalidArgument | Code::OutOfRange),
                    "{e:?}"
                );
            }
            // Formatted ext4 once; asked for xfs later: INVALID_ARGUMENT, the
            // data is not reformatted.
            c.node
                .node_stage_volume(stage_req("w", &staging, mount_cap(&[]), Some("320Mi")))
                .await
                .unwrap();
            std::fs::write(staging.join("data"), b"ext4 data").unwrap();
            c.node
                .node_unstage_volume(unstage_req("w", &staging))
                .await
                .unwrap();
            let e = c
                .node
                .node_stage_volume(stage_req("w", &staging, mount_cap_fs("xfs", &[]), None))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(loops_under(dir).is_empty());
            c.node
                .node_stage_volume(stage_req("w", &staging, mount_cap(&[]), None))
                .await
                .unwrap();
            assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"ext4 data");

            // Unpublish never deletes data: an unmounted, non-empty target
            // is an error and stays.
            let stray = dir.join("stray");
            std::fs::create_dir_all(&stray).unwrap();
            std::fs::write(stray.join("precious"), b"x").unwrap();
            let e = c
                .node
                .node_unpublish_volume(unpublish_req("w", &stray))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Internal, "{e:?}");
            assert!(stray.join("precious").exists());

            // Relative paths are refused.
            let mut rel = publish_req(
                "w",
                &staging,
                Path::new("rel/target"),
                mount_cap(&[]),
                false,
            );
            let e = c.node.node_publish_volume(rel.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            rel.target_path = dir.join("t").to_string_lossy().into_owned();
            rel.volume_capability = None;
            let e = c.node.node_publish_volume(rel).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

            c.node
                .node_unstage_volume(unstage_req("w", &staging))
                .await
                .unwrap();
            assert_clean(dir);
        });
    });
}
