//go:build tools

// Package tools pins the Kubernetes commands the harness builds from the
// k8s.io/kubernetes module (no Kubernetes source is kept in this repository).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
