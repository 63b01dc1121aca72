package kubeletvm

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"volmgr/ffi/go/volmgr"
)

// How long an object read is trusted: the kubelet's TTL-based object cache
// says one minute; an object missing, a claim not bound or an attachment
// not attached yet is read again sooner, as volmgr's manager mode does.
const (
	objectTTL     = time.Minute
	waitingTTL    = 2 * time.Second
	requestTimout = 10 * time.Second
	// ResourceExhausted, the gRPC code of a VolumeAttachment's attachError.
	grpcResourceExhausted = 8
)

type objKey struct{ kind, namespace, name string }

type objEntry struct {
	obj     runtime.Object // nil: missing or not readable
	rv      string
	fetched time.Time
	ttl     time.Duration
}

// objectCache reads what pods' volumes refer to with GETs (the Node
// authorizer lets a kubelet get exactly those) and hands each new version
// to volmgr (UpsertObject), or its deletion (DeleteObject).
type objectCache struct {
	client clientset.Interface
	vm     *volmgr.Manager
	node   string
	now    func() time.Time

	mu      sync.Mutex
	entries map[objKey]*objEntry
}

func newObjectCache(c clientset.Interface, vm *volmgr.Manager, node string) *objectCache {
	return &objectCache{client: c, vm: vm, node: node, now: time.Now, entries: map[objKey]*objEntry{}}
}

var kinds = map[string]schema.GroupVersionKind{
	"ConfigMap":             v1.SchemeGroupVersion.WithKind("ConfigMap"),
	"Secret":                v1.SchemeGroupVersion.WithKind("Secret"),
	"ServiceAccount":        v1.SchemeGroupVersion.WithKind("ServiceAccount"),
	"PersistentVolumeClaim": v1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"),
	"PersistentVolume":      v1.SchemeGroupVersion.WithKind("PersistentVolume"),
	"Node":                  v1.SchemeGroupVersion.WithKind("Node"),
	"CSIDriver":             storagev1.SchemeGroupVersion.WithKind("CSIDriver"),
	"VolumeAttachment":      storagev1.SchemeGroupVersion.WithKind("VolumeAttachment"),
}

func (c *objectCache) fetch(ctx context.Context, k objKey) (runtime.Object, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimout)
	defer cancel()
	get := metav1.GetOptions{}
	cv1, sv1 := c.client.CoreV1(), c.client.StorageV1()
	switch k.kind {
	case "ConfigMap":
		return cv1.ConfigMaps(k.namespace).Get(ctx, k.name, get)
	case "Secret":
		return cv1.Secrets(k.namespace).Get(ctx, k.name, get)
	case "ServiceAccount":
		return cv1.ServiceAccounts(k.namespace).Get(ctx, k.name, get)
	case "PersistentVolumeClaim":
		return cv1.PersistentVolumeClaims(k.namespace).Get(ctx, k.name, get)
	case "PersistentVolume":
		return cv1.PersistentVolumes().Get(ctx, k.name, get)
	case "CSIDriver":
		return sv1.CSIDrivers().Get(ctx, k.name, get)
	case "VolumeAttachment":
		return sv1.VolumeAttachments().Get(ctx, k.name, get)
	}
	return nil, fmt.Errorf("kubeletvm: kind %s not read", k.kind)
}

