package volmgr

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const childEnv = "VOLMGR_GO_TEST_IN_PRIVATE_NS"

// TestMain re-executes the test binary in a new mount namespace with "/"
// made recursively private (Go's SysProcAttr.Unshareflags does both), so the
// real mounts of these tests never reach the host. Without root it skips.
func TestMain(m *testing.M) {
	if os.Getenv(firstProcessEnv) != "" {
		// A helper process of a test, in that test's namespace already.
		os.Exit(m.Run())
	}
	if os.Getenv(childEnv) == "1" {
		// The host read-only but the temporary directory: a bug that binds
		// "/" or "/etc" into a test's directory cannot cost the host its
		// files when the test cleans up (a bind keeps the read-only flag).
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
		fmt.Println("SKIP volmgr Go tests: need root to create a private mount namespace")
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

func podJSON(uid, hostDir string, volumes int) []byte {
	mounts := []string{`{"name":"host","mountPath":"/host"}`}
	vols := []string{fmt.Sprintf(`{"name":"host","hostPath":{"path":%q,"type":"Directory"}}`, hostDir)}
	for i := 0; i < volumes; i++ {
		mounts = append(mounts, fmt.Sprintf(`{"name":"m%d","mountPath":"/m%d"}`, i, i))
		vols = append(vols, fmt.Sprintf(`{"name":"m%d","emptyDir":{"medium":"Memory","sizeLimit":"4Mi"}}`, i))
	}
	return []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p-%s","namespace":"go","uid":%q},`+
		`"spec":{"containers":[{"name":"c","volumeMounts":[%s]}],"volumes":[%s]}}`,
		uid, uid, strings.Join(mounts, ","), strings.Join(vols, ",")))
}

func mountCount(t testing.TB, path string) int {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && fields[4] == path {
			n++
		}
	}
	return n
}

func newManager(t testing.TB) (*Manager, string, string) {
	dir := t.TempDir()
	root, host := dir+"/root", dir+"/host"
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{RootDir: root, Tracer: "off", BackoffInitialMs: 50, BackoffMaxMs: 200})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	// A fresh root: every pod is upserted by the test itself.
	if err := m.SourcesReady(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		// Close leaves mounts in place (as the kubelet does); remove them so
		// the temporary directory can go.
		for _, p := range mountsUnder(t, root) {
			_ = syscall.Unmount(p, 0)
		}
	})
	return m, root, host
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
	return out
}

func TestFullFlow(t *testing.T) {
	m, root, host := newManager(t)
	if err := m.UpsertPod(podJSON("go-1", host, 2)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, "go-1"); err != nil {
		t.Fatal(err)
	}
	vols, err := m.GetMountedVolumesForPod("go-1")
	if err != nil || len(vols) != 3 {
		t.Fatalf("volumes %v, %v", vols, err)
	}
	path := root + "/pods/go-1/volumes/kubernetes.io~empty-dir/m0"
	if vols[1].OuterVolumeSpecName != "m0" || vols[1].Path != path || vols[1].State != "mounted" || vols[0].Path != host {
		t.Fatalf("unexpected volumes %+v", vols)
	}
	if n := mountCount(t, path); n != 1 {
		t.Fatalf("%s mounted %d times", path, n)
	}
	if !m.ReconcilerStatesHasBeenSynced() || !m.ReconcilerStatesSynced() {
		t.Fatal("not synced")
	}
	if !vols[1].SELinuxRelabel || vols[1].ReadOnly || vols[1].BlockDevicePath != "" || vols[0].SELinuxRelabel {
		t.Fatalf("volume info %+v", vols)
	}
	// emptyDir and hostPath are not attachable: none in use.
	inUse, err := m.GetVolumesInUse()
	if err != nil || len(inUse) != 0 {
		t.Fatalf("in use %v, %v", inUse, err)
	}
	if err := m.MarkVolumesAsReportedInUse(inUse); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.VolumeIsAttached("kubernetes.io/empty-dir/go-1-m0"); !ok || err != nil {
		t.Fatalf("attached %v %v", ok, err)
	}
	if txt, err := m.MetricsText(); err != nil || !strings.Contains(txt, "volume_manager_total_volumes") {
		t.Fatalf("metrics %v", err)
	}
	if err := m.DeletePod("go-1"); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForUnmount(ctx, "go-1"); err != nil {
		t.Fatal(err)
	}
	if n := mountCount(t, path); n != 0 {
		t.Fatalf("%s still mounted", path)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(); !errors.Is(err, ErrBusy) {
		t.Fatalf("second stop: %v", err)
	}
	_ = m.Close()
	if err := m.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	_ = m.Close()
}

func TestErrors(t *testing.T) {
	bad := &CSIConfig{Drivers: map[string]string{"d": "relative.sock"}}
	if _, err := New(Config{RootDir: t.TempDir(), Tracer: "off", CSI: bad}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a relative CSI socket path: %v", err)
	}
	csi := &CSIConfig{WatchPluginsRegistry: true, Drivers: map[string]string{"d": "/run/d.sock"}}
	root := t.TempDir()
	withCSI, err := New(Config{RootDir: root, Tracer: "off", CSI: csi})
	if err != nil {
		t.Fatalf("CSI config: %v", err)
	}
	withCSI.Close()
	if st, err := os.Stat(root + "/plugins_registry"); err != nil || !st.IsDir() {
		t.Fatalf("plugins_registry not created: %v", err)
	}
	if _, err := New(Config{RootDir: "/tmp", Tracer: "bogus"}); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "unknown tracer") {
		t.Fatalf("bogus tracer: %v", err)
	}
	m, _, host := newManager(t)
	if err := m.UpsertPod([]byte("{nope")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad json: %v", err)
	}
	if err := m.UpsertPod(podJSON("../x", host, 1)); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "invalid pod UID") {
		t.Fatalf("bad uid: %v", err)
	}
	if err := m.DeletePod("nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown pod: %v", err)
	}
	if err := m.UpsertPod(podJSON("go-bad", host+"/missing", 0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = m.WaitForAttachAndMount(ctx, "go-bad")
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "hostPath type check failed") {
		t.Fatalf("timeout: %v", err)
	}
}

