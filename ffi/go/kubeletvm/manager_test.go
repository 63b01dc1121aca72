package kubeletvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/volume/util/types"

	"volmgr/ffi/go/volmgr"
)

const childEnv = "KUBELETVM_TEST_CHILD"

// The tests mount: they run again in a private mount namespace, the host
// read-only but for the temporary directory (as ffi/go/volmgr's do).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		tmp := os.TempDir()
		err := syscall.Mount(tmp, tmp, "", syscall.MS_BIND|syscall.MS_REC, "")
		if err == nil {
			err = syscall.Mount("", "/", "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")
		}
		if err != nil {
			fmt.Println("cannot make the host read-only for the tests:", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Println("SKIP kubeletvm tests: need root to create a private mount namespace")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		fmt.Println("cannot run the tests in a private mount namespace:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// fakePods is the kubelet's pod manager and pod workers, as the volume
// manager sees them.
type fakePods struct {
	mu          sync.Mutex
	pods        map[k8stypes.UID]*v1.Pod
	terminating map[k8stypes.UID]bool
	removed     map[k8stypes.UID]bool
}

func newFakePods() *fakePods {
	return &fakePods{pods: map[k8stypes.UID]*v1.Pod{}, terminating: map[k8stypes.UID]bool{}, removed: map[k8stypes.UID]bool{}}
}

func (f *fakePods) GetPodByUID(uid k8stypes.UID) (*v1.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[uid]
	return p, ok
}

func (f *fakePods) GetPods() []*v1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*v1.Pod
	for _, p := range f.pods {
		out = append(out, p)
	}
	return out
}

func (f *fakePods) ShouldPodContainersBeTerminating(uid k8stypes.UID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.terminating[uid] || f.removed[uid]
}

func (f *fakePods) ShouldPodRuntimeBeRemoved(uid k8stypes.UID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removed[uid]
}

func (f *fakePods) add(p *v1.Pod) {
	f.mu.Lock()
	f.pods[p.UID] = p
	f.mu.Unlock()
}

func (f *fakePods) del(uid k8stypes.UID) {
	f.mu.Lock()
	delete(f.pods, uid)
	f.mu.Unlock()
}

func (f *fakePods) setRemoved(uid k8stypes.UID) {
	f.mu.Lock()
	f.terminating[uid], f.removed[uid] = true, true
	f.mu.Unlock()
}

type ready bool

func (r ready) AllReady() bool { return bool(r) }

func (ready) AddSource(string) {}

type env struct {
	m      *Manager
	pods   *fakePods
	root   string
	host   string
	client *fake.Clientset
	stop   func()
}

func start(t *testing.T, objects ...runtime.Object) *env {
	t.Helper()
	return startWith(t, nil, objects...)
}

func startWith(t *testing.T, csi *volmgr.CSIConfig, objects ...runtime.Object) *env {
	t.Helper()
	return startIn(t, t.TempDir(), ready(true), csi, objects...)
}

func startIn(t *testing.T, dir string, sources config.SourcesReady, csi *volmgr.CSIConfig, objects ...runtime.Object) *env {
	t.Helper()
	e := &env{pods: newFakePods(), root: filepath.Join(dir, "kubelet"), host: filepath.Join(dir, "host")}
	if err := os.MkdirAll(e.host, 0o755); err != nil {
		t.Fatal(err)
	}
	e.client = fake.NewClientset(objects...)
	m, err := New(Options{
		Config:           volmgr.Config{RootDir: e.root, NodeName: "node-1", Tracer: "off", WaitForReportedInUse: true, BackoffInitialMs: 50, BackoffMaxMs: 200, CSI: csi},
		NodeName:         "node-1",
		PodManager:       e.pods,
		PodStateProvider: e.pods,
		KubeClient:       e.client,
		PopulatorPeriod:  20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, sources); close(done) }()
	var once sync.Once
	// stop is the kubelet exiting: volmgr stops, mounts stay.
	e.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = m.Close()
		})
	}
	t.Cleanup(func() {
		e.stop()
		for _, p := range mountsUnder(t, dir) {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	})
	return e
}