// get returns the object as last read, reading it again when its time to
// live is over; a new version goes to volmgr.
func (c *objectCache) get(ctx context.Context, k objKey) runtime.Object {
	if c.client == nil || k.name == "" {
		return nil
	}
	c.mu.Lock()
	e, ok := c.entries[k]
	if ok && c.now().Sub(e.fetched) < e.ttl {
		c.mu.Unlock()
		return e.obj
	}
	c.mu.Unlock()
	obj, err := c.fetch(ctx, k)
	logger := klog.FromContext(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok = c.entries[k]
	if !ok {
		e = &objEntry{}
		c.entries[k] = e
	}
	e.fetched = c.now()
	switch {
	case err == nil:
		acc, _ := metaAccessor(obj)
		rv := acc.GetResourceVersion()
		e.ttl = objectTTL
		if e.obj == nil || rv != e.rv || rv == "" {
			if b, err := objectJSON(k.kind, obj); err != nil {
				logger.Error(err, "Encoding object for volmgr", "kind", k.kind, "name", k.name)
			} else if err := c.vm.UpsertObject(b); err != nil {
				logger.Error(err, "volmgr UpsertObject", "kind", k.kind, "namespace", k.namespace, "name", k.name)
			}
		}
		e.obj, e.rv = obj, rv
	case apierrors.IsNotFound(err):
		if e.obj != nil {
			if err := c.vm.DeleteObject(k.kind, k.namespace, k.name); err != nil {
				logger.Error(err, "volmgr DeleteObject", "kind", k.kind, "namespace", k.namespace, "name", k.name)
			}
		}
		e.obj, e.rv, e.ttl = nil, "", waitingTTL
	default:
		// Forbidden, a timeout: keep what was read, try again soon.
		logger.V(2).Info("Cannot read object for volmgr", "kind", k.kind, "namespace", k.namespace, "name", k.name, "err", err)
		e.ttl = waitingTTL
	}
	return e.obj
}

// expire makes the next get of k read it again (a claim not bound yet).
func (c *objectCache) expireSoon(k objKey) {
	c.mu.Lock()
	if e, ok := c.entries[k]; ok && e.ttl > waitingTTL {
		e.ttl = waitingTTL
	}
	c.mu.Unlock()
}

func metaAccessor(obj runtime.Object) (metav1.Object, bool) {
	a, ok := obj.(metav1.Object)
	return a, ok
}

// objectJSON is obj as volmgr reads it: with its kind and apiVersion (a
// typed client leaves them out).
func objectJSON(kind string, obj runtime.Object) ([]byte, error) {
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(kinds[kind])
	return json.Marshal(obj)
}

// syncPod reads (once their time to live is over) the objects the pod's
// volumes refer to.
func (c *objectCache) syncPod(ctx context.Context, pod *v1.Pod) {
	if c.client == nil || pod == nil {
		return
	}
	ns := pod.Namespace
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		switch {
		case vol.ConfigMap != nil:
			c.get(ctx, objKey{"ConfigMap", ns, vol.ConfigMap.Name})
		case vol.Secret != nil:
			c.get(ctx, objKey{"Secret", ns, vol.Secret.SecretName})
		case vol.Projected != nil:
			for _, s := range vol.Projected.Sources {
				switch {
				case s.ConfigMap != nil:
					c.get(ctx, objKey{"ConfigMap", ns, s.ConfigMap.Name})
				case s.Secret != nil:
					c.get(ctx, objKey{"Secret", ns, s.Secret.Name})
				case s.ServiceAccountToken != nil:
					c.get(ctx, objKey{"ServiceAccount", ns, sa})
				}
			}
		case vol.CSI != nil:
			c.get(ctx, objKey{"CSIDriver", "", vol.CSI.Driver})
		case vol.PersistentVolumeClaim != nil || vol.Ephemeral != nil:
			c.syncClaim(ctx, pod, vol)
		}
	}
}

// claimName: the claim of a persistentVolumeClaim or ephemeral volume.
func claimName(pod *v1.Pod, vol *v1.Volume) string {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName
	case vol.Ephemeral != nil:
		return pod.Name + "-" + vol.Name
	}
	return ""
}

