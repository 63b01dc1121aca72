package volmgr

// An example adapter with the kubelet's VolumeManager method set
// (pkg/kubelet/volumemanager/volume_manager.go), compiled and run by
// ffi/go/run.sh. Only the standard library is used: the kubelet's types
// have stand-ins below; in a kubelet fork, replace them with the real
// ones (v1.Pod, types.UniquePodName, v1.UniqueVolumeName,
// container.VolumeMap, config.SourcesReady, resource.Quantity).

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// Stand-ins for the kubelet's types.
type (
	// UniquePodName stands in for types.UniquePodName (the pod's UID).
	UniquePodName string
	// UniqueVolumeName stands in for v1.UniqueVolumeName.
	UniqueVolumeName string
	// Pod stands in for *v1.Pod: its UID and the JSON volmgr reads.
	Pod struct {
		UID  string
		JSON []byte
	}
	// VolumeInfo stands in for container.VolumeInfo.
	VolumeInfo struct {
		Path                string
		ReadOnly            bool
		SELinuxRelabel      bool
		BlockDevicePath     string
		InnerVolumeSpecName string
	}
	// VolumeMap stands in for container.VolumeMap.
	VolumeMap map[string]VolumeInfo
	// SourcesReady stands in for config.SourcesReady.
	SourcesReady interface{ AllReady() bool }
	// Quantity stands in for resource.Quantity.
	Quantity struct{ Bytes int64 }
)

// Value is resource.Quantity's Value.
func (q *Quantity) Value() int64 { return q.Bytes }

// kubeletVolumeManager is the kubelet's VolumeManager interface over the
// stand-in types.
type kubeletVolumeManager interface {
	Run(ctx context.Context, sourcesReady SourcesReady)
	WaitForAttachAndMount(ctx context.Context, pod *Pod) error
	WaitForUnmount(ctx context.Context, pod *Pod) error
	WaitForAllPodsUnmount(ctx context.Context, pods []*Pod) error
	GetMountedVolumesForPod(podName UniquePodName) VolumeMap
	HasPossiblyMountedVolumesForPod(podName UniquePodName) bool
	GetExtraSupplementalGroupsForPod(pod *Pod) []int64
	GetVolumesInUse() []UniqueVolumeName
	ReconcilerStatesHasBeenSynced() bool
	VolumeIsAttached(volumeName UniqueVolumeName) bool
	MarkVolumesAsReportedInUse(volumesReportedAsInUse []UniqueVolumeName)
	ResizeEphemeralVolume(pod *Pod, volumeName string, newSize *Quantity) error
}

// adapter is what a kubelet fork puts where NewVolumeManager's result was.
// The pod manager's add/update/delete events go to Manager.UpsertPod and
// Manager.DeletePod (see README.md).
type adapter struct{ m *Manager }

var _ kubeletVolumeManager = (*adapter)(nil)

// Run starts volmgr, tells it when the sources are ready, and stops it
// (mounts stay) when ctx ends.
func (a *adapter) Run(ctx context.Context, sourcesReady SourcesReady) {
	if err := a.m.Start(); err != nil {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ready := false; ; {
		if !ready && sourcesReady.AllReady() {
			ready = a.m.SourcesReady() == nil
		}
		select {
		case <-ctx.Done():
			_ = a.m.Stop()
			return
		case <-tick.C:
		}
	}
}

func (a *adapter) WaitForAttachAndMount(ctx context.Context, pod *Pod) error {
	if pod == nil {
		return nil
	}
	// The kubelet reprocesses the pod here; volmgr has it from UpsertPod.
	return a.m.WaitForAttachAndMount(ctx, pod.UID)
}

func (a *adapter) WaitForUnmount(ctx context.Context, pod *Pod) error {
	if pod == nil {
		return nil
	}
	return a.m.WaitForUnmount(ctx, pod.UID)
}

func (a *adapter) WaitForAllPodsUnmount(ctx context.Context, pods []*Pod) error {
	uids := make([]string, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, p.UID)
	}
	return a.m.WaitForAllPodsUnmount(ctx, uids)
}