func mountsUnder(t testing.TB, dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	// Deepest first.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func testPod(uid, host string, vols ...v1.Volume) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid, Namespace: "ns", UID: k8stypes.UID(uid), ResourceVersion: "1"},
		Spec: v1.PodSpec{
			NodeName: "node-1",
			Volumes: append([]v1.Volume{
				{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: host}}},
				{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{
					Medium: v1.StorageMediumMemory, SizeLimit: resource.NewQuantity(4<<20, resource.BinarySI)}}},
			}, vols...),
		},
	}
	c := v1.Container{Name: "c"}
	for _, v := range p.Spec.Volumes {
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	p.Spec.Containers = []v1.Container{c}
	return p
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A pod from the pod manager is mounted; its volumes stay while the pod
// workers still have its runtime, even once it is gone from the pod
// manager; they go once ShouldPodRuntimeBeRemoved.
func TestPodLifecycle(t *testing.T) {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns", ResourceVersion: "1"}, Data: map[string]string{"key": "value"}}
	e := start(t, cm)
	pod := testPod("uid-1", "", v1.Volume{Name: "conf", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}})
	pod.Spec.Volumes[0].HostPath.Path = e.host
	e.pods.add(pod)
	var vm volumemanager.VolumeManager = e.m
	if err := vm.WaitForAttachAndMount(waitCtx(t, 30*time.Second), pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(types.UniquePodName(pod.UID))
	if len(vols) != 3 {
		t.Fatalf("volumes %v", vols)
	}
	for name, v := range vols {
		if v.Mounter == nil || v.Mounter.GetPath() == "" || v.BlockVolumeMapper != nil || v.InnerVolumeSpecName != name {
			t.Fatalf("%s: %+v", name, v)
		}
	}
	if p := vols["host"].Mounter.GetPath(); p != e.host {
		t.Fatalf("hostPath at %s", p)
	}
	if a := vols["conf"].Mounter.GetAttributes(); !a.ReadOnly || !a.SELinuxRelabel {
		t.Fatalf("configMap attributes %+v", a)
	}
	if a := vols["host"].Mounter.GetAttributes(); a.ReadOnly || a.SELinuxRelabel || a.Managed {
		t.Fatalf("hostPath attributes %+v", a)
	}
	if b, err := os.ReadFile(filepath.Join(vols["conf"].Mounter.GetPath(), "key")); err != nil || string(b) != "value" {
		t.Fatalf("configMap content %q %v", b, err)
	}
	memPath := vols["mem"].Mounter.GetPath()
	if !strings.HasPrefix(memPath, filepath.Join(e.root, "pods", "uid-1")) || !isMount(t, memPath) {
		t.Fatalf("emptyDir %s not mounted", memPath)
	}
	if _, err := vols["mem"].Mounter.GetMetrics(); err != nil {
		t.Fatalf("metrics: %v", err)
	}
	if !vm.HasPossiblyMountedVolumesForPod(types.UniquePodName(pod.UID)) {
		t.Fatal("HasPossiblyMountedVolumesForPod false")
	}
	if g := vm.GetExtraSupplementalGroupsForPod(pod); len(g) != 0 {
		t.Fatalf("groups %v", g)
	}
	if err := vm.ResizeEphemeralVolume(pod, "mem", resource.NewQuantity(8<<20, resource.BinarySI)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"nope": "volume nope not found in pod p-uid-1",
		"host": "volume host does not support direct resizing",
	} {
		if err := vm.ResizeEphemeralVolume(pod, name, resource.NewQuantity(1, resource.BinarySI)); err == nil || err.Error() != want {
			t.Fatalf("resize %s: %v", name, err)
		}
	}

	// Deleted from the pod manager, containers still running: kept.
	e.pods.del(pod.UID)
	time.Sleep(300 * time.Millisecond)
	if !isMount(t, memPath) || !vm.HasPossiblyMountedVolumesForPod(types.UniquePodName(pod.UID)) {
		t.Fatal("volumes torn down before the runtime was removed")
	}
	// The pod workers removed its runtime: torn down.
	e.pods.setRemoved(pod.UID)
	if err := vm.WaitForAllPodsUnmount(waitCtx(t, 30*time.Second), []*v1.Pod{pod}); err != nil {
		t.Fatal(err)
	}
	if isMount(t, memPath) || vm.HasPossiblyMountedVolumesForPod(types.UniquePodName(pod.UID)) {
		t.Fatal("still mounted")
	}
	if len(vm.GetMountedVolumesForPod(types.UniquePodName(pod.UID))) != 0 {
		t.Fatal("volume map not empty")
	}
}

// A terminated pod still in the pod manager (a finished Job) loses its
// volumes once its runtime is removed, not when its phase says so.
func TestTerminalPodWaitsForRuntime(t *testing.T) {
	e := start(t)
	pod := testPod("uid-2", e.host)
	e.pods.add(pod)
	if err := e.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), pod); err != nil {
		t.Fatal(err)
	}
	done := pod.DeepCopy()
	done.ResourceVersion = "2"
	done.Status.Phase = v1.PodSucceeded
	e.pods.add(done)
	time.Sleep(300 * time.Millisecond)
	if !e.m.HasPossiblyMountedVolumesForPod(types.UniquePodName(pod.UID)) {
		t.Fatal("a Succeeded pod's volumes went before its runtime was removed")
	}
	e.pods.setRemoved(pod.UID)
	if err := e.m.WaitForUnmount(waitCtx(t, 30*time.Second), done); err != nil {
		t.Fatal(err)
	}
}

