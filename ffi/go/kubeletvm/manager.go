// Package kubeletvm is the kubelet's volume manager
// (k8s.io/kubernetes/pkg/kubelet/volumemanager.VolumeManager, v1.37) over
// libvolmgr (volmgr/ffi/go/volmgr): a kubelet whose one change is the call
// volumemanager.NewVolumeManager( in pkg/kubelet/kubelet.go turned into
// kubeletvm.NewVolumeManager( (same arguments) mounts, sets up and tears
// down every volume through volmgr. scripts/kubelet-fork.sh builds such a
// kubelet with `go build -overlay`, no Kubernetes source kept.
//
// What feeds volmgr (the kubelet's desired-state populator, redone here):
//   - pods: every 100 ms the pod manager's pods are upserted (those whose
//     containers may start), and a pod is deleted from volmgr only once the
//     pod workers say ShouldPodRuntimeBeRemoved (its containers are gone);
//   - objects: the claims, volumes, configMaps, secrets, CSIDrivers,
//     VolumeAttachments and service accounts a pod refers to are read with
//     GETs (as the Node authorizer allows) when the pod is upserted and at
//     each WaitForAttachAndMount, again once their time to live is over;
//   - the Node (volumesAttached) through an informer on this node only;
//   - service account tokens through TokenRequests of the kubelet's client.
package kubeletvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	k8stypes "k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager/volumehealth"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/util"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/types"
	"k8s.io/kubernetes/pkg/volume/util/volumepathhandler"
	"k8s.io/mount-utils"

	"volmgr/ffi/go/volmgr"
)

// The kubelet's constants (pkg/kubelet/volumemanager/volume_manager.go).
const (
	populatorPeriod                = 100 * time.Millisecond
	podAttachAndMountTimeout       = 2*time.Minute + 3*time.Second
	podAttachAndMountRetryInterval = 300 * time.Millisecond
)

// Options configure a Manager made by New (NewVolumeManager fills them from
// the kubelet's arguments).
type Options struct {
	// Config is volmgr's; RootDir is required.
	Config           volmgr.Config
	NodeName         k8stypes.NodeName
	PodManager       volumemanager.PodManager
	PodStateProvider volumemanager.PodStateProvider
	// KubeClient may be nil (a standalone kubelet): no objects, no tokens.
	KubeClient clientset.Interface
	// VolumePluginMgr, if set, is run in Run (its CSIDriver informer, which
	// other parts of the kubelet read), as the kubelet's volume manager does.
	VolumePluginMgr *volume.VolumePluginMgr
	Recorder        record.EventRecorder
	// PopulatorPeriod: how often the pod manager is read (default 100 ms).
	PopulatorPeriod time.Duration
}

// Manager implements volumemanager.VolumeManager over volmgr.
type Manager struct {
	vm       *volmgr.Manager
	opts     Options
	objects  *objectCache
	recorder record.EventRecorder

	mu           sync.Mutex
	pods         map[k8stypes.UID]*trackedPod
	hasAddedPods bool
	lastInUse    []v1.UniqueVolumeName
	rejected     map[k8stypes.UID]string
}

type trackedPod struct {
	pod *v1.Pod
	rv  string
}

var _ volumemanager.VolumeManager = (*Manager)(nil)

