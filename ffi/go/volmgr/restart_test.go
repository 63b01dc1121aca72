package volmgr

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// firstProcessEnv names the root directory the helper process mounts a
// pod's volume in before it dies.
const firstProcessEnv = "VOLMGR_GO_TEST_FIRST_PROCESS_ROOT"

const restartUID = "restart-1"

// TestRestartHelperFirstProcess is not a test: run by runFirstProcess (in
// the same mount namespace), it creates a manager with only RootDir, mounts
// a pod's volumes, writes a file into its tmpfs and exits without Stop or
// Close, as a kubelet fork that dies.
func TestRestartHelperFirstProcess(t *testing.T) {
	root := os.Getenv(firstProcessEnv)
	if root == "" {
		t.Skip("the first process of TestRestart*, run by them")
	}
	m, err := New(Config{RootDir: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertPod(podJSON(restartUID, filepath.Dir(root)+"/host", 1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, restartUID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(restartVolume(root)+"/data", []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Exit(0)
}

func restartVolume(root string) string {
	return root + "/pods/" + restartUID + "/volumes/kubernetes.io~empty-dir/m0"
}

// runFirstProcess runs TestRestartHelperFirstProcess in a child process and
// returns the new root directory, with the pod's tmpfs mounted in it.
func runFirstProcess(t *testing.T) string {
	dir := t.TempDir()
	root := dir + "/root"
	if err := os.MkdirAll(dir+"/host", 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRestartHelperFirstProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), firstProcessEnv+"="+root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("first process: %v\n%s", err, out)
	}
	if n := mountCount(t, restartVolume(root)); n != 1 {
		t.Fatalf("the first process left %d mounts on %s", n, restartVolume(root))
	}
	t.Cleanup(func() {
		for _, p := range mountsUnder(t, root) {
			_ = unmount(p)
		}
	})
	return root
}

// mountID is the mount ID of the mount on path (0 when none).
func mountID(t *testing.T, path string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && fields[4] == path {
			return fields[0]
		}
	}
	return "0"
}

// A kubelet fork restarted with the defaults (only RootDir) keeps the
// volume of a running pod: nothing is torn down before SourcesReady; once
// the pod is upserted and SourcesReady called, the volume is adopted with
// the same mount.
func TestRestartWithTheDefaultsKeepsARunningPodsVolume(t *testing.T) {
	root := runFirstProcess(t)
	vol := restartVolume(root)
	id := mountID(t, vol)
	m, err := New(Config{RootDir: root})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if !m.HasPossiblyMountedVolumesForPod(restartUID) {
		t.Fatal("the volume was not found at start")
	}
	// The old default tore it down at the first reconcile, right after
	// Start; give that every chance to happen.
	time.Sleep(3 * time.Second)
	if n := mountCount(t, vol); n != 1 || mountID(t, vol) != id {
		t.Fatalf("before SourcesReady: %d mounts on %s (mount %s, was %s)", n, vol, mountID(t, vol), id)
	}
	if m.ReconcilerStatesHasBeenSynced() {
		t.Fatal("synced before the sources are ready")
	}
	if _, err := m.GetVolumesInUse(); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "not synced") {
		t.Fatalf("GetVolumesInUse before the states synced: %v", err)
	}
	if err := m.UpsertPod(podJSON(restartUID, filepath.Dir(root)+"/host", 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.SourcesReady(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, restartUID); err != nil {
		t.Fatal(err)
	}
	for !m.ReconcilerStatesHasBeenSynced() {
		select {
		case <-ctx.Done():
			t.Fatal("never synced")
		case <-time.After(time.Millisecond):
		}
	}
	if n := mountCount(t, vol); n != 1 || mountID(t, vol) != id {
		t.Fatalf("adopted: %d mounts on %s (mount %s, was %s)", n, vol, mountID(t, vol), id)
	}
	if b, err := os.ReadFile(vol + "/data"); err != nil || string(b) != "kept" {
		t.Fatalf("the volume's data: %q, %v", b, err)
	}
	if inUse, err := m.GetVolumesInUse(); err != nil || len(inUse) != 0 {
		t.Fatalf("in use once synced: %v, %v", inUse, err)
	}
	if err := m.DeletePod(restartUID); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForUnmount(ctx, restartUID); err != nil {
		t.Fatal(err)
	}
}

// With the explicit opt-out, the old behaviour: Start counts as sources
// ready, and the volume of a pod not upserted is torn down.
func TestRestartWithoutWaitingForSourcesTearsDown(t *testing.T) {
	root := runFirstProcess(t)
	vol := restartVolume(root)
	m, err := New(Config{RootDir: root, WaitForSourcesReady: Bool(false)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); mountCount(t, vol) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still mounted", vol)
		}
	}
}

// Config tells "unset" from false: unset takes volmgr_new's default.
func TestConfigWaitForSourcesReadyJSON(t *testing.T) {
	for _, c := range []struct {
		v    *bool
		want string
	}{{nil, ""}, {Bool(true), `"wait_for_sources_ready":true`}, {Bool(false), `"wait_for_sources_ready":false`}} {
		b, err := json.Marshal(Config{RootDir: "/r", WaitForSourcesReady: c.v})
		if err != nil {
			t.Fatal(err)
		}
		got := string(b)
		if (c.want == "" && strings.Contains(got, "wait_for_sources_ready")) || !strings.Contains(got, c.want) {
			t.Fatalf("%v: %s", c.v, got)
		}
	}
}