// The kubelet's error text: a claim that is not bound fails the wait at
// once (the kubelet's pod error); a pod volmgr never got times out.
func TestWaitForAttachAndMountErrors(t *testing.T) {
	pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "ns", ResourceVersion: "1"}}
	e := start(t, pvc)
	pod := testPod("uid-3", e.host, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}})
	e.pods.add(pod)
	start := time.Now()
	err := e.m.WaitForAttachAndMount(waitCtx(t, 20*time.Second), pod)
	prefix := "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: "
	if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), "not bound") {
		t.Fatalf("error %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("a pod error took %v", time.Since(start))
	}
	var limit *volumemanager.VolumeAttachLimitExceededError
	if errors.As(err, &limit) {
		t.Fatal("not an attach limit")
	}

	// Never in the pod manager: not processed; the context's deadline.
	lost := testPod("uid-4", e.host)
	err = e.m.WaitForAttachAndMount(waitCtx(t, time.Second), lost)
	want := "unmounted volumes=[host mem], unattached volumes=[], failed to process volumes=[host mem]: context deadline exceeded"
	if err == nil || err.Error() != want || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v", err)
	}
	// No volume used by a container: nothing to wait for.
	if err := e.m.WaitForAttachAndMount(context.Background(), &v1.Pod{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.WaitForAttachAndMount(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

// A VolumeAttachment failed with ResourceExhausted, its CSIDriver updating
// the node's allocatable count: the kubelet's attach-limit error.
func TestAttachLimitExceeded(t *testing.T) {
	attach, period := true, int64(10)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "d.example", ResourceVersion: "1"},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attach, NodeAllocatableUpdatePeriodSeconds: &period}}
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1", ResourceVersion: "1"},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			ClaimRef:               &v1.ObjectReference{Namespace: "ns", Name: "claim"},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example", VolumeHandle: "h1"}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound}}
	pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "ns", ResourceVersion: "1"},
		Spec:   v1.PersistentVolumeClaimSpec{VolumeName: "pv-1", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound}}
	code := int32(8)
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: attachmentName("h1", "d.example", "node-1"), ResourceVersion: "1"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "d.example", NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
		Status: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "too many", ErrorCode: &code}}}
	e := startWith(t, &volmgr.CSIConfig{}, driver, pv, pvc, va)
	pod := testPod("uid-5", e.host, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}})
	e.pods.add(pod)
	err := e.m.WaitForAttachAndMount(waitCtx(t, 3*time.Second), pod)
	var limit *volumemanager.VolumeAttachLimitExceededError
	if !errors.As(err, &limit) {
		t.Fatalf("error %v", err)
	}
	// As the kubelet's: the failed attachment is waited through (volmgr's
	// status says `unresolved: attach_limit`, not a pod error), and when the
	// wait times out the pod is rejected.
	want := "Node has reached its volume attachment limit, rejecting pod. unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[]: "
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("error %q", err)
	}
}

