package volmgr

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The optional settings are left out when unset, so volmgr_new's
// defaults apply (the kubelet's, the same as volmgr agent's).
func TestConfigAgentSettingsJSON(t *testing.T) {
	b, err := json.Marshal(Config{RootDir: "/r"})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"make_root_shared", "wait_for_volumes_attached", "volume_stats_period_ms"} {
		if strings.Contains(string(b), key) {
			t.Fatalf("unset %s is sent: %s", key, b)
		}
	}
	b, err = json.Marshal(Config{RootDir: "/r", MakeRootShared: true, WaitForVolumesAttached: true, VolumeStatsPeriodMs: 2500})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"make_root_shared":true`, `"wait_for_volumes_attached":true`, `"volume_stats_period_ms":2500`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("want %s in %s", want, b)
		}
	}
}

// volmgr_new takes the agent's settings; MarkVolumesAttached is accepted.
// RootDir is left as it is unless MakeRootShared (status root_propagation).
func TestNewWithTheAgentsSettings(t *testing.T) {
	for _, c := range []struct {
		shared bool
		want   string
	}{{false, "off"}} {
		m, err := New(Config{RootDir: t.TempDir(), Tracer: "off", MakeRootShared: c.shared,
			WaitForVolumesAttached: true, VolumeStatsPeriodMs: 2500})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.MarkVolumesAttached([]string{"kubernetes.io/csi/d^h"}); err != nil {
			t.Fatal(err)
		}
		b, err := m.StatusJSON()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			RootPropagation string `json:"root_propagation"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if st.RootPropagation != c.want {
			t.Fatalf("MakeRootShared %v: root_propagation %q, want %q", c.shared, st.RootPropagation, c.want)
		}
	}
}

// A RootDir that cannot be used is an I/O error, not an invalid argument.
func TestNewOnAFileIsIO(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{RootDir: file, Tracer: "off"})
	if !errors.Is(err, ErrIO) || errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("RootDir a file: %v", err)
	}
}
