package kubeletvm

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"volmgr/ffi/go/volmgr"
)

func typesUID(s string) k8stypes.UID { return k8stypes.UID(s) }

// watchNode follows this node's Node (a list/watch on its name, as the
// kubelet's own node informer): volmgr gets it (local PVs' node affinity)
// and its status.volumesAttached (with the attach/detach controller an
// attachable volume is set up once listed).
func (m *Manager) watchNode(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(m.opts.KubeClient, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", string(m.opts.NodeName)).String()
		}))
	inf := f.Core().V1().Nodes().Informer()
	onNode := func(obj interface{}) {
		if n, ok := obj.(*v1.Node); ok {
			m.nodeChanged(ctx, n)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onNode,
		UpdateFunc: func(_, obj interface{}) { onNode(obj) },
	})
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
}

func (m *Manager) nodeChanged(ctx context.Context, n *v1.Node) {
	logger := klog.FromContext(ctx)
	if b, err := objectJSON("Node", n); err == nil {
		if err := m.vm.UpsertObject(b); err != nil {
			logger.Error(err, "volmgr UpsertObject Node")
		}
	}
	names := make([]string, 0, len(n.Status.VolumesAttached))
	for _, a := range n.Status.VolumesAttached {
		names = append(names, string(a.Name))
	}
	if err := m.vm.MarkVolumesAttached(names); err != nil {
		logger.Error(err, "volmgr MarkVolumesAttached")
	}
}

// forwardEvents turns volmgr's events into the kubelet's: a failed set-up
// is a FailedMount warning on the pod, as the kubelet's operation executor
// records it.
func (m *Manager) forwardEvents(events <-chan volmgr.Event) {
	for ev := range events {
		var pod *v1.Pod
		if ev.PodUID != "" {
			pod, _ = m.opts.PodManager.GetPodByUID(k8stypes.UID(ev.PodUID))
		}
		switch ev.Kind {
		case "failed":
			klog.V(2).InfoS("volmgr: volume set-up failed", "podUID", ev.PodUID, "volume", ev.Volume, "err", ev.Error)
			if pod != nil {
				m.recorder.Eventf(pod, v1.EventTypeWarning, "FailedMount",
					"MountVolume.SetUp failed for volume %q : %s", ev.Volume, ev.Error)
			}
		case "mounted":
			klog.V(3).InfoS("volmgr: volume mounted", "podUID", ev.PodUID, "volume", ev.Volume, "path", ev.Path)
		case "unmounted":
			klog.V(3).InfoS("volmgr: volume unmounted", "podUID", ev.PodUID, "volume", ev.Volume)
		case "lost":
			klog.InfoS("volmgr: volume lost its mount (set up again)", "podUID", ev.PodUID, "volume", ev.Volume, "path", ev.Path)
		case "claim_resized":
			// The kubelet patches the claim's status after a node expansion;
			// not done here yet (volmgr asks again at the next mount).
			klog.InfoS("volmgr: claim resized on the node, status not patched", "namespace", ev.Namespace,
				"claim", ev.Claim, "sizeBytes", ev.SizeBytes)
		}
	}
}