// The node status' calls.
func TestVolumesInUse(t *testing.T) {
	e := start(t)
	deadline := time.Now().Add(20 * time.Second)
	for !e.m.ReconcilerStatesHasBeenSynced() {
		if time.Now().After(deadline) {
			t.Fatal("never synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := e.m.GetVolumesInUse(); len(v) != 0 {
		t.Fatalf("in use %v", v)
	}
	e.m.MarkVolumesAsReportedInUse([]v1.UniqueVolumeName{"kubernetes.io/csi/d^h"})
	if e.m.VolumeIsAttached("kubernetes.io/csi/d^h") {
		t.Fatal("attached")
	}
}

// sourcesFlag is a SourcesReady the test turns on.
type sourcesFlag struct{ on atomic.Bool }

func (s *sourcesFlag) AllReady() bool   { return s.on.Load() }
func (s *sourcesFlag) AddSource(string) {}

// mountID is the mount ID of the mount at path (0: none).
func mountID(t testing.TB, path string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return f[0]
		}
	}
	return ""
}

// A restarted kubelet: nothing is torn down until the sources are ready;
// then the volumes of a pod the pod manager delivered again are adopted
// (same mount), those of a pod gone meanwhile torn down.
func TestRestartWaitsForSources(t *testing.T) {
	dir := t.TempDir()
	e1 := startIn(t, dir, ready(true), nil)
	keep, gone := testPod("uid-6", e1.host), testPod("uid-7", e1.host)
	e1.pods.add(keep)
	e1.pods.add(gone)
	for _, p := range []*v1.Pod{keep, gone} {
		if err := e1.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), p); err != nil {
			t.Fatal(err)
		}
	}
	keepPath := e1.m.GetMountedVolumesForPod(types.UniquePodName(keep.UID))["mem"].Mounter.GetPath()
	gonePath := e1.m.GetMountedVolumesForPod(types.UniquePodName(gone.UID))["mem"].Mounter.GetPath()
	id := mountID(t, keepPath)
	if id == "" || mountID(t, gonePath) == "" {
		t.Fatal("not mounted")
	}
	e1.stop()

	sources := &sourcesFlag{}
	e2 := startIn(t, dir, sources, nil)
	e2.pods.add(keep)
	time.Sleep(500 * time.Millisecond)
	if mountID(t, gonePath) == "" {
		t.Fatal("torn down before the sources were ready")
	}
	sources.on.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	for mountID(t, gonePath) != "" {
		if time.Now().After(deadline) {
			t.Fatal("the pod gone meanwhile keeps its volume")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := e2.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), keep); err != nil {
		t.Fatal(err)
	}
	if got := mountID(t, keepPath); got != id {
		t.Fatalf("mount %s, was %s", got, id)
	}
}

// A configMap read again once its time to live is over updates the volume.
func TestObjectRefresh(t *testing.T) {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns", ResourceVersion: "1"}, Data: map[string]string{"key": "one"}}
	e := start(t, cm)
	var mu sync.Mutex
	now := time.Now()
	e.m.objects.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	pod := testPod("uid-8", e.host, v1.Volume{Name: "conf", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}})
	e.pods.add(pod)
	if err := e.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), pod); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.m.GetMountedVolumesForPod(types.UniquePodName(pod.UID))["conf"].Mounter.GetPath(), "key")
	cm2 := cm.DeepCopy()
	cm2.ResourceVersion, cm2.Data["key"] = "2", "two"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(context.Background(), cm2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Within its time to live: not read again.
	if err := e.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), pod); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if b, _ := os.ReadFile(file); string(b) != "one" {
		t.Fatalf("content %q before the TTL", b)
	}
	mu.Lock()
	now = now.Add(2 * objectTTL)
	mu.Unlock()
	if err := e.m.WaitForAttachAndMount(waitCtx(t, 30*time.Second), pod); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, _ := os.ReadFile(file); string(b) == "two" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("configMap update not written")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isMount(t testing.TB, path string) bool {
	for _, p := range mountsUnder(t, filepath.Dir(path)) {
		if p == path {
			return true
		}
	}
	return false
}
