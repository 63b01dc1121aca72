package volmgr

// The Go side of volmgr's C callbacks: volume events, host plugins and
// service account tokens. The
// functions exported here are called by libvolmgr on its own threads (never
// on the goroutine that made a call), through the C shims in volmgr.go's
// preamble. A file with //export may only declare in its preamble.

/*
#include <stdint.h>
#include "volmgr.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Event is one volume event (volmgr_set_event_callback's JSON).
type Event struct {
	// Kind is "mounted", "unmounted", "failed", "lost", or
	// "claim_resized" (NodeExpandVolume grew the claim Namespace/Claim to
	// SizeBytes: patch its status.capacity as the kubelet does).
	Kind       string `json:"kind"`
	PodUID     string `json:"pod_uid"`
	Volume     string `json:"volume"`
	VolumeName string `json:"volume_name"`
	Path       string `json:"path"`
	Error      string `json:"error"`
	// Set for "claim_resized".
	Namespace        string `json:"namespace"`
	Claim            string `json:"claim"`
	PersistentVolume string `json:"persistent_volume"`
	SizeBytes        uint64 `json:"size_bytes"`
}

// eventSink is what an event callback's cgo.Handle refers to: a bounded
// channel and the manager's drop counter.
type eventSink struct {
	mu      sync.RWMutex
	ch      chan Event
	closed  bool
	dropped *atomic.Uint64
}

// deliver hands ev over without blocking volmgr's thread: when the channel
// is full (or nobody receives on an unbuffered one) the event is dropped
// and counted.
func (s *eventSink) deliver(ev Event) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	select {
	case s.ch <- ev:
	default:
		s.dropped.Add(1)
	}
}

// close closes the channel; later deliveries are ignored.
func (s *eventSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}

//export volmgrGoEvent
func volmgrGoEvent(userdata unsafe.Pointer, eventJSON *C.char) {
	defer func() { _ = recover() }()
	sink, ok := cgo.Handle(uintptr(userdata)).Value().(*eventSink)
	if !ok || eventJSON == nil {
		return
	}
	var ev Event
	if err := json.Unmarshal([]byte(C.GoString(eventJSON)), &ev); err != nil {
		return
	}
	sink.deliver(ev)
}

// HostPlugin is a volume plugin implemented in Go (volmgr_register_plugin):
// volmgr's reconciler drives it like its own plugins — one operation at a
// time per volume and pod, backoff after failures, uncertain states,
// reconstruction after a restart. Its methods run on volmgr's threads,
// possibly several at once for different volumes; they must not call
// Close on the Manager.
type HostPlugin interface {
	// Name is the plugin's unique name, e.g. "example.com/nfs".
	Name() string
	// CanSupport tells whether the plugin handles this volume: specJSON is
	// the pod's v1.Volume. Only volume types volmgr does not handle
	// itself are offered. It must be quick (it runs while a pod is
	// upserted).
	CanSupport(specJSON []byte) bool
	// SetUp makes the volume available in targetDir (created by volmgr,
	// under ROOT/pods/<uid>/volumes/<plugin>/<volume>). It must be
	// idempotent. An error wrapping ErrTimeout means "may have happened"
	// (the volume becomes uncertain); any other error is a failure retried
	// with backoff.
	SetUp(specJSON []byte, targetDir string) error
	// TearDown undoes SetUp; volmgr removes targetDir afterwards.
	// Idempotent; same error convention as SetUp.
	TearDown(targetDir string) error
}

// pluginOf returns the HostPlugin a callback's userdata refers to.
func pluginOf(userdata unsafe.Pointer) (HostPlugin, bool) {
	p, ok := cgo.Handle(uintptr(userdata)).Value().(HostPlugin)
	return p, ok
}

// pluginStatus turns a HostPlugin's error into a status, writing its
// message into volmgr's buffer (NUL-terminated, truncated to fit).
func pluginStatus(err error, buf *C.char, n C.uintptr_t) C.volmgr_status {
	if err == nil {
		return C.VOLMGR_OK
	}
	if buf != nil && n > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
		msg := err.Error()
		if len(msg) > len(dst)-1 {
			msg = msg[:len(dst)-1]
		}
		copy(dst, msg)
		dst[len(msg)] = 0
	}
	if errors.Is(err, ErrTimeout) {
		return C.VOLMGR_ERR_TIMEOUT
	}
	return C.VOLMGR_ERR_INTERNAL
}

// recovered turns a panic of a HostPlugin method into an error.
func recovered(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("host plugin panicked: %v", r)
	}
}

//export volmgrGoCanSupport
func volmgrGoCanSupport(userdata unsafe.Pointer, spec *C.char) (ok C.int) {
	defer func() {
		if recover() != nil {
			ok = 0
		}
	}()
	p, found := pluginOf(userdata)
	if found && p.CanSupport([]byte(C.GoString(spec))) {
		return 1
	}
	return 0
}

//export volmgrGoSetUp
func volmgrGoSetUp(userdata unsafe.Pointer, spec, target, errBuf *C.char, errLen C.uintptr_t) C.volmgr_status {
	var err error
	func() {
		defer recovered(&err)
		p, found := pluginOf(userdata)
		if !found {
			err = errors.New("host plugin handle is gone")
			return
		}
		err = p.SetUp([]byte(C.GoString(spec)), C.GoString(target))
	}()
	return pluginStatus(err, errBuf, errLen)
}

//export volmgrGoTearDown
func volmgrGoTearDown(userdata unsafe.Pointer, target, errBuf *C.char, errLen C.uintptr_t) C.volmgr_status {
	var err error
	func() {
		defer recovered(&err)
		p, found := pluginOf(userdata)
		if !found {
			err = errors.New("host plugin handle is gone")
			return
		}
		err = p.TearDown(C.GoString(target))
	}()
	return pluginStatus(err, errBuf, errLen)
}

// TokenRequest is what volmgr asks a TokenSource for: the TokenRequest
// (serviceaccounts/NAME/token) to make for a projected serviceAccountToken
// source, bound to the pod.
type TokenRequest struct {
	Namespace         string `json:"namespace"`
	ServiceAccount    string `json:"service_account"`
	Audience          string `json:"audience"`
	ExpirationSeconds int64  `json:"expiration_seconds"`
	PodName           string `json:"pod_name"`
	PodUID            string `json:"pod_uid"`
}

// TokenSource gives service account tokens (Manager.SetTokenSource). An
// error fails the volume's set-up, retried with backoff.
type TokenSource interface {
	Token(req TokenRequest) (token string, expiration time.Time, err error)
}

//export volmgrGoToken
func volmgrGoToken(userdata unsafe.Pointer, request, buf *C.char, n C.uintptr_t, expiration *C.int64_t) (status C.int32_t) {
	defer func() {
		if recover() != nil {
			status = C.int32_t(C.VOLMGR_ERR_INTERNAL)
		}
	}()
	src, ok := cgo.Handle(uintptr(userdata)).Value().(TokenSource)
	if !ok || buf == nil || expiration == nil {
		return C.int32_t(C.VOLMGR_ERR_INTERNAL)
	}
	var req TokenRequest
	if err := json.Unmarshal([]byte(C.GoString(request)), &req); err != nil {
		return C.int32_t(C.VOLMGR_ERR_INVALID_ARGUMENT)
	}
	token, exp, err := src.Token(req)
	if err != nil {
		return C.int32_t(C.VOLMGR_ERR_INTERNAL)
	}
	// A token that does not fit, or holds a NUL, would reach the pod cut.
	if len(token)+1 > int(n) || strings.IndexByte(token, 0) >= 0 {
		return C.int32_t(C.VOLMGR_ERR_INVALID_ARGUMENT)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	copy(dst, token)
	dst[len(token)] = 0
	*expiration = C.int64_t(exp.Unix())
	return C.int32_t(C.VOLMGR_OK)
}