// 16 goroutines upsert, query and delete concurrently; then every desired
// volume is mounted exactly once and every deleted one is gone.
func TestConcurrentGoroutines(t *testing.T) {
	m, root, host := newManager(t)
	const workers, rounds = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				uid := fmt.Sprintf("g%d-r%d", w, r)
				if err := m.UpsertPod(podJSON(uid, host, 1)); err != nil {
					errs <- err
					return
				}
				if _, err := m.GetMountedVolumesForPod(uid); err != nil {
					errs <- err
					return
				}
				if r+1 < rounds {
					if err := m.DeletePod(uid); err != nil {
						errs <- err
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for w := 0; w < workers; w++ {
		for r := 0; r < rounds; r++ {
			uid := fmt.Sprintf("g%d-r%d", w, r)
			want := 0
			if r+1 == rounds {
				want = 1
				if err := m.WaitForAttachAndMount(ctx, uid); err != nil {
					t.Fatal(err)
				}
			} else if err := m.WaitForUnmount(ctx, uid); err != nil {
				t.Fatal(err)
			}
			path := root + "/pods/" + uid + "/volumes/kubernetes.io~empty-dir/m0"
			if n := mountCount(t, path); n != want {
				t.Fatalf("%s mounted %d times, want %d", path, n, want)
			}
		}
	}
}

// Per-call costs (see BENCHMARKS.md): a read for a pod with 10 mounted
// volumes (through the struct list, and through the JSON call and
// encoding/json, side by side), an upsert of an unchanged pod, and a bare
// cgo call.
func BenchmarkGetMountedVolumesForPod(b *testing.B) {
	benchVolumeList(b, (*Manager).GetMountedVolumesForPod)
}

func BenchmarkGetMountedVolumesForPodJSON(b *testing.B) {
	benchVolumeList(b, (*Manager).volumeListJSON)
}

func benchVolumeList(b *testing.B, list func(*Manager, string) ([]MountedVolume, error)) {
	m, _, host := newManager(b)
	if err := m.UpsertPod(podJSON("bench", host, 9)); err != nil {
		b.Fatal(err)
	}
	if err := m.WaitForAttachAndMount(context.Background(), "bench"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v, err := list(m, "bench")
		if err != nil || len(v) != 10 {
			b.Fatal(len(v), err)
		}
	}
}

// Objects: a claim waits for its objects; bad ones are refused.
func TestObjects(t *testing.T) {
	m, _, _ := newManager(t)
	pvc := []byte(`{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"c","namespace":"go"},"spec":{"volumeName":"pv"}}`)
	if err := m.UpsertObject(pvc); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertObject([]byte(`{"kind":"Pod","metadata":{"name":"n"}}`)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a Pod as an object: %v", err)
	}
	if err := m.UpsertObject([]byte(`{`)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("not JSON: %v", err)
	}
	if err := m.DeleteObject("PersistentVolumeClaim", "go", "c"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteObject("PersistentVolumeClaim", "go", "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted twice: %v", err)
	}
}

type fakeTokens struct {
	mu   sync.Mutex
	seen []TokenRequest
}

func (f *fakeTokens) Token(req TokenRequest) (string, time.Time, error) {
	f.mu.Lock()
	f.seen = append(f.seen, req)
	n := len(f.seen)
	f.mu.Unlock()
	return fmt.Sprintf("token-of-%s#%d", req.ServiceAccount, n), time.Now().Add(time.Hour), nil
}

func (f *fakeTokens) asked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

// A projected serviceAccountToken volume gets its token from a Go
// TokenSource, asked with the pod's binding and the projection's audience.
func TestTokenSource(t *testing.T) {
	m, root, _ := newManager(t)
	if err := m.SetTokenSource(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil source: %v", err)
	}
	src := &fakeTokens{}
	if err := m.SetTokenSource(src); err != nil {
		t.Fatal(err)
	}
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"tp","namespace":"go","uid":"tok-1"},
		"spec":{"serviceAccountName":"builder","containers":[{"name":"c","volumeMounts":[{"name":"api","mountPath":"/t"}]}],
		"volumes":[{"name":"api","projected":{"sources":[{"serviceAccountToken":{"path":"token","audience":"vault","expirationSeconds":3600}}]}}]}}`)
	if err := m.UpsertPod(pod); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.WaitForAttachAndMount(ctx, "tok-1"); err != nil {
		t.Fatal(err)
	}
	file := root + "/pods/tok-1/volumes/kubernetes.io~projected/api/token"
	got, err := os.ReadFile(file)
	if err != nil || string(got) != "token-of-builder#1" {
		t.Fatalf("token file: %q, %v", got, err)
	}
	// The ServiceAccount, once known, and again when it is replaced (a new
	// UID: the API server refuses tokens bound to the old one), gets the
	// pod a fresh token at once.
	for i, uid := range []string{"sa-1", "sa-2"} {
		sa := fmt.Sprintf(`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"builder","namespace":"go","uid":%q}}`, uid)
		if err := m.UpsertObject([]byte(sa)); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("token-of-builder#%d", i+2)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			got, err = os.ReadFile(file)
			if err == nil && string(got) == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after ServiceAccount %s: token file %q (%v), want %q; asked %d times", uid, got, err, want, src.asked())
			}
		}
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	r := src.seen[0]
	if r.Namespace != "go" || r.ServiceAccount != "builder" || r.Audience != "vault" || r.PodName != "tp" || r.PodUID != "tok-1" || r.ExpirationSeconds != 3600 {
		t.Fatalf("request %+v", r)
	}
}

// Both forms give the same entries.
func TestVolumeListMatchesJSON(t *testing.T) {
	m, _, host := newManager(t)
	if err := m.UpsertPod(podJSON("same", host, 3)); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForAttachAndMount(context.Background(), "same"); err != nil {
		t.Fatal(err)
	}
	a, err := m.GetMountedVolumesForPod("same")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.volumeListJSON("same")
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 4 || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("struct list %v\nJSON list %v", a, b)
	}
	if v, err := m.GetPossiblyMountedVolumesForPod("none"); err != nil || v != nil {
		t.Fatalf("unknown pod: %v %v", v, err)
	}
}

// A container's subPaths are prepared when it starts (PrepareSubPaths), not
// at volume set-up: an init container first writes app.conf into the
// emptyDir, then the app's subPath of it is bound as that file, and it shows
// in its volume's entry, with the bind mount the runtime hands to the
// container, in both forms of the list.
func TestSubPathsInTheVolumeList(t *testing.T) {
	m, root, _ := newManager(t)
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sp","namespace":"go","uid":"sub-1"},
		"spec":{"initContainers":[{"name":"render","volumeMounts":[{"name":"work","mountPath":"/out"}]}],
		"containers":[{"name":"c","volumeMounts":[{"name":"work","mountPath":"/w"},
		{"name":"work","mountPath":"/etc/app.conf","subPath":"app.conf"}]}],
		"volumes":[{"name":"work","emptyDir":{}}]}}`)
	if err := m.UpsertPod(pod); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForAttachAndMount(context.Background(), "sub-1"); err != nil {
		t.Fatal(err)
	}
	got, err := m.GetMountedVolumesForPod("sub-1")
	if err != nil || len(got) != 1 || len(got[0].SubPaths) != 0 {
		t.Fatalf("before the container starts: %+v %v", got, err)
	}
	conf := root + "/pods/sub-1/volumes/kubernetes.io~empty-dir/work/app.conf"
	if _, err := os.Lstat(conf); !os.IsNotExist(err) {
		t.Fatalf("set-up made %s: %v", conf, err)
	}
	// The init container renders the file.
	if err := os.WriteFile(conf, []byte("rendered"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := SubPath{Container: "c", Index: 1, SubPath: "app.conf",
		Path: root + "/pods/sub-1/volume-subpaths/work/c/1"}
	prepared, err := m.PrepareSubPaths("sub-1", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(prepared) != 1 || prepared[0].Volume != "work" || prepared[0].SubPath != want {
		t.Fatalf("prepared %+v, want %+v", prepared, want)
	}
	if b, err := os.ReadFile(want.Path); err != nil || string(b) != "rendered" {
		t.Fatalf("the bind shows %q, %v", b, err)
	}
	if again, err := m.PrepareSubPaths("sub-1", "c"); err != nil || len(again) != 1 {
		t.Fatalf("again: %+v %v", again, err)
	}
	if none, err := m.PrepareSubPaths("sub-1", "render"); err != nil || len(none) != 0 {
		t.Fatalf("a container without subPaths: %+v %v", none, err)
	}
	if _, err := m.PrepareSubPaths("nope", "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown pod: %v", err)
	}
	if got, err = m.GetMountedVolumesForPod("sub-1"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].SubPaths) != 1 || got[0].SubPaths[0] != want {
		t.Fatalf("list %+v, want subPath %+v", got, want)
	}
	b, err := m.volumeListJSON("sub-1")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(b) {
		t.Fatalf("struct list %v\nJSON list %v", got, b)
	}
}

