package kubeletvm

import (
	"errors"
	"path/filepath"
	"strings"

	"k8s.io/kubernetes/pkg/volume"

	"volmgr/ffi/go/volmgr"
)

// mounter is what the kubelet reads of a mounted volume's Mounter:
// GetPath (makeMounts), GetAttributes (read-only, SELinux relabel) and
// GetMetrics (the stats summary). Set-up is volmgr's: SetUp fails.
type mounter struct {
	path  string
	attrs volume.Attributes
	volume.MetricsProvider
}

// The in-tree plugins whose volumes the kubelet mounts read-only into
// containers (their GetAttributes().ReadOnly is true).
var readOnlyPlugins = []string{"configmap", "secret", "downward-api", "projected"}

func newMounter(v volmgr.MountedVolume) *mounter {
	ro := v.ReadOnly
	plugin := strings.ToLower(v.Plugin)
	for _, p := range readOnlyPlugins {
		if strings.HasSuffix(plugin, p) {
			ro = true
		}
	}
	var metrics volume.MetricsProvider
	if strings.Contains(plugin, "empty-dir") || strings.Contains(plugin, "emptydir") {
		// On the node's disk: du, as the kubelet's emptyDir does.
		metrics = volume.NewMetricsDu(v.Path)
	} else {
		metrics = volume.NewMetricsStatFS(v.Path)
	}
	return &mounter{
		path: v.Path,
		attrs: volume.Attributes{
			ReadOnly: ro,
			// Managed and SELinuxRelabel together let the runtime relabel:
			// volmgr says when the kubelet's mounter would.
			Managed:        v.SELinuxRelabel,
			SELinuxRelabel: v.SELinuxRelabel,
		},
		MetricsProvider: metrics,
	}
}

var errSetUpByVolmgr = errors.New("kubeletvm: volumes are set up by volmgr")

func (m *mounter) GetPath() string                          { return m.path }
func (m *mounter) GetAttributes() volume.Attributes         { return m.attrs }
func (m *mounter) SetUp(volume.MounterArgs) error           { return errSetUpByVolmgr }
func (m *mounter) SetUpAt(string, volume.MounterArgs) error { return errSetUpByVolmgr }

var _ volume.Mounter = (*mounter)(nil)

// blockMapper is a raw block volume's BlockVolumeMapper: the kubelet hands
// the symlink GetPodDeviceMapPath names (volmgr's
// ROOT/pods/UID/volumeDevices/PLUGIN/NAME) to the runtime.
type blockMapper struct{ path string }

func (b *blockMapper) GetGlobalMapPath(*volume.Spec) (string, error) {
	return "", errors.New("kubeletvm: the global map path is volmgr's")
}
func (b *blockMapper) GetPodDeviceMapPath() (string, string) {
	return filepath.Dir(b.path), filepath.Base(b.path)
}
func (b *blockMapper) SupportsMetrics() bool { return false }
func (b *blockMapper) GetMetrics() (*volume.Metrics, error) {
	return nil, volume.NewNotSupportedError()
}

var _ volume.BlockVolumeMapper = (*blockMapper)(nil)