// syncClaim reads the claim, its PV, the PV's CSIDriver and, for an
// attachable CSI volume, its VolumeAttachment.
func (c *objectCache) syncClaim(ctx context.Context, pod *v1.Pod, vol *v1.Volume) {
	ck := objKey{"PersistentVolumeClaim", pod.Namespace, claimName(pod, vol)}
	pvc, _ := c.get(ctx, ck).(*v1.PersistentVolumeClaim)
	if pvc == nil {
		return
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != v1.ClaimBound {
		c.expireSoon(ck)
		if pvc.Spec.VolumeName == "" {
			return
		}
	}
	pv, _ := c.get(ctx, objKey{"PersistentVolume", "", pvc.Spec.VolumeName}).(*v1.PersistentVolume)
	if pv == nil || pv.Spec.CSI == nil {
		return
	}
	driver, _ := c.get(ctx, objKey{"CSIDriver", "", pv.Spec.CSI.Driver}).(*storagev1.CSIDriver)
	if driver != nil && driver.Spec.AttachRequired != nil && !*driver.Spec.AttachRequired {
		return
	}
	vk := objKey{"VolumeAttachment", "", attachmentName(pv.Spec.CSI.VolumeHandle, pv.Spec.CSI.Driver, c.node)}
	if va, _ := c.get(ctx, vk).(*storagev1.VolumeAttachment); va == nil || !va.Status.Attached {
		c.expireSoon(vk)
	}
}

// attachmentName is the CSI plugin's VolumeAttachment name.
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// cached returns an object as last read, without reading it.
func (c *objectCache) cached(k objKey) runtime.Object {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[k]; ok {
		return e.obj
	}
	return nil
}

// podVolumePV: the PV of a claim volume, as last read.
func (c *objectCache) podVolumePV(pod *v1.Pod, vol *v1.Volume) *v1.PersistentVolume {
	name := claimName(pod, vol)
	if name == "" {
		return nil
	}
	pvc, _ := c.cached(objKey{"PersistentVolumeClaim", pod.Namespace, name}).(*v1.PersistentVolumeClaim)
	if pvc == nil || pvc.Spec.VolumeName == "" {
		return nil
	}
	pv, _ := c.cached(objKey{"PersistentVolume", "", pvc.Spec.VolumeName}).(*v1.PersistentVolume)
	return pv
}

// attachRequired: the CSIDriver (as last read) does not say
// attachRequired: false (none read: the kubelet's default, attachable).
func (c *objectCache) attachRequired(driver string) bool {
	d, _ := c.cached(objKey{"CSIDriver", "", driver}).(*storagev1.CSIDriver)
	return d == nil || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired
}

// innerVolumeSpecName: the PV's name for a claim volume, else the volume's.
func (c *objectCache) innerVolumeSpecName(pod *v1.Pod, outer string) string {
	if pod == nil {
		return outer
	}
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == outer {
			if pv := c.podVolumePV(pod, &pod.Spec.Volumes[i]); pv != nil {
				return pv.Name
			}
		}
	}
	return outer
}

// attachExhausted is the CSI plugin's VerifyExhaustedResource: the PV's
// VolumeAttachment failed with ResourceExhausted and its CSIDriver updates
// the node's allocatable count.
func (c *objectCache) attachExhausted(ctx context.Context, pv *v1.PersistentVolume) bool {
	driver, _ := c.get(ctx, objKey{"CSIDriver", "", pv.Spec.CSI.Driver}).(*storagev1.CSIDriver)
	if driver == nil || driver.Spec.NodeAllocatableUpdatePeriodSeconds == nil || *driver.Spec.NodeAllocatableUpdatePeriodSeconds == 0 {
		return false
	}
	va, _ := c.get(ctx, objKey{"VolumeAttachment", "", attachmentName(pv.Spec.CSI.VolumeHandle, pv.Spec.CSI.Driver, c.node)}).(*storagev1.VolumeAttachment)
	if va == nil || va.Status.AttachError == nil || va.Status.AttachError.ErrorCode == nil {
		return false
	}
	return *va.Status.AttachError.ErrorCode == grpcResourceExhausted
}

// tokenSource makes the TokenRequests of projected serviceAccountToken
// volumes with the kubelet's client, bound to the pod.
type tokenSource struct{ client clientset.Interface }

func (t tokenSource) Token(req volmgr.TokenRequest) (string, time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimout)
	defer cancel()
	tr := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				APIVersion: "v1", Kind: "Pod", Name: req.PodName, UID: typesUID(req.PodUID),
			},
		},
	}
	if req.Audience != "" {
		tr.Spec.Audiences = []string{req.Audience}
	}
	if req.ExpirationSeconds > 0 {
		exp := req.ExpirationSeconds
		tr.Spec.ExpirationSeconds = &exp
	}
	out, err := t.client.CoreV1().ServiceAccounts(req.Namespace).CreateToken(ctx, req.ServiceAccount, tr, metav1.CreateOptions{})
	if err != nil {
		klog.ErrorS(err, "TokenRequest for volmgr", "namespace", req.Namespace, "serviceAccount", req.ServiceAccount, "pod", req.PodName)
		return "", time.Time{}, err
	}
	return out.Status.Token, out.Status.ExpirationTimestamp.Time, nil
}
