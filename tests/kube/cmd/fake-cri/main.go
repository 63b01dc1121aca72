// Command fake-cri serves k8s.io/cri-client's fake container runtime on a
// unix socket for the real-kubelet harness, with the two fixes a real
// kubelet needs from it: every container has a log path inside the pod's
// log directory (with an empty one the kubelet's container-log cleanup globs
// its working directory and deletes what it finds), and images have a size.
//
// Every stopped container is logged to stderr, after it stopped, as
// `fake-cri: stopped container ID pod UID unix_ns=N` (N: wall clock, ns),
// and every stopped sandbox as `fake-cri: stopped sandbox ID pod UID
// unix_ns=N`; with --stop-delay a StopContainer takes that long before the
// container stops (a container slow to exit on SIGTERM), so a test can
// tell what the kubelet did while the container still ran.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// runtime is the stock fake with CreateContainer completed and stops
// delayed and logged.
type runtime struct {
	*fake.RemoteRuntime
	stopDelay time.Duration
}

// podUID is the UID of the pod of sandbox id (empty when unknown).
func (r runtime) podUID(sandbox string) string {
	svc := r.RuntimeService
	svc.Lock()
	defer svc.Unlock()
	if s, ok := svc.Sandboxes[sandbox]; ok && s.Metadata != nil {
		return s.Metadata.Uid
	}
	return ""
}

// StopContainer waits --stop-delay, stops the container, and logs it.
func (r runtime) StopContainer(ctx context.Context, req *kubeapi.StopContainerRequest) (*kubeapi.StopContainerResponse, error) {
	svc := r.RuntimeService
	svc.Lock()
	sandbox := ""
	running := false
	if c, ok := svc.Containers[req.ContainerId]; ok {
		sandbox = c.SandboxID
		running = c.State == kubeapi.ContainerState_CONTAINER_RUNNING
	}
	svc.Unlock()
	if running && r.stopDelay > 0 {
		time.Sleep(r.stopDelay)
	}
	resp, err := r.RemoteRuntime.StopContainer(ctx, req)
	if err == nil {
		fmt.Fprintf(os.Stderr, "fake-cri: stopped container %s pod %s unix_ns=%d\n", req.ContainerId, r.podUID(sandbox), time.Now().UnixNano())
	}
	return resp, err
}

// StopPodSandbox stops the sandbox (and its containers), and logs it.
func (r runtime) StopPodSandbox(ctx context.Context, req *kubeapi.StopPodSandboxRequest) (*kubeapi.StopPodSandboxResponse, error) {
	resp, err := r.RemoteRuntime.StopPodSandbox(ctx, req)
	if err == nil {
		fmt.Fprintf(os.Stderr, "fake-cri: stopped sandbox %s pod %s unix_ns=%d\n", req.PodSandboxId, r.podUID(req.PodSandboxId), time.Now().UnixNano())
	}
	return resp, err
}

// CreateContainer records the container's log path as a real runtime does:
// the sandbox's log directory joined with the container's relative path.
func (r runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	logDir := req.GetSandboxConfig().GetLogDirectory()
	logPath := req.GetConfig().GetLogPath()
	if logDir == "" || logPath == "" || !filepath.IsAbs(logDir) {
		return nil, fmt.Errorf("fake-cri: refusing a container without an absolute log path (directory %q, path %q)", logDir, logPath)
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	svc := r.RuntimeService
	svc.Lock()
	if c, ok := svc.Containers[resp.ContainerId]; ok {
		c.LogPath = filepath.Join(logDir, logPath)
	}
	svc.Unlock()
	return resp, nil
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket path to serve the CRI on")
	imageSize := flag.Uint64("image-size", 1<<20, "size reported for every image (the kubelet refuses 0)")
	stopDelay := flag.Duration("stop-delay", 0, "how long StopContainer takes on a running container")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "fake-cri: --endpoint is required")
		os.Exit(2)
	}
	base := fake.NewFakeRemoteRuntime()
	base.ImageService.SetFakeImageSize(*imageSize)
	base.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	r := runtime{RemoteRuntime: base, stopDelay: *stopDelay}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, r)
	kubeapi.RegisterImageServiceServer(server, r)
	_ = os.Remove(*endpoint)
	listener, err := net.Listen("unix", *endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: listen on %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fake-cri: serving on %s\n", *endpoint)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "fake-cri: %v\n", err)
		os.Exit(1)
	}
}