func BenchmarkUpsertUnchangedPod(b *testing.B) {
	m, _, host := newManager(b)
	pod := podJSON("bench", host, 9)
	if err := m.UpsertPod(pod); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.UpsertPod(pod); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBareCgoCall(b *testing.B) {
	s := 0
	for i := 0; i < b.N; i++ {
		s += noop(i)
	}
	_ = s
}

// A volume unmounted by the host process itself (a Go thread, not one of
// volmgr's) is mounted again at once by the tracer (the resync is an hour
// away), and the status document shows the change.
func TestOutOfBandUnmount(t *testing.T) {
	for _, tracer := range []string{"mountinfo", "ebpf"} {
		t.Run(tracer, func(t *testing.T) {
			dir := t.TempDir()
			root, host := dir+"/root", dir+"/host"
			if err := os.MkdirAll(host, 0o755); err != nil {
				t.Fatal(err)
			}
			m, err := New(Config{RootDir: root, Tracer: tracer, ResyncPeriodMs: 3600000})
			if tracer == "ebpf" && errors.Is(err, ErrUnsupported) {
				t.Skipf("eBPF tracer not loadable: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Start(); err != nil {
				t.Fatal(err)
			}
			if err := m.SourcesReady(); err != nil {
				t.Fatal(err)
			}
			if err := m.UpsertPod(podJSON("go-oob", host, 1)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := m.WaitForAttachAndMount(ctx, "go-oob"); err != nil {
				t.Fatal(err)
			}
			path := root + "/pods/go-oob/volumes/kubernetes.io~empty-dir/m0"
			if err := syscall.Unmount(path, 0); err != nil {
				t.Fatal(err)
			}
			var st struct {
				Tracer    string `json:"tracer"`
				OutOfBand []struct {
					Kind       string `json:"kind"`
					Volume     string `json:"volume"`
					DetectedBy string `json:"detected_by"`
					Outcome    string `json:"outcome"`
				} `json:"out_of_band"`
			}
			// Bounded wait that only catches a hang.
			deadline := time.Now().Add(20 * time.Second)
			for {
				raw, err := m.StatusJSON()
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(raw, &st); err != nil {
					t.Fatal(err)
				}
				done := mountCount(t, path) == 1
				for _, e := range st.OutOfBand {
					done = done && e.Kind == "lost" && e.Volume == "m0" && e.DetectedBy == tracer && e.Outcome == "repaired"
				}
				if done && len(st.OutOfBand) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not repaired: %s", raw)
				}
				time.Sleep(time.Millisecond)
			}
			if st.Tracer != tracer {
				t.Fatalf("tracer %q", st.Tracer)
			}
			if err := m.DeletePod("go-oob"); err != nil {
				t.Fatal(err)
			}
			if err := m.WaitForUnmount(ctx, "go-oob"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