// NewVolumeManager has volumemanager.NewVolumeManager's signature: the
// kubelet fork calls it instead. The kubelet's root is the parent of
// kubeletPodsDir. VOLMGR_TRACER (auto, off, ebpf, ...) picks volmgr's
// tracer. A volmgr that cannot be created ends the kubelet, as the kubelet
// cannot run without its volume manager.
func NewVolumeManager(
	controllerAttachDetachEnabled bool,
	nodeName k8stypes.NodeName,
	podManager volumemanager.PodManager,
	podStateProvider volumemanager.PodStateProvider,
	kubeClient clientset.Interface,
	volumePluginMgr *volume.VolumePluginMgr,
	mounter mount.Interface,
	hostutil hostutil.HostUtils,
	kubeletPodsDir string,
	recorder record.EventRecorder,
	blockVolumePathHandler volumepathhandler.BlockVolumePathHandler,
	volumeHealthStatusUpdater volumehealth.StatusUpdater,
	volumeHealthProbeInterval time.Duration) volumemanager.VolumeManager {

	rootDir := filepath.Dir(kubeletPodsDir)
	// The kubelet makes its root a shared mount (a bind onto itself where
	// it is not a mount point) in setupDataDirs, after this call. volmgr
	// opens the root now: its descriptors would then be of the covered
	// directory, and every tmpfs it mounted through them would be hidden
	// under the bind (the paths showing the empty directories), then
	// mounted again over them by the next kubelet process. So the root is
	// made shared first, with the kubelet's own code (a no-op for it later).
	if err := os.MkdirAll(rootDir, 0o750); err != nil {
		klog.ErrorS(err, "Cannot create the kubelet's root directory", "path", rootDir)
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if hostutil != nil {
		if err := hostutil.MakeRShared(rootDir); err != nil {
			klog.ErrorS(err, "Cannot make the kubelet's root directory shared", "path", rootDir)
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
	}
	cfg := volmgr.Config{
		RootDir:  rootDir,
		NodeName: string(nodeName),
		Tracer:   os.Getenv("VOLMGR_TRACER"),
		// The kubelet's reconciler sets an attachable volume up once the
		// node status lists it in volumesInUse, and with the attach/detach
		// controller once the Node lists it in volumesAttached.
		WaitForReportedInUse:   true,
		WaitForVolumesAttached: controllerAttachDetachEnabled,
		CSI:                    &volmgr.CSIConfig{WatchPluginsRegistry: true},
	}
	if volumeHealthProbeInterval > 0 {
		// The kubelet passes its volumeStatsAggPeriod here.
		cfg.VolumeStatsPeriodMs = uint64(volumeHealthProbeInterval.Milliseconds())
	}
	m, err := New(Options{
		Config:           cfg,
		NodeName:         nodeName,
		PodManager:       podManager,
		PodStateProvider: podStateProvider,
		KubeClient:       kubeClient,
		VolumePluginMgr:  volumePluginMgr,
		Recorder:         recorder,
	})
	if err != nil {
		klog.ErrorS(err, "Cannot create the volmgr volume manager")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.InfoS("Volume manager: volmgr", "rootDir", cfg.RootDir, "controllerAttachDetach", controllerAttachDetachEnabled)
	return m
}

// New creates a Manager (volmgr not started: Run starts it).
func New(o Options) (*Manager, error) {
	if o.PodManager == nil || o.PodStateProvider == nil {
		return nil, errors.New("kubeletvm: PodManager and PodStateProvider are required")
	}
	if o.PopulatorPeriod <= 0 {
		o.PopulatorPeriod = populatorPeriod
	}
	vm, err := volmgr.New(o.Config)
	if err != nil {
		return nil, err
	}
	rec := o.Recorder
	if rec == nil {
		rec = &record.FakeRecorder{}
	}
	m := &Manager{
		vm:       vm,
		opts:     o,
		recorder: rec,
		pods:     map[k8stypes.UID]*trackedPod{},
		rejected: map[k8stypes.UID]string{},
	}
	m.objects = newObjectCache(o.KubeClient, vm, string(o.NodeName))
	if o.KubeClient != nil {
		if err := vm.SetTokenSource(tokenSource{o.KubeClient}); err != nil {
			_ = vm.Close()
			return nil, err
		}
	}
	return m, nil
}

// Volmgr is the volmgr handle underneath (status, metrics).
func (m *Manager) Volmgr() *volmgr.Manager { return m.vm }

// Run starts volmgr and the populator; when ctx ends volmgr stops (mounts
// stay in place, as when the kubelet exits).
func (m *Manager) Run(ctx context.Context, sourcesReady config.SourcesReady) {
	logger := klog.FromContext(ctx)
	if m.opts.KubeClient != nil && m.opts.VolumePluginMgr != nil {
		go m.opts.VolumePluginMgr.Run(ctx.Done())
	}
	events, err := m.vm.Events(1024)
	if err != nil {
		logger.Error(err, "volmgr events")
	} else {
		go m.forwardEvents(events)
	}
	if err := m.vm.Start(); err != nil {
		logger.Error(err, "Cannot start the volmgr volume manager")
		return
	}
	logger.Info("Starting Kubelet Volume Manager (volmgr)")
	if m.opts.KubeClient != nil {
		go m.watchNode(ctx)
	}
	go m.populate(ctx, sourcesReady)
	<-ctx.Done()
	logger.Info("Shutting down Kubelet Volume Manager (volmgr)")
	if err := m.vm.Stop(); err != nil {
		logger.Error(err, "Stopping volmgr")
	}
}

// populate is the kubelet's desired-state populator loop: until a pass
// that began with the sources ready has run, pods whose runtime may be
// removed are not added (a restarted kubelet keeps what may still run);
// then volmgr is told the sources are ready.
func (m *Manager) populate(ctx context.Context, sourcesReady config.SourcesReady) {
	_ = wait.PollUntilContextCancel(ctx, m.opts.PopulatorPeriod, false, func(ctx context.Context) (bool, error) {
		done := sourcesReady.AllReady()
		m.populatorPass(ctx)
		if done {
			m.mu.Lock()
			m.hasAddedPods = true
			m.mu.Unlock()
			if err := m.vm.SourcesReady(); err != nil {
				klog.FromContext(ctx).Error(err, "volmgr SourcesReady")
			}
		}
		return done, nil
	})
	wait.UntilWithContext(ctx, m.populatorPass, m.opts.PopulatorPeriod)
}

// populatorPass adds new pods and removes those whose runtime is gone.
func (m *Manager) populatorPass(ctx context.Context) {
	m.mu.Lock()
	hasAdded := m.hasAddedPods
	m.mu.Unlock()
	ps := m.opts.PodStateProvider
	for _, pod := range m.opts.PodManager.GetPods() {
		if hasAdded && ps.ShouldPodContainersBeTerminating(pod.UID) {
			// Do not (re)add volumes for pods that can't also be starting containers.
			continue
		}
		if !hasAdded && ps.ShouldPodRuntimeBeRemoved(pod.UID) {
			continue
		}
		m.upsertPod(ctx, pod)
	}
	m.mu.Lock()
	var gone []k8stypes.UID
	for uid := range m.pods {
		if _, ok := m.opts.PodManager.GetPodByUID(uid); ok && !ps.ShouldPodRuntimeBeRemoved(uid) {
			continue
		}
		// Deleted from the pod manager, or terminated: its volumes go
		// only once the pod workers say its containers are gone.
		if ps.ShouldPodRuntimeBeRemoved(uid) {
			gone = append(gone, uid)
		}
	}
	m.mu.Unlock()
	for _, uid := range gone {
		m.removePod(ctx, uid)
	}
}

func (m *Manager) removePod(ctx context.Context, uid k8stypes.UID) {
	if err := m.vm.DeletePod(string(uid)); err != nil && !errors.Is(err, volmgr.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "volmgr DeletePod", "podUID", uid)
		return
	}
	m.mu.Lock()
	delete(m.pods, uid)
	delete(m.rejected, uid)
	m.mu.Unlock()
}

// upsertPod gives volmgr the pod when it is new or changed.
func (m *Manager) upsertPod(ctx context.Context, pod *v1.Pod) {
	m.mu.Lock()
	t, ok := m.pods[pod.UID]
	if ok && (t.pod == pod || (pod.ResourceVersion != "" && t.rv == pod.ResourceVersion)) {
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	// The objects first, so volmgr converts the pod with them.
	m.objects.syncPod(ctx, pod)
	b, err := podJSON(pod)
	if err == nil {
		err = m.vm.UpsertPod(b)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		// A rejected pod: WaitForAttachAndMount fails with this at once,
		// as with the kubelet's pod errors.
		m.rejected[pod.UID] = err.Error()
		klog.FromContext(ctx).Error(err, "volmgr rejected the pod", "pod", klog.KObj(pod))
		if !errors.Is(err, volmgr.ErrInvalidArgument) {
			return // retried at the next pass
		}
	} else {
		delete(m.rejected, pod.UID)
	}
	m.pods[pod.UID] = &trackedPod{pod: pod, rv: pod.ResourceVersion}
}

// podJSON is the pod as volmgr reads it. A terminal phase is left out:
// volmgr would give a Succeeded or Failed pod's volumes up at once, while
// the kubelet waits for the pod workers (ShouldPodRuntimeBeRemoved).
func podJSON(pod *v1.Pod) ([]byte, error) {
	p := *pod
	p.TypeMeta.Kind, p.TypeMeta.APIVersion = "Pod", "v1"
	if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		p.Status.Phase = v1.PodRunning
	}
	return json.Marshal(&p)
}

// WaitForAttachAndMount waits, as the kubelet does (2 min 3 s at most,
// every 300 ms), until every volume the pod's containers use is mounted.
// Its error is the kubelet's: "unmounted volumes=[…], unattached
// volumes=[…], failed to process volumes=[…]: …", or a
// *volumemanager.VolumeAttachLimitExceededError.
func (m *Manager) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	if pod == nil {
		return nil
	}
	expected := getExpectedVolumes(pod)
	if len(expected) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	logger.V(3).Info("Waiting for volumes to attach and mount for pod", "pod", klog.KObj(pod))
	uid := pod.UID
	// The kubelet reprocesses the pod here: the objects it reads are read
	// again once their time to live is over.
	m.objects.syncPod(ctx, pod)
	err := wait.PollUntilContextTimeout(ctx, podAttachAndMountRetryInterval, podAttachAndMountTimeout, true,
		func(ctx context.Context) (bool, error) {
			if len(m.unmountedVolumes(uid, expected)) == 0 {
				return true, nil
			}
			if errs := m.podErrors(uid, expected); len(errs) > 0 {
				return true, errors.New(strings.Join(errs, "; "))
			}
			m.objects.syncPod(ctx, pod)
			return false, nil
		})
	if err == nil {
		logger.V(3).Info("All volumes are attached and mounted for pod", "pod", klog.KObj(pod))
		return nil
	}
	unmounted := m.unmountedVolumes(uid, expected)
	if len(unmounted) == 0 {
		return nil
	}
	unattached, exhausted := m.unattachedVolumes(ctx, pod, expected)
	// volmgr does not convert a volume whose attachment failed for the
	// attach limit; the kubelet has it as desired, not attached.
	notProcessed := slices.DeleteFunc(m.volumesNotProcessed(uid, expected), func(v string) bool { return exhausted.Has(v) })
	if exhausted.Len() > 0 && utilfeature.DefaultFeatureGate.Enabled(features.MutableCSINodeAllocatableCount) {
		return &volumemanager.VolumeAttachLimitExceededError{
			UnmountedVolumes:  unmounted,
			UnattachedVolumes: unattached,
			VolumesNotInDSW:   notProcessed,
			OriginalError:     err,
		}
	}
	return fmt.Errorf("unmounted volumes=%v, unattached volumes=%v, failed to process volumes=%v: %w",
		unmounted, unattached, notProcessed, err)
}

// getExpectedVolumes: the volumes the pod's containers mount or map.
func getExpectedVolumes(pod *v1.Pod) []string {
	mounts, devices, _ := util.GetPodVolumeNames(pod, false)
	return sets.List(mounts.Union(devices))
}

// unmountedVolumes: the expected volumes volmgr has not mounted (uncertain
// ones included), sorted.
func (m *Manager) unmountedVolumes(uid k8stypes.UID, expected []string) []string {
	vols, err := m.vm.GetMountedVolumesForPod(string(uid))
	mounted := sets.New[string]()
	if err == nil {
		for _, v := range vols {
			if v.State == "mounted" {
				mounted.Insert(v.OuterVolumeSpecName)
			}
		}
	}
	out := []string{}
	for _, name := range expected {
		if !mounted.Has(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// statusPod is one pod of volmgr's status document.
type statusPod struct {
	UID     string  `json:"uid"`
	Error   *string `json:"error"`
	Volumes []struct {
		Name     string  `json:"name"`
		Plugin   string  `json:"plugin"`
		State    string  `json:"state"`
		Attempts uint32  `json:"attempts"`
		Error    *string `json:"error"`
		// What an unresolved volume's error means to the wait: pod_error,
		// waiting or attach_limit (volmgr's status).
		Unresolved string `json:"unresolved"`
	} `json:"volumes"`
}

func (m *Manager) statusOf(uid k8stypes.UID) (*statusPod, bool) {
	raw, err := m.vm.StatusJSON()
	if err != nil {
		return nil, false
	}
	var st struct {
		Pods []statusPod `json:"pods"`
	}
	if json.Unmarshal(raw, &st) != nil {
		return nil, false
	}
	for i := range st.Pods {
		if st.Pods[i].UID == string(uid) {
			return &st.Pods[i], true
		}
	}
	return nil, false
}

// podErrors are the kubelet's pod errors (PopPodErrors): the pod rejected,
// or expected volumes that could not be processed (a claim not bound, a
// missing PV): the wait ends at once with them.
func (m *Manager) podErrors(uid k8stypes.UID, expected []string) []string {
	m.mu.Lock()
	rej, ok := m.rejected[uid]
	m.mu.Unlock()
	if ok {
		return []string{rej}
	}
	p, ok := m.statusOf(uid)
	if !ok {
		return nil
	}
	var errs []string
	if p.Error != nil && *p.Error != "" {
		errs = append(errs, *p.Error)
	}
	want := sets.New(expected...)
	for _, v := range p.Volumes {
		if isPodError(v.State, v.Attempts, v.Unresolved) && want.Has(v.Name) && v.Error != nil {
			errs = append(errs, fmt.Sprintf("error processing volume %q: %s", v.Name, *v.Error))
		}
	}
	return errs
}

// notConverted: a volume volmgr could not convert (its claim not bound,
// its PV missing: not in its desired state), not one whose set-up failed
// (that has attempts, and is retried as the kubelet's reconciler does).
func notConverted(state string, attempts uint32) bool { return state == "error" && attempts == 0 }

// isPodError: a volume volmgr could not convert for a reason the kubelet
// counts as the pod's error (its AddErrorToPod: the wait ends at once), not
// one it waits through (a missing Secret or ConfigMap, a VolumeAttachment
// not there or not attached yet: still "unmounted" or "unattached").
func isPodError(state string, attempts uint32, unresolved string) bool {
	return notConverted(state, attempts) && (unresolved == "" || unresolved == "pod_error")
}

// volumesNotProcessed: the expected volumes volmgr does not have as
// desired (not upserted yet, or not converted: the kubelet's "not in DSW").
func (m *Manager) volumesNotProcessed(uid k8stypes.UID, expected []string) []string {
	notIn := sets.New(expected...)
	if p, ok := m.statusOf(uid); ok {
		for _, v := range p.Volumes {
			if !isPodError(v.State, v.Attempts, v.Unresolved) {
				notIn.Delete(v.Name)
			}
		}
	}
	return sets.List(notIn)
}

// unattachedVolumes: the expected volumes from attachable CSI
// PersistentVolumes (their CSIDriver does not say attachRequired: false)
// not attached yet, and those of them whose VolumeAttachment failed with
// ResourceExhausted while their CSIDriver updates the node's allocatable
// count (the kubelet's VerifyExhaustedResource).
func (m *Manager) unattachedVolumes(ctx context.Context, pod *v1.Pod, expected []string) ([]string, sets.Set[string]) {
	want := sets.New(expected...)
	out := []string{}
	exhausted := sets.New[string]()
	for _, vol := range pod.Spec.Volumes {
		if !want.Has(vol.Name) {
			continue
		}
		pv := m.objects.podVolumePV(pod, &vol)
		if pv == nil || pv.Spec.CSI == nil || !m.objects.attachRequired(pv.Spec.CSI.Driver) {
			continue
		}
		name := csiUniqueVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
		if ok, err := m.vm.VolumeIsAttached(name); err == nil && ok {
			continue
		}
		out = append(out, vol.Name)
		if m.objects.attachExhausted(ctx, pv) {
			exhausted.Insert(vol.Name)
		}
	}
	slices.Sort(out)
	return out, exhausted
}

// csiUniqueVolumeName is the kubelet's unique name of a CSI volume.
func csiUniqueVolumeName(driver, handle string) string {
	return "kubernetes.io/csi/" + driver + "^" + handle
}

// WaitForUnmount waits until nothing of the pod is mounted (or uncertain);
// a pod whose runtime the pod workers removed is given up at once (the
// kubelet reprocesses it here).
func (m *Manager) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	if pod == nil {
		return nil
	}
	logger := klog.FromContext(ctx)
	logger.V(3).Info("Waiting for volumes to unmount for pod", "pod", klog.KObj(pod))
	uid := pod.UID
	m.mu.Lock()
	_, tracked := m.pods[uid]
	m.mu.Unlock()
	if tracked && m.opts.PodStateProvider.ShouldPodRuntimeBeRemoved(uid) {
		m.removePod(ctx, uid)
	}
	mounted := func() []v1.UniqueVolumeName {
		vols, err := m.vm.GetPossiblyMountedVolumesForPod(string(uid))
		if err != nil {
			return []v1.UniqueVolumeName{"(volmgr: " + v1.UniqueVolumeName(err.Error()) + ")"}
		}
		var out []v1.UniqueVolumeName
		for _, v := range vols {
			out = append(out, v1.UniqueVolumeName(v.VolumeName))
		}
		return out
	}
	err := wait.PollUntilContextTimeout(ctx, podAttachAndMountRetryInterval, podAttachAndMountTimeout, true,
		func(context.Context) (bool, error) { return len(mounted()) == 0, nil })
	if err != nil {
		left := mounted()
		if len(left) == 0 {
			return nil
		}
		slices.Sort(left)
		return fmt.Errorf("mounted volumes=%v: %w", left, err)
	}
	logger.V(3).Info("All volumes are unmounted for pod", "pod", klog.KObj(pod))
	return nil
}

// WaitForAllPodsUnmount is WaitForUnmount for each pod at once.
func (m *Manager) WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error {
	if len(pods) == 0 {
		return nil
	}
	funcs := make([]func() error, 0, len(pods))
	for _, pod := range pods {
		funcs = append(funcs, func() error { return m.WaitForUnmount(ctx, pod) })
	}
	return utilerrors.AggregateGoroutines(funcs...)
}

// GetMountedVolumesForPod: the pod's mounted volumes by their name in the
// pod, with mounters (GetPath, GetAttributes, GetMetrics) and, for
// volumeDevices, block mappers (GetPodDeviceMapPath).
func (m *Manager) GetMountedVolumesForPod(podName types.UniquePodName) container.VolumeMap {
	out := make(container.VolumeMap)
	vols, err := m.vm.GetMountedVolumesForPod(string(podName))
	if err != nil {
		return out
	}
	var pod *v1.Pod
	if p, ok := m.opts.PodManager.GetPodByUID(k8stypes.UID(podName)); ok {
		pod = p
	}
	for _, v := range vols {
		if v.State != "mounted" {
			continue
		}
		info := container.VolumeInfo{
			ReadOnly:            v.ReadOnly,
			InnerVolumeSpecName: m.objects.innerVolumeSpecName(pod, v.OuterVolumeSpecName),
		}
		if v.BlockDevicePath != "" {
			info.BlockVolumeMapper = &blockMapper{path: v.BlockDevicePath}
		} else {
			info.Mounter = newMounter(v)
		}
		out[v.OuterVolumeSpecName] = info
	}
	return out
}

// HasPossiblyMountedVolumesForPod: mounted or uncertain volumes (true when
// volmgr cannot answer: the kubelet must then keep the pod's directories).
func (m *Manager) HasPossiblyMountedVolumesForPod(podName types.UniquePodName) bool {
	return m.vm.HasPossiblyMountedVolumesForPod(string(podName))
}

// GetExtraSupplementalGroupsForPod: the pv.beta.kubernetes.io/gid GIDs of
// the pod's mounted PVs it does not ask for already.
func (m *Manager) GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64 {
	if pod == nil {
		return nil
	}
	g, err := m.vm.GetExtraSupplementalGroupsForPod(string(pod.UID))
	if err != nil {
		return []int64{}
	}
	if g == nil {
		g = []int64{}
	}
	return g
}

// GetVolumesInUse: volmgr's attachable volumes in use, and those of the
// pods given to volmgr (the kubelet's desired state of world has them at
// once; volmgr converts one only once its VolumeAttachment exists). Before
// volmgr's states have synced it answers busy: the last list is kept (the
// node status setter asks only once ReconcilerStatesHasBeenSynced anyway).
func (m *Manager) GetVolumesInUse() []v1.UniqueVolumeName {
	names, err := m.vm.GetVolumesInUse()
	if err != nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		return slices.Clone(m.lastInUse)
	}
	out := append([]v1.UniqueVolumeName{}, m.desiredAttachable()...)
	for _, n := range names {
		out = append(out, v1.UniqueVolumeName(n))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	slices.Sort(out)
	out = slices.Compact(out)
	m.lastInUse = out
	return slices.Clone(out)
}

// desiredAttachable: the attachable CSI volumes (PVs whose CSIDriver, as
// last read, does not say attachRequired: false) of the pods volmgr has,
// whether or not volmgr could convert them yet.
func (m *Manager) desiredAttachable() []v1.UniqueVolumeName {
	m.mu.Lock()
	pods := make([]*v1.Pod, 0, len(m.pods))
	for _, t := range m.pods {
		pods = append(pods, t.pod)
	}
	m.mu.Unlock()
	var out []v1.UniqueVolumeName
	for _, pod := range pods {
		for i := range pod.Spec.Volumes {
			pv := m.objects.podVolumePV(pod, &pod.Spec.Volumes[i])
			if pv == nil || pv.Spec.CSI == nil || !m.objects.attachRequired(pv.Spec.CSI.Driver) {
				continue
			}
			out = append(out, v1.UniqueVolumeName(csiUniqueVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)))
		}
	}
	return out
}

// ReconcilerStatesHasBeenSynced is volmgr's.
func (m *Manager) ReconcilerStatesHasBeenSynced() bool { return m.vm.ReconcilerStatesHasBeenSynced() }

// VolumeIsAttached is volmgr's (false when it cannot answer).
func (m *Manager) VolumeIsAttached(volumeName v1.UniqueVolumeName) bool {
	ok, err := m.vm.VolumeIsAttached(string(volumeName))
	return err == nil && ok
}

// MarkVolumesAsReportedInUse: what the node status lists in volumesInUse.
func (m *Manager) MarkVolumesAsReportedInUse(volumesReportedAsInUse []v1.UniqueVolumeName) {
	names := make([]string, 0, len(volumesReportedAsInUse))
	for _, n := range volumesReportedAsInUse {
		names = append(names, string(n))
	}
	if err := m.vm.MarkVolumesAsReportedInUse(names); err != nil {
		klog.ErrorS(err, "volmgr MarkVolumesAsReportedInUse")
	}
}

// ResizeEphemeralVolume resizes a memory-backed emptyDir's tmpfs, with the
// kubelet's errors for what it refuses.
func (m *Manager) ResizeEphemeralVolume(pod *v1.Pod, volumeName string, newSize *resource.Quantity) error {
	var vol *v1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == volumeName {
			vol = &pod.Spec.Volumes[i]
			break
		}
	}
	if vol == nil {
		return fmt.Errorf("volume %s not found in pod %s", volumeName, pod.Name)
	}
	if vol.EmptyDir == nil {
		return fmt.Errorf("volume %s does not support direct resizing", volumeName)
	}
	if vol.EmptyDir.Medium != v1.StorageMediumMemory {
		return fmt.Errorf("only memory-backed emptyDir volumes support direct resize")
	}
	if newSize == nil || newSize.Value() == 0 {
		return fmt.Errorf("addition or removal of size limit is not supported")
	}
	err := m.vm.ResizeEphemeralVolume(string(pod.UID), volumeName, uint64(newSize.Value()))
	if errors.Is(err, volmgr.ErrBusy) || errors.Is(err, volmgr.ErrNotFound) {
		return fmt.Errorf("volume %s is not yet mounted; deferring resize: %w", volumeName, err)
	}
	return err
}

// Close frees volmgr (mounts stay); for tests and a kubelet that exits.
func (m *Manager) Close() error { return m.vm.Close() }