func (a *adapter) GetMountedVolumesForPod(podName UniquePodName) VolumeMap {
	vols, err := a.m.GetMountedVolumesForPod(string(podName))
	out := make(VolumeMap, len(vols))
	if err != nil {
		return out
	}
	for _, v := range vols {
		out[v.OuterVolumeSpecName] = VolumeInfo{
			Path:                v.Path,
			ReadOnly:            v.ReadOnly,
			SELinuxRelabel:      v.SELinuxRelabel,
			BlockDevicePath:     v.BlockDevicePath,
			InnerVolumeSpecName: v.OuterVolumeSpecName,
		}
	}
	return out
}

func (a *adapter) HasPossiblyMountedVolumesForPod(podName UniquePodName) bool {
	return a.m.HasPossiblyMountedVolumesForPod(string(podName))
}

func (a *adapter) GetExtraSupplementalGroupsForPod(pod *Pod) []int64 {
	g, err := a.m.GetExtraSupplementalGroupsForPod(pod.UID)
	if err != nil {
		return nil
	}
	return g
}

func (a *adapter) GetVolumesInUse() []UniqueVolumeName {
	names, err := a.m.GetVolumesInUse()
	if err != nil {
		return nil
	}
	out := make([]UniqueVolumeName, len(names))
	for i, n := range names {
		out[i] = UniqueVolumeName(n)
	}
	return out
}

func (a *adapter) ReconcilerStatesHasBeenSynced() bool { return a.m.ReconcilerStatesHasBeenSynced() }

func (a *adapter) VolumeIsAttached(volumeName UniqueVolumeName) bool {
	ok, err := a.m.VolumeIsAttached(string(volumeName))
	return err == nil && ok
}

func (a *adapter) MarkVolumesAsReportedInUse(names []UniqueVolumeName) {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	_ = a.m.MarkVolumesAsReportedInUse(s)
}

func (a *adapter) ResizeEphemeralVolume(pod *Pod, volumeName string, newSize *Quantity) error {
	return a.m.ResizeEphemeralVolume(pod.UID, volumeName, uint64(newSize.Value()))
}

type readySources bool

func (r readySources) AllReady() bool { return bool(r) }

// The adapter drives a pod through its life as the kubelet would.
func TestKubeletAdapter(t *testing.T) {
	dir := t.TempDir()
	root, host := dir+"/root", dir+"/host"
	// WaitForSourcesReady is left unset: the kubelet's rule is the default.
	m, err := New(Config{RootDir: root, Tracer: "off", WaitForReportedInUse: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		for _, p := range mountsUnder(t, root) {
			_ = unmount(p)
		}
	})
	if err := mkdir(host); err != nil {
		t.Fatal(err)
	}
	var vm kubeletVolumeManager = &adapter{m}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { vm.Run(ctx, readySources(true)); close(done) }()
	pod := &Pod{UID: "kube-1", JSON: podJSON("kube-1", host, 1)}
	// The pod manager's add event.
	if err := m.UpsertPod(pod.JSON); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	if err := vm.WaitForAttachAndMount(wctx, pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(UniquePodName(pod.UID))
	if v, ok := vols["m0"]; !ok || !v.SELinuxRelabel || v.Path == "" || len(vols) != 2 {
		t.Fatalf("volume map %+v", vols)
	}
	// The node status setter (setters.VolumesInUse): once the states have
	// synced, report what is in use (nothing attachable here); then mark
	// what the node lists.
	var nodeVolumesInUse []UniqueVolumeName
	if vm.ReconcilerStatesHasBeenSynced() {
		nodeVolumesInUse = vm.GetVolumesInUse()
	}
	vm.MarkVolumesAsReportedInUse(nodeVolumesInUse)
	if len(vm.GetExtraSupplementalGroupsForPod(pod)) != 0 || !vm.HasPossiblyMountedVolumesForPod(UniquePodName(pod.UID)) {
		t.Fatal("queries")
	}
	if err := vm.ResizeEphemeralVolume(pod, "m0", &Quantity{Bytes: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	// The pod manager's delete event, then the kubelet's wait.
	if err := m.DeletePod(pod.UID); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForAllPodsUnmount(wctx, []*Pod{pod}); err != nil {
		t.Fatal(err)
	}
	for !vm.ReconcilerStatesHasBeenSynced() {
		select {
		case <-wctx.Done():
			t.Fatal("never synced")
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	<-done
	var st struct {
		Pods []json.RawMessage `json:"pods"`
	}
	raw, err := m.StatusJSON()
	if err != nil || json.Unmarshal(raw, &st) != nil || len(st.Pods) != 0 {
		t.Fatalf("status %s, %v", raw, err)
	}
}
