package volmgr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func fsSize(t *testing.T, path string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * uint64(st.Bsize)
}

func TestWaitForAllPodsUnmountAndPossiblyMounted(t *testing.T) {
	m, _, host := newManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	uids := []string{"all-1", "all-2", "all-3"}
	for _, u := range uids {
		if err := m.UpsertPod(podJSON(u, host, 1)); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitForAttachAndMount(ctx, u); err != nil {
			t.Fatal(err)
		}
		if !m.HasPossiblyMountedVolumesForPod(u) {
			t.Fatalf("%s: nothing possibly mounted", u)
		}
	}
	if m.HasPossiblyMountedVolumesForPod("nobody") {
		t.Fatal("unknown pod has volumes")
	}
	if !m.HasPossiblyMountedVolumesForPod("../bad") {
		t.Fatal("an unanswerable question must say true")
	}
	for _, u := range uids[:2] {
		if err := m.DeletePod(u); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.WaitForAllPodsUnmount(ctx, uids[:2]); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	err := m.WaitForAllPodsUnmount(short, uids)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "all-3/m0 (still mounted)") {
		t.Fatalf("left mounted: %v", err)
	}
	if err := m.WaitForAllPodsUnmount(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

func TestResizeEphemeralVolume(t *testing.T) {
	m, root, host := newManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.UpsertPod(podJSON("rs", host, 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForAttachAndMount(ctx, "rs"); err != nil {
		t.Fatal(err)
	}
	path := root + "/pods/rs/volumes/kubernetes.io~empty-dir/m0"
	if got := fsSize(t, path); got != 4<<20 {
		t.Fatalf("size %d", got)
	}
	if err := os.WriteFile(filepath.Join(path, "f"), make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.ResizeEphemeralVolume("rs", "m0", 16<<20); err != nil {
		t.Fatal(err)
	}
	if got := fsSize(t, path); got != 16<<20 {
		t.Fatalf("size after resize %d", got)
	}
	if err := m.ResizeEphemeralVolume("rs", "m0", 1<<20); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "in use") {
		t.Fatalf("shrink below use: %v", err)
	}
	if err := m.ResizeEphemeralVolume("rs", "host", 1<<20); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("hostPath: %v", err)
	}
	if err := m.ResizeEphemeralVolume("rs", "nope", 1<<20); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown volume: %v", err)
	}
}

func TestEventsOnAChannel(t *testing.T) {
	m, _, host := newManager(t)
	events, err := m.Events(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertPod(podJSON("ev", host, 1)); err != nil {
		t.Fatal(err)
	}
	// Bounded only to catch a hang.
	deadline := time.After(20 * time.Second)
	for seen := false; !seen; {
		select {
		case ev := <-events:
			seen = ev.Kind == "mounted" && ev.PodUID == "ev" && ev.Volume == "m0" && ev.Path != ""
		case <-deadline:
			t.Fatal("no mounted event")
		}
	}
	// A channel nobody reads: events are dropped and counted, volmgr's
	// thread never blocks.
	if _, err := m.Events(0); err != nil {
		t.Fatal(err)
	}
	if _, open := <-events; open {
		// Drain what was buffered; the replaced channel ends closed.
		for range events {
		}
	}
	before := m.DroppedEvents()
	if err := m.DeletePod("ev"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForUnmount(ctx, "ev"); err != nil {
		t.Fatal(err)
	}
	for m.DroppedEvents() == before {
		select {
		case <-ctx.Done():
			t.Fatal("no event dropped")
		case <-time.After(time.Millisecond):
		}
	}
}

// goPlugin claims nfs volumes (volmgr has no plugin for them) and writes a
// file in place of one.
type goPlugin struct {
	mu        sync.Mutex
	failFirst int
	setUps    int
	tearDowns []string
}

func (p *goPlugin) Name() string { return "example.com/go-configmap" }

func (p *goPlugin) CanSupport(spec []byte) bool { return strings.Contains(string(spec), `"nfs"`) }

func (p *goPlugin) SetUp(spec []byte, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setUps++
	if p.failFirst > 0 {
		p.failFirst--
		return errors.New("injected failure")
	}
	return os.WriteFile(filepath.Join(dir, "key"), spec, 0o644)
}

func (p *goPlugin) TearDown(dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tearDowns = append(p.tearDowns, dir)
	return nil
}

func TestGoHostPlugin(t *testing.T) {
	m, _, _ := newManager(t)
	p := &goPlugin{failFirst: 1}
	if err := m.RegisterPlugin(p); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterPlugin(p); !errors.Is(err, ErrBusy) {
		t.Fatalf("second registration: %v", err)
	}
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"cm","namespace":"go","uid":"cm"},` +
		`"spec":{"containers":[{"name":"c","volumeMounts":[{"name":"cfg","mountPath":"/cfg"}]}],` +
		`"volumes":[{"name":"cfg","nfs":{"server":"nfs.example.com","path":"/x"}}]}}`
	if err := m.UpsertPod([]byte(pod)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, "cm"); err != nil {
		t.Fatal(err)
	}
	vols, err := m.GetMountedVolumesForPod("cm")
	if err != nil || len(vols) != 1 || vols[0].Plugin != p.Name() {
		t.Fatalf("volumes %+v, %v", vols, err)
	}
	b, err := os.ReadFile(filepath.Join(vols[0].Path, "key"))
	if err != nil || !strings.Contains(string(b), `"name":"cfg"`) {
		t.Fatalf("set up: %q, %v", b, err)
	}
	p.mu.Lock()
	if p.setUps != 2 {
		t.Errorf("set-ups %d, want a failure then a success", p.setUps)
	}
	p.mu.Unlock()
	if err := m.DeletePod("cm"); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForUnmount(ctx, "cm"); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tearDowns) != 1 || p.tearDowns[0] != vols[0].Path {
		t.Fatalf("tear-downs %v", p.tearDowns)
	}
	if _, err := os.Stat(vols[0].Path); !os.IsNotExist(err) {
		t.Fatalf("directory left: %v", err)
	}
}

// A host plugin's error that wraps ErrTimeout makes the volume uncertain:
// possibly mounted, and set up again.
func TestGoHostPluginUncertain(t *testing.T) {
	m, _, _ := newManager(t)
	p := &uncertainPlugin{}
	if err := m.RegisterPlugin(p); err != nil {
		t.Fatal(err)
	}
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"u","namespace":"go","uid":"u"},` +
		`"spec":{"containers":[{"name":"c","volumeMounts":[{"name":"s","mountPath":"/s"}]}],` +
		`"volumes":[{"name":"s","iscsi":{"targetPortal":"10.0.0.1:3260","iqn":"iqn.x","lun":0}}]}}`
	if err := m.UpsertPod([]byte(pod)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls != 2 {
		t.Fatalf("set-ups %d", p.calls)
	}
}

type uncertainPlugin struct {
	mu    sync.Mutex
	calls int
}

func (p *uncertainPlugin) Name() string              { return "example.com/uncertain" }
func (p *uncertainPlugin) CanSupport(s []byte) bool  { return strings.Contains(string(s), `"iscsi"`) }
func (p *uncertainPlugin) TearDown(dir string) error { return nil }
func (p *uncertainPlugin) SetUp(spec []byte, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls == 1 {
		return fmt.Errorf("driver did not answer: %w", ErrTimeout)
	}
	return nil
}

func unmount(p string) error { return syscall.Unmount(p, 0) }

func mkdir(p string) error { return os.MkdirAll(p, 0o755) }
