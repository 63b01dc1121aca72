//go:build tools

// This file pins the kubelet command scripts/kubelet-fork.sh builds from
// the k8s.io/kubernetes module (no Kubernetes source is kept in this
// repository).
package kubeletvm

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
