package volmgr

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The kubelet's pod errors end WaitForAttachAndMount at once with its
// text (a claim not found: "failed to process volumes"), as
// ErrPodVolumeErrors. Before, the wait ran to its context's end and
// returned ErrTimeout with volmgr's own text.
func TestWaitForAttachAndMountPodErrorsEndItAtOnce(t *testing.T) {
	m, _, _ := newManager(t)
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"go","uid":"perr"},` +
		`"spec":{"containers":[{"name":"c","volumeMounts":[{"name":"data","mountPath":"/d"}]}],` +
		`"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"missing"}}]}}`
	if err := m.UpsertPod([]byte(pod)); err != nil {
		t.Fatal(err)
	}
	// Far longer than the test's own timeout would allow: only an early
	// end passes.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	err := m.WaitForAttachAndMount(ctx, "perr")
	if !errors.Is(err, ErrPodVolumeErrors) || errors.Is(err, ErrTimeout) {
		t.Fatalf("error %v", err)
	}
	var e *Error
	want := "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: " +
		"PersistentVolumeClaim go/missing not found"
	if !errors.As(err, &e) || e.Message != want {
		t.Fatalf("error %q, want message %q", err, want)
	}
}
