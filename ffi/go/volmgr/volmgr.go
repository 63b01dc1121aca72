// Package volmgr wraps libvolmgr (the C ABI of volmgr, include/volmgr.h)
// for Go kubelet forks: a Manager mirrors the kubelet's VolumeManager
// interface, with Go errors, context deadlines and typed results.
//
// Build with the library on the linker path, e.g.
//
//	CGO_LDFLAGS="-L$REPO/target/release -l:libvolmgr.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
//
// (the native libraries are what `cargo rustc -p volmgr-ffi --lib
// --crate-type staticlib -- --print native-static-libs` prints).
package volmgr

/*
#cgo CFLAGS: -I${SRCDIR}/../../../include
#include <stdlib.h>
#include <string.h>
#include "volmgr.h"

// A call that does nothing, to measure the bare cgo overhead next to
// volmgr's calls.
static inline int volmgr_go_noop(int x) { return x; }

// The Go functions exported in callbacks.go, and C shims with the exact
// types of volmgr.h (the Go side takes char*, not const char*).
extern void volmgrGoEvent(void *userdata, char *event_json);
extern int volmgrGoCanSupport(void *userdata, char *spec_json);
extern volmgr_status volmgrGoSetUp(void *userdata, char *spec_json, char *target_dir, char *err, uintptr_t err_len);
extern volmgr_status volmgrGoTearDown(void *userdata, char *target_dir, char *err, uintptr_t err_len);
extern int32_t volmgrGoToken(void *userdata, char *request_json, char *token_buf, uintptr_t token_buf_len, int64_t *expiration_unix);

static void volmgr_go_event(void *u, const char *ev) { volmgrGoEvent(u, (char *)ev); }
static bool volmgr_go_can_support(void *u, const char *spec) { return volmgrGoCanSupport(u, (char *)spec) != 0; }
static volmgr_status volmgr_go_set_up(void *u, const char *spec, const char *dir, char *err, uintptr_t n) {
	return volmgrGoSetUp(u, (char *)spec, (char *)dir, err, n);
}
static volmgr_status volmgr_go_tear_down(void *u, const char *dir, char *err, uintptr_t n) {
	return volmgrGoTearDown(u, (char *)dir, err, n);
}

static int32_t volmgr_go_token(void *u, const char *req, char *buf, uintptr_t n, int64_t *exp) {
	return volmgrGoToken(u, (char *)req, buf, n, exp);
}

// The handle travels as an integer, so Go never turns a uintptr into a pointer.
static volmgr_status volmgr_go_set_token(volmgr *vm, uintptr_t handle) {
	return volmgr_set_token_callback(vm, volmgr_go_token, (void *)handle);
}

static volmgr_status volmgr_go_set_events(volmgr *vm, uintptr_t handle) {
	return volmgr_set_event_callback(vm, volmgr_go_event, (void *)handle);
}

static volmgr_status volmgr_go_register_plugin(volmgr *vm, const char *name, uintptr_t handle) {
	volmgr_plugin vt;
	vt.name = name;
	vt.can_support = volmgr_go_can_support;
	vt.set_up = volmgr_go_set_up;
	vt.tear_down = volmgr_go_tear_down;
	return volmgr_register_plugin(vm, &vt, (void *)handle);
}
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Status is a volmgr_status.
type Status uint32

// The statuses of include/volmgr.h.
const (
	OK              Status = C.VOLMGR_OK
	InvalidArgument Status = C.VOLMGR_ERR_INVALID_ARGUMENT
	NotFound        Status = C.VOLMGR_ERR_NOT_FOUND
	Timeout         Status = C.VOLMGR_ERR_TIMEOUT
	Busy            Status = C.VOLMGR_ERR_BUSY
	Unsupported     Status = C.VOLMGR_ERR_UNSUPPORTED
	Internal        Status = C.VOLMGR_ERR_INTERNAL
	// IO: the system refused (RootDir cannot be opened or used, reading
	// the mount table at Start failed).
	IO Status = C.VOLMGR_ERR_IO
	// PodVolumeErrors: WaitForAttachAndMount ended early, volumes of the
	// pod could not be processed (the kubelet's pod errors); the message
	// is the kubelet's "unmounted volumes=[…], unattached volumes=[…],
	// failed to process volumes=[…]: <errors>".
	PodVolumeErrors Status = C.VOLMGR_ERR_POD_VOLUME_ERRORS
	// AttachLimitExceeded: WaitForAttachAndMount timed out with a volume
	// refused for the node's attach limit of its driver; the message is
	// the kubelet's VolumeAttachLimitExceededError text.
	AttachLimitExceeded Status = C.VOLMGR_ERR_ATTACH_LIMIT_EXCEEDED
)

var statusNames = map[Status]string{
	OK: "ok", InvalidArgument: "invalid argument", NotFound: "not found",
	Timeout: "timeout", Busy: "busy", Unsupported: "unsupported", Internal: "internal error",
	IO: "i/o error", PodVolumeErrors: "pod volume errors", AttachLimitExceeded: "attach limit exceeded",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// Error is a failed call: its status and volmgr's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("volmgr: %s: %s", e.Status, e.Message) }

// Is makes errors.Is(err, volmgr.ErrNotFound) and friends work.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

// Sentinels for errors.Is.
var (
	ErrInvalidArgument = &Error{Status: InvalidArgument}
	ErrNotFound        = &Error{Status: NotFound}
	ErrTimeout         = &Error{Status: Timeout}
	ErrBusy            = &Error{Status: Busy}
	ErrUnsupported     = &Error{Status: Unsupported}
	ErrIO              = &Error{Status: IO}
	// ErrPodVolumeErrors: see PodVolumeErrors.
	ErrPodVolumeErrors = &Error{Status: PodVolumeErrors}
	// ErrAttachLimitExceeded: see AttachLimitExceeded.
	ErrAttachLimitExceeded = &Error{Status: AttachLimitExceeded}
	ErrClosed              = errors.New("volmgr: manager is closed")
)

// Config is volmgr_new's configuration. A field left at its zero value
// takes volmgr_new's default (include/volmgr.h), which is the kubelet's.
type Config struct {
	RootDir          string `json:"root_dir"`
	NodeName         string `json:"node_name,omitempty"`
	Tracer           string `json:"tracer,omitempty"`
	ResyncPeriodMs   uint64 `json:"resync_period_ms,omitempty"`
	BackoffInitialMs uint64 `json:"backoff_initial_ms,omitempty"`
	BackoffMaxMs     uint64 `json:"backoff_max_ms,omitempty"`
	// WaitForSourcesReady: nil (unset) or true, the kubelet's rule, tears
	// nothing down until SourcesReady is called, so a restarted kubelet
	// fork keeps the volumes of its running pods (it upserts them, then
	// calls SourcesReady). Bool(false) opts out, for a caller without a
	// pod source of its own: Start then counts as sources ready, and the
	// volumes of pods not upserted yet are torn down.
	WaitForSourcesReady *bool `json:"wait_for_sources_ready,omitempty"`
	// WaitForReportedInUse sets attachable volumes (CSI) up only once
	// MarkVolumesAsReportedInUse has listed them, as the kubelet does
	// (the node status must list a volume in volumesInUse first).
	WaitForReportedInUse bool `json:"wait_for_reported_in_use,omitempty"`
	// WaitForVolumesAttached sets attachable volumes up only once
	// MarkVolumesAttached has listed them (the Node's
	// status.volumesAttached), as the kubelet's
	// VerifyControllerAttachedVolume waits.
	WaitForVolumesAttached bool `json:"wait_for_volumes_attached,omitempty"`
	// MakeRootShared makes RootDir recursively shared, as volmgr agent
	// does; a kubelet fork leaves it off (the kubelet's setupDataDirs does
	// it).
	MakeRootShared bool `json:"make_root_shared,omitempty"`
	// SELinuxEnabled says whether the host has SELinux (nil: asked, as
	// the kubelet does); SELinuxMount is the kubelet's SELinuxMount
	// feature gate (nil: on, as in Kubernetes 1.37).
	SELinuxEnabled *bool `json:"selinux_enabled,omitempty"`
	SELinuxMount   *bool `json:"selinux_mount,omitempty"`
	// VolumeStatsPeriodMs: how often the volumes' usage is collected
	// (kubelet_volume_stats_* metrics); 0 is the kubelet's 1 minute.
	VolumeStatsPeriodMs uint64 `json:"volume_stats_period_ms,omitempty"`
	// CSI installs the kubelet's CSI plugin; nil: no CSI volumes.
	CSI *CSIConfig `json:"csi,omitempty"`
}

// Bool returns a pointer to b, for the optional fields of Config
// (Config{WaitForSourcesReady: volmgr.Bool(false)}).
func Bool(b bool) *bool { return &b }

// CSIConfig is volmgr_new's "csi" key.
type CSIConfig struct {
	// WatchPluginsRegistry follows RootDir/plugins_registry for drivers
	// that register through node-driver-registrar (the kubelet's plugin
	// watcher).
	WatchPluginsRegistry bool `json:"watch_plugins_registry"`
	// Drivers are called without registration: name -> CSI socket path.
	Drivers map[string]string `json:"drivers,omitempty"`
	// TimeoutMs bounds each CSI call; 0 is the kubelet's 2 minutes.
	TimeoutMs uint64 `json:"timeout_ms,omitempty"`
	// RepublishPeriodMs: how often volumes of CSIDriver requiresRepublish
	// drivers are published again; 0 is the kubelet's 1 minute.
	RepublishPeriodMs uint64 `json:"republish_period_ms,omitempty"`
}

// MountedVolume is one entry of GetMountedVolumesForPod: what the kubelet's
// container.VolumeInfo needs.
type MountedVolume struct {
	// OuterVolumeSpecName is the volume's name in the pod spec (the key of
	// the kubelet's container.VolumeMap).
	OuterVolumeSpecName string `json:"outer_volume_spec_name"`
	VolumeName          string `json:"volume_name"`
	Plugin              string `json:"plugin"`
	// Path is where the volume is (a directory, or for a raw block volume
	// the device file).
	Path string `json:"path"`
	// State is "mounted" or "uncertain".
	State string `json:"state"`
	// ReadOnly is the volume's own read-only flag (a read-only CSI volume).
	ReadOnly bool `json:"read_only"`
	// SELinuxRelabel tells whether the runtime may relabel the volume for
	// SELinux, as the kubelet's mounters' GetAttributes say: true for
	// emptyDir, configMap, secret, downwardAPI, projected, local and image
	// volumes, false for hostPath; for CSI, true when the host has SELinux,
	// the volume was not mounted with its label and its mount says seclabel.
	SELinuxRelabel bool `json:"selinux_relabel"`
	// BlockDevicePath is, for a volume in volumeDevices, the device file to
	// hand to the runtime; empty otherwise.
	BlockDevicePath string `json:"block_device_path"`
	// SubPaths are the containers' subPath bind mounts of the volume: the
	// runtime binds their Path, not the volume's, into the container.
	SubPaths []SubPath `json:"sub_paths"`
}

// SubPath is one container's subPath bind mount of a volume.
type SubPath struct {
	Container string `json:"container"`
	// Index is the volumeMount's index in the container's volumeMounts.
	Index int `json:"index"`
	// SubPath is the path inside the volume (subPathExpr expanded).
	SubPath string `json:"sub_path"`
	// Path is the bind mount to hand to the runtime.
	Path string `json:"path"`
}

// Manager is a volmgr handle. Its methods are safe for concurrent use;
// Close waits for calls in flight.
type Manager struct {
	mu sync.RWMutex
	h  *C.volmgr

	// Callbacks: the cgo handles given to volmgr (deleted once the handle
	// is freed, when no callback can run any more), the event sinks, and
	// the events dropped because a channel was full.
	cbMu    sync.Mutex
	handles []cgo.Handle
	sinks   []*eventSink
	dropped atomic.Uint64
}

// call runs f on a locked OS thread (volmgr_last_error is per thread) and
// turns a failure into an *Error.
func call(f func() C.volmgr_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := Status(f())
	if st == OK {
		return nil
	}
	msg := ""
	if p := C.volmgr_last_error(); p != nil {
		msg = C.GoString(p)
	}
	return &Error{Status: st, Message: msg}
}

// New creates a manager (not started).
func New(cfg Config) (*Manager, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cs := C.CString(string(b))
	defer C.free(unsafe.Pointer(cs))
	var h *C.volmgr
	if err := call(func() C.volmgr_status { return C.volmgr_new(cs, &h) }); err != nil {
		return nil, err
	}
	return &Manager{h: h}, nil
}

// with runs f with the handle, or fails with ErrClosed.
func (m *Manager) with(f func(h *C.volmgr) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.h == nil {
		return ErrClosed
	}
	return f(m.h)
}

// Start rebuilds the actual state and starts reconciling.
func (m *Manager) Start() error {
	return m.with(func(h *C.volmgr) error {
		return call(func() C.volmgr_status { return C.volmgr_start(h) })
	})
}

// SourcesReady tells volmgr that the pod sources have delivered their pods
// (the kubelet's sourcesReady.AllReady()): volumes of pods not upserted
// may now be torn down. Until then (unless Config.WaitForSourcesReady is
// Bool(false)) nothing is.
func (m *Manager) SourcesReady() error {
	return m.with(func(h *C.volmgr) error {
		return call(func() C.volmgr_status { return C.volmgr_sources_ready(h) })
	})
}

// Stop stops reconciling; mounts stay in place.
func (m *Manager) Stop() error {
	return m.with(func(h *C.volmgr) error {
		return call(func() C.volmgr_status { return C.volmgr_stop(h) })
	})
}

// Close stops the manager if needed and frees it. Further calls fail with
// ErrClosed. Closing twice is a no-op.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h != nil {
		C.volmgr_free(m.h)
		m.h = nil
		m.cbMu.Lock()
		for _, s := range m.sinks {
			s.close()
		}
		for _, h := range m.handles {
			h.Delete()
		}
		m.sinks, m.handles = nil, nil
		m.cbMu.Unlock()
	}
	return nil
}

// Events delivers volume events on a new channel with room for buffer
// events, replacing (and closing) the channel of an earlier call; Close
// closes it too. volmgr calls back on one of its own threads, which must
// never block: when the channel is full the event is dropped and counted
// (DroppedEvents), so size buffer for the bursts you expect and keep
// receiving.
func (m *Manager) Events(buffer int) (<-chan Event, error) {
	if buffer < 0 {
		buffer = 0
	}
	sink := &eventSink{ch: make(chan Event, buffer), dropped: &m.dropped}
	h := cgo.NewHandle(sink)
	err := m.with(func(vm *C.volmgr) error {
		return call(func() C.volmgr_status { return C.volmgr_go_set_events(vm, C.uintptr_t(h)) })
	})
	if err != nil {
		h.Delete()
		return nil, err
	}
	m.cbMu.Lock()
	for _, s := range m.sinks {
		s.close()
	}
	// An event already under way may still use an old handle: all are
	// kept until Close.
	m.sinks = []*eventSink{sink}
	m.handles = append(m.handles, h)
	m.cbMu.Unlock()
	return sink.ch, nil
}

// DroppedEvents counts the events dropped because the Events channel was full.
func (m *Manager) DroppedEvents() uint64 { return m.dropped.Load() }

// RegisterPlugin registers a host plugin (before pods that need it are
// upserted). Its methods are called on volmgr's threads until Close.
func (m *Manager) RegisterPlugin(p HostPlugin) error {
	return m.withHandle(p, func(vm *C.volmgr, h C.uintptr_t) error {
		return withString(p.Name(), func(name *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_go_register_plugin(vm, name, h) })
		})
	})
}

// withHandle gives v to volmgr as a callback's userdata through register:
// the cgo handle is kept until Close, or deleted at once if register fails.
func (m *Manager) withHandle(v interface{}, register func(vm *C.volmgr, h C.uintptr_t) error) error {
	h := cgo.NewHandle(v)
	err := m.with(func(vm *C.volmgr) error { return register(vm, C.uintptr_t(h)) })
	if err != nil {
		h.Delete()
		return err
	}
	m.cbMu.Lock()
	m.handles = append(m.handles, h)
	m.cbMu.Unlock()
	return nil
}

func withString(s string, f func(*C.char) error) error {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	return f(cs)
}

// SetTokenSource makes src give projected serviceAccountToken volumes their
// tokens (a kubelet fork's TokenRequest client). Set it before pods with such
// volumes are upserted; setting it again replaces it. src is called on
// volmgr's threads and may block on the API server.
func (m *Manager) SetTokenSource(src TokenSource) error {
	if src == nil {
		return &Error{Status: InvalidArgument, Message: "SetTokenSource: nil TokenSource"}
	}
	return m.withHandle(src, func(vm *C.volmgr, h C.uintptr_t) error {
		return call(func() C.volmgr_status { return C.volmgr_go_set_token(vm, h) })
	})
}

// UpsertPod adds or updates a pod given as v1.Pod JSON.
func (m *Manager) UpsertPod(podJSON []byte) error {
	return m.with(func(h *C.volmgr) error {
		return withString(string(podJSON), func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_pod_upsert(h, cs) })
		})
	})
}

// UpsertObject adds or replaces an object pods' volumes refer to
// (PersistentVolume, PersistentVolumeClaim, Secret, ConfigMap, CSIDriver,
// VolumeAttachment, ServiceAccount, ClusterTrustBundle or this node's Node
// JSON with its kind), as
// the kubelet's informers deliver it: pods that read it are converted again.
func (m *Manager) UpsertObject(objectJSON []byte) error {
	return m.with(func(h *C.volmgr) error {
		return withString(string(objectJSON), func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_object_upsert(h, cs) })
		})
	})
}

// DeleteObject removes an object (namespace "" for cluster-scoped kinds);
// running pods keep their volumes as last resolved.
func (m *Manager) DeleteObject(kind, namespace, name string) error {
	return m.with(func(h *C.volmgr) error {
		return withString(kind, func(k *C.char) error {
			return withString(namespace, func(ns *C.char) error {
				return withString(name, func(n *C.char) error {
					return call(func() C.volmgr_status { return C.volmgr_object_delete(h, k, ns, n) })
				})
			})
		})
	})
}

// DeletePod removes a pod; its volumes are torn down.
func (m *Manager) DeletePod(uid string) error {
	return m.with(func(h *C.volmgr) error {
		return withString(uid, func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_pod_delete(h, cs) })
		})
	})
}

// waitSlice bounds one blocking C wait, so a cancelled context is noticed.
const waitSlice = 100 * time.Millisecond

// wait repeats one blocking C wait in slices of at most waitSlice until it
// succeeds, fails otherwise, or ctx ends.
func (m *Manager) wait(ctx context.Context, f func(h *C.volmgr, ms C.uint64_t) C.volmgr_status) error {
	for {
		slice := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			left := time.Until(dl)
			if left <= 0 {
				left = 0
			}
			if left < slice {
				slice = left
			}
		}
		err := m.with(func(h *C.volmgr) error {
			return call(func() C.volmgr_status { return f(h, C.uint64_t(slice.Milliseconds())) })
		})
		// A slice ending on the attach limit is a timeout until ctx's own
		// end: the kubelet rejects the pod only when its wait is over.
		if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrAttachLimitExceeded) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		default:
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return err
		}
	}
}

func (m *Manager) waitPod(ctx context.Context, uid string, unmount bool) error {
	return withString(uid, func(cs *C.char) error {
		return m.wait(ctx, func(h *C.volmgr, ms C.uint64_t) C.volmgr_status {
			if unmount {
				return C.volmgr_wait_for_unmount(h, cs, ms)
			}
			return C.volmgr_wait_for_attach_and_mount(h, cs, ms)
		})
	})
}

// WaitForAttachAndMount returns once every volume of the pod is mounted, or
// an error (errors.Is(err, ErrTimeout) when ctx ends first). Volumes of the
// pod that could not be processed end it at once (ErrPodVolumeErrors); a
// volume refused for the node's attach limit when ctx ends rejects the pod
// (ErrAttachLimitExceeded). Both have the kubelet's text.
func (m *Manager) WaitForAttachAndMount(ctx context.Context, uid string) error {
	return m.waitPod(ctx, uid, false)
}

// WaitForUnmount returns once nothing of the pod is mounted.
func (m *Manager) WaitForUnmount(ctx context.Context, uid string) error {
	return m.waitPod(ctx, uid, true)
}

// WaitForAllPodsUnmount returns once nothing of any of the pods is mounted
// (or uncertain), within ctx's one deadline; the error lists pod/volume for
// what is left.
func (m *Manager) WaitForAllPodsUnmount(ctx context.Context, uids []string) error {
	if uids == nil {
		uids = []string{}
	}
	b, err := json.Marshal(uids)
	if err != nil {
		return err
	}
	return withString(string(b), func(cs *C.char) error {
		return m.wait(ctx, func(h *C.volmgr, ms C.uint64_t) C.volmgr_status {
			return C.volmgr_wait_for_all_pods_unmount(h, cs, ms)
		})
	})
}

// HasPossiblyMountedVolumesForPod tells whether any volume of the pod is
// mounted or uncertain. When volmgr cannot answer (a closed manager, an
// invalid UID) it says true: the kubelet must then not remove the pod's
// directories.
func (m *Manager) HasPossiblyMountedVolumesForPod(uid string) bool {
	out := C.bool(true)
	err := m.with(func(h *C.volmgr) error {
		return withString(uid, func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_has_possibly_mounted_volumes_for_pod(h, cs, &out) })
		})
	})
	return err != nil || bool(out)
}

// ResizeEphemeralVolume resizes the pod's volume (its name in the pod spec)
// to newSizeBytes at once, in place: only a medium: Memory emptyDir can be
// (its tmpfs is remounted, files kept). ErrUnsupported for other volumes,
// ErrNotFound for an unknown pod or volume, ErrBusy if it is not mounted,
// ErrInvalidArgument for a size below what the volume holds.
func (m *Manager) ResizeEphemeralVolume(uid, volume string, newSizeBytes uint64) error {
	return m.with(func(h *C.volmgr) error {
		return withString(uid, func(u *C.char) error {
			return withString(volume, func(v *C.char) error {
				return call(func() C.volmgr_status {
					return C.volmgr_resize_ephemeral_volume(h, u, v, C.uint64_t(newSizeBytes))
				})
			})
		})
	})
}

// PreparedSubPath is one subPath bind mount PrepareSubPaths made (or found).
type PreparedSubPath struct {
	// Volume is the volume's name in the pod.
	Volume string `json:"volume"`
	SubPath
}

// PrepareSubPaths is the kubelet's makeMounts subPath step: call it when
// starting the container, after its volumes are mounted and the init
// containers before it ran. Each of the container's volumeMounts with a
// subPath is bind-mounted from the path inside the volume as it is now (a
// file an init container wrote is bound as that file; a missing path is made
// a directory); volume set-up prepares none. Again (a restarted container)
// keeps the binds there. ErrNotFound for an unknown pod, ErrBusy when a
// volume it mounts is not mounted; an unsafe subPath is an Internal error.
func (m *Manager) PrepareSubPaths(uid, container string) ([]PreparedSubPath, error) {
	var v []PreparedSubPath
	err := withString(container, func(c *C.char) error {
		return m.podJSON(uid, &v, func(h *C.volmgr, u *C.char, r **C.char) C.volmgr_status {
			return C.volmgr_prepare_sub_paths(h, u, c, r)
		})
	})
	return v, err
}

// rawCall runs a call that returns a string and hands back its bytes.
func (m *Manager) rawCall(f func(h *C.volmgr, res **C.char) C.volmgr_status) ([]byte, error) {
	var raw []byte
	err := m.with(func(h *C.volmgr) error {
		var res *C.char
		if err := call(func() C.volmgr_status { return f(h, &res) }); err != nil {
			return err
		}
		raw = C.GoBytes(unsafe.Pointer(res), C.int(C.strlen(res)))
		C.volmgr_string_free(res)
		return nil
	})
	return raw, err
}

// jsonCall runs a call that returns a JSON string and decodes it into out.
func (m *Manager) jsonCall(out interface{}, f func(h *C.volmgr, res **C.char) C.volmgr_status) error {
	raw, err := m.rawCall(f)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// volumeList returns the pod's volumes through the struct-array call
// (volmgr_get_volume_list_for_pod): one copy of the list's string arena,
// every string a slice of it, no JSON.
func (m *Manager) volumeList(uid string, uncertain bool) ([]MountedVolume, error) {
	var vols []MountedVolume
	err := m.with(func(h *C.volmgr) error {
		return withString(uid, func(cs *C.char) error {
			var list *C.volmgr_volume_list
			if err := call(func() C.volmgr_status {
				return C.volmgr_get_volume_list_for_pod(h, cs, C.bool(uncertain), &list)
			}); err != nil {
				return err
			}
			vols = decodeVolumeList(list)
			C.volmgr_volume_list_free(list)
			return nil
		})
	})
	return vols, err
}

// volumeListJSON is the JSON form of the same query
// (volmgr_get_mounted_volumes_for_pod decoded with encoding/json), kept to
// compare against in the benchmarks.
func (m *Manager) volumeListJSON(uid string) ([]MountedVolume, error) {
	var vols []MountedVolume
	err := withString(uid, func(cs *C.char) error {
		return m.jsonCall(&vols, func(h *C.volmgr, r **C.char) C.volmgr_status {
			return C.volmgr_get_mounted_volumes_for_pod(h, cs, r)
		})
	})
	return vols, err
}

// decodeVolumeList copies a C volume list into Go values (nil when empty).
func decodeVolumeList(l *C.volmgr_volume_list) []MountedVolume {
	if l == nil || l.len == 0 {
		return nil
	}
	arena := C.GoStringN(l.arena, C.int(l.arena_len))
	base := uintptr(unsafe.Pointer(l.arena))
	str := func(p *C.char) string {
		if p == nil {
			return ""
		}
		off := int(uintptr(unsafe.Pointer(p)) - base)
		if off < 0 || off >= len(arena) {
			return ""
		}
		if end := strings.IndexByte(arena[off:], 0); end >= 0 {
			return arena[off : off+end]
		}
		return arena[off:]
	}
	rows := unsafe.Slice(l.volumes, int(l.len))
	out := make([]MountedVolume, len(rows))
	for i := range rows {
		r := &rows[i]
		state := "mounted"
		if r.state == C.VOLMGR_VOLUME_UNCERTAIN {
			state = "uncertain"
		}
		out[i] = MountedVolume{
			OuterVolumeSpecName: str(r.outer_volume_spec_name),
			VolumeName:          str(r.volume_name),
			Plugin:              str(r.plugin),
			Path:                str(r.path),
			State:               state,
			ReadOnly:            bool(r.read_only),
			SELinuxRelabel:      bool(r.selinux_relabel),
			BlockDevicePath:     str(r.block_device_path),
		}
		if r.sub_paths_len > 0 {
			subs := unsafe.Slice(r.sub_paths, int(r.sub_paths_len))
			out[i].SubPaths = make([]SubPath, len(subs))
			for j := range subs {
				out[i].SubPaths[j] = SubPath{
					Container: str(subs[j].container),
					Index:     int(subs[j].index),
					SubPath:   str(subs[j].sub_path),
					Path:      str(subs[j].path),
				}
			}
		}
	}
	return out
}

func (m *Manager) podJSON(uid string, out interface{},
	f func(h *C.volmgr, uid *C.char, res **C.char) C.volmgr_status) error {
	return withString(uid, func(cs *C.char) error {
		return m.jsonCall(out, func(h *C.volmgr, res **C.char) C.volmgr_status { return f(h, cs, res) })
	})
}

// GetMountedVolumesForPod lists the volumes certainly mounted for the pod.
func (m *Manager) GetMountedVolumesForPod(uid string) ([]MountedVolume, error) {
	return m.volumeList(uid, false)
}

// GetPossiblyMountedVolumesForPod also lists volumes in an uncertain state.
func (m *Manager) GetPossiblyMountedVolumesForPod(uid string) ([]MountedVolume, error) {
	return m.volumeList(uid, true)
}

// GetExtraSupplementalGroupsForPod returns the GIDs of the
// pv.beta.kubernetes.io/gid annotations of the pod's mounted
// PersistentVolumes that the pod does not already ask for.
func (m *Manager) GetExtraSupplementalGroupsForPod(uid string) ([]int64, error) {
	var v []int64
	err := m.podJSON(uid, &v, func(h *C.volmgr, u *C.char, r **C.char) C.volmgr_status {
		return C.volmgr_get_extra_supplemental_groups_for_pod(h, u, r)
	})
	return v, err
}

// GetVolumesInUse lists the attachable volumes (CSI volumes from a
// PersistentVolume whose CSIDriver does not say attachRequired: false)
// desired, or mounted or uncertain until unmounted; inline CSI, emptyDir,
// hostPath and host plugins' volumes are not attachable. Before
// ReconcilerStatesHasBeenSynced it fails with ErrBusy: keep the node
// status' volumesInUse as it is (the kubelet's setter waits the same way).
func (m *Manager) GetVolumesInUse() ([]string, error) {
	var v []string
	err := m.jsonCall(&v, func(h *C.volmgr, r **C.char) C.volmgr_status {
		return C.volmgr_get_volumes_in_use(h, r)
	})
	return v, err
}

// MarkVolumesAsReportedInUse records the volumes the node status lists in
// volumesInUse now (with Config.WaitForReportedInUse, this lets them be set up).
func (m *Manager) MarkVolumesAsReportedInUse(names []string) error {
	if names == nil {
		names = []string{}
	}
	b, err := json.Marshal(names)
	if err != nil {
		return err
	}
	return m.with(func(h *C.volmgr) error {
		return withString(string(b), func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_mark_volumes_as_reported_in_use(h, cs) })
		})
	})
}

// MarkVolumesAttached records the volumes the Node's status.volumesAttached
// lists now (with Config.WaitForVolumesAttached, this lets them be set up).
func (m *Manager) MarkVolumesAttached(names []string) error {
	if names == nil {
		names = []string{}
	}
	b, err := json.Marshal(names)
	if err != nil {
		return err
	}
	return m.with(func(h *C.volmgr) error {
		return withString(string(b), func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_mark_volumes_attached(h, cs) })
		})
	})
}

// VolumeIsAttached reports whether the volume is known to be attached.
func (m *Manager) VolumeIsAttached(name string) (bool, error) {
	var out C.bool
	err := m.with(func(h *C.volmgr) error {
		return withString(name, func(cs *C.char) error {
			return call(func() C.volmgr_status { return C.volmgr_volume_is_attached(h, cs, &out) })
		})
	})
	return bool(out), err
}

// ReconcilerStatesSynced is ReconcilerStatesHasBeenSynced.
//
// Deprecated: use ReconcilerStatesHasBeenSynced, the kubelet's name.
func (m *Manager) ReconcilerStatesSynced() bool { return m.ReconcilerStatesHasBeenSynced() }

// ReconcilerStatesHasBeenSynced tells whether the actual state was rebuilt
// and one full reconcile pass has run since the sources were ready.
func (m *Manager) ReconcilerStatesHasBeenSynced() bool {
	synced := false
	_ = m.with(func(h *C.volmgr) error {
		synced = bool(C.volmgr_reconciler_states_synced(h))
		return nil
	})
	return synced
}

// MetricsText returns the Prometheus text exposition.
func (m *Manager) MetricsText() (string, error) {
	var s string
	err := m.with(func(h *C.volmgr) error {
		var res *C.char
		if err := call(func() C.volmgr_status { return C.volmgr_metrics_text(h, &res) }); err != nil {
			return err
		}
		s = C.GoString(res)
		C.volmgr_string_free(res)
		return nil
	})
	return s, err
}

// StatusJSON returns the status document (the schema of `volmgr status
// --json`): volume states, the tracer and why, out-of-band changes found.
func (m *Manager) StatusJSON() ([]byte, error) {
	return m.rawCall(func(h *C.volmgr, res **C.char) C.volmgr_status { return C.volmgr_status_json(h, res) })
}

// noop is the bare cgo call, for benchmarks.
func noop(x int) int { return int(C.volmgr_go_noop(C.int(x))) }
