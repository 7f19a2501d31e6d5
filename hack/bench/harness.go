package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

const (
	// gpuLabel is the label the bench policy selects nodes by.
	gpuLabel = "nvidia.com/gpu.present"
	// policyName is the RemediationPolicy the benchmark creates.
	policyName = "bench"
	// wavePolicyName is the second RemediationPolicy of the fault wave,
	// which drains the wave's nodes and no others.
	wavePolicyName = "bench-wave"
)

// controlPlaneArgs raise kube-controller-manager's and kube-scheduler's
// client rate limits (defaults 20 and 50 requests/s), as large clusters
// do: at the defaults, the ReplicaSet controller creates a 50,000-pod
// Deployment at 20 pods/s and the scheduler binds at 50/s, so setting up
// the 5,000-node run alone would take most of an hour, and a drain's
// replacement pods would wait for the controller's rate limit instead of
// the apiserver.
var controlPlaneArgs = []framework.ComponentArg{
	{Component: "kube-controller-manager", Key: "kube-api-qps", Value: "1000"},
	{Component: "kube-controller-manager", Key: "kube-api-burst", Value: "1000"},
	{Component: "kube-scheduler", Key: "kube-api-qps", Value: "1000"},
	{Component: "kube-scheduler", Key: "kube-api-burst", Value: "1000"},
}

// newCluster names a fresh kwok cluster for one run (kwok's default
// stages, controlPlaneArgs, o.timeout to start); Create starts it. It lives
// in kwokctl's usual work directory (KWOK_WORKDIR, or ~/.kwok), where its
// etcd keeps its data, and kwokctl writes its context to a private
// kubeconfig, so that the user's ~/.kube/config and current context stay
// untouched.
func newCluster(root string, o options) (*framework.Cluster, error) {
	workdir := os.Getenv("KWOK_WORKDIR")
	if workdir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		workdir = filepath.Join(home, ".kwok")
	}
	c, err := framework.NewCluster(fmt.Sprintf("gpuhealth-bench-%d", os.Getpid()), false, root, o.controlPlane, workdir)
	if err != nil {
		return nil, err
	}
	c.DefaultStages = true
	c.ComponentArgs = controlPlaneArgs
	c.StartTimeout = o.timeout
	c.ContextKubeconfig = filepath.Join(os.TempDir(), c.Name+".kubeconfig")
	return c, nil
}

// harness holds the clients and watches of one run.
type harness struct {
	o   options
	c   *framework.Cluster
	cfg *rest.Config // admin, unthrottled
	cs  kubernetes.Interface
	dyn dynamic.Interface
	crc client.Client // created once the CRDs are established

	nodes       *nodeWatch
	nodeHealths *phaseWatch
	// pods follows the workload pods once a phase needs them (podWatch).
	pods   *podWatch
	stopCh chan struct{}
	// sent counts the bytes of the write requests' bodies the harness's
	// clients sent (writeCounter).
	sent *atomic.Int64
}

// newHarness connects to the created cluster and starts the node watch.
func newHarness(ctx context.Context, c *framework.Cluster, o options) (*harness, error) {
	cfg := rest.CopyConfig(c.Config)
	// No client-side rate limit: the harness measures what the apiserver allows.
	cfg.QPS, cfg.Burst = -1, 1000
	cfg.Timeout = time.Minute
	cfg.UserAgent = "gpuhealth-bench"
	sent := &atomic.Int64{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return writeCounter{next: rt, bytes: sent} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	h := &harness{o: o, c: c, cfg: cfg, cs: cs, dyn: dyn, stopCh: make(chan struct{}), sent: sent}
	if err := h.waitReadyz(ctx); err != nil {
		return nil, err
	}
	h.nodes = startNodeWatch(cs, h.stopCh)
	return h, nil
}

func (h *harness) stopWatches() { close(h.stopCh) }

// podWatch returns the watch of the workload pods, started on first use:
// one informer holds every pod once, whichever phases follow pods.
func (h *harness) podWatch() *podWatch {
	if h.pods == nil {
		h.pods = startPodWatch(h.cs, h.stopCh)
	}
	return h.pods
}

// waitReadyz waits until the apiserver answers /readyz.
func (h *harness) waitReadyz(ctx context.Context) error {
	deadline := time.Now().Add(h.o.timeout)
	var last error
	for {
		_, err := h.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("apiserver not ready after %s: %w", h.o.timeout, last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// applyManifests applies the namespace, CRDs, the operator's RBAC and the
// monitor's (with its own-node admission policy) with kubectl, waits for
// the CRDs and starts the NodeHealth watch.
func (h *harness) applyManifests(ctx context.Context) error {
	if _, err := h.c.Kubectl(ctx, "apply", "-f", "config/manager/namespace.yaml", "-f", "config/crd", "-f", "config/rbac",
		"-f", "config/monitor/service_account.yaml", "-f", "config/monitor/role.yaml", "-f", "config/monitor/role_binding.yaml",
		"-f", "config/monitor/admission_policy.yaml"); err != nil {
		return err
	}
	crds := []string{"crd/nodehealthevents.gpuhealth.dev", "crd/nodehealths.gpuhealth.dev", "crd/remediationpolicies.gpuhealth.dev"}
	if _, err := h.c.Kubectl(ctx, append([]string{"wait", "--for=condition=Established", "--timeout=" + h.o.timeout.String()}, crds...)...); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := gpuhealthv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	crc, err := client.New(h.cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	h.crc = crc
	h.nodeHealths = startPhaseWatch(h.dyn, h.stopCh)
	return nil
}

// benchPolicy is the cordon benchmark's RemediationPolicy spec.
func benchPolicy() map[string]any {
	return map[string]any{
		"nodeSelector": map[string]any{"matchLabels": map[string]any{gpuLabel: "true"}},
		// Quarantine only: nothing drains, so nodes stay Quarantined.
		"budgets": map[string]any{"maxUnavailable": int64(0)},
		// A burst of N quarantines is what the circuit breaker exists to
		// stop; the benchmark measures the path behind it.
		"circuitBreaker": map[string]any{"enabled": false},
	}
}

// createPolicy creates a RemediationPolicy named name with spec. It is
// unstructured so that it reads the same whatever the Go types of this
// checkout carry.
func (h *harness) createPolicy(ctx context.Context, name string, spec map[string]any) error {
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gpuhealthv1alpha1.GroupVersion.String(),
		"kind":       "RemediationPolicy",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
	if err := h.crc.Create(ctx, p); err != nil {
		return fmt.Errorf("creating RemediationPolicy %s: %w", name, err)
	}
	if enabled, found, _ := unstructured.NestedBool(p.Object, "spec", "circuitBreaker", "enabled"); !found || enabled {
		logf("WARNING: the stored policy %s has no circuitBreaker.enabled=false (CRD without it?); a breaker, if any, may stop the burst", name)
	}
	return nil
}

// runOut runs a command and returns its combined output.
func runOut(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 10 * time.Second
	return cmd.CombinedOutput()
}

// runTo runs a command with its output going to w.
func runTo(ctx context.Context, w io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = 10 * time.Second
	return cmd.Run()
}

// sorted returns the keys of m, sorted.
func sorted[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
