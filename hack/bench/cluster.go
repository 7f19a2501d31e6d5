package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

const (
	// gpuLabel is the label the bench policy selects nodes by.
	gpuLabel = "nvidia.com/gpu.present"
	// operatorNamespace and operatorServiceAccount come from config/manager and config/rbac.
	operatorNamespace      = "gpuhealth-system"
	operatorServiceAccount = "gpuhealth-operator"
	// policyName is the RemediationPolicy the benchmark creates.
	policyName = "bench"
)

// cluster is one kwokctl cluster with the binary runtime.
type cluster struct {
	name   string
	binDir string
	// kubeconfig is the file kwokctl adds its context to; a private one,
	// so that the user's ~/.kube/config and current context stay untouched.
	kubeconfig string
	// adminKubeconfig is the cluster's own admin kubeconfig (client certificate).
	adminKubeconfig string
	// workdir is kwokctl's work directory.
	workdir string
}

// newCluster names a cluster uniquely; it creates nothing yet.
func newCluster(binDir string) (*cluster, error) {
	for _, b := range []string{"kwokctl", "kwok", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if st, err := os.Stat(filepath.Join(binDir, b)); err != nil || st.IsDir() {
			return nil, fmt.Errorf("control-plane binary %s missing in %s (run hack/controlplane.sh)", b, binDir)
		}
	}
	var suffix [3]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("gpuhealth-bench-%d-%s", os.Getpid(), hex.EncodeToString(suffix[:]))
	workdir := os.Getenv("KWOK_WORKDIR")
	if workdir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		workdir = filepath.Join(home, ".kwok")
	}
	return &cluster{
		name:            name,
		binDir:          binDir,
		kubeconfig:      filepath.Join(os.TempDir(), name+".kubeconfig"),
		adminKubeconfig: filepath.Join(workdir, "clusters", name, "kubeconfig.yaml"),
		workdir:         workdir,
	}, nil
}

func (c *cluster) kwokctlPath() string { return filepath.Join(c.binDir, "kwokctl") }

// kwokctl runs kwokctl for this cluster; its output is returned in the error.
func (c *cluster) kwokctl(ctx context.Context, args ...string) error {
	args = append(args, "--name", c.name)
	out, err := runOut(ctx, c.kwokctlPath(), args...)
	if err != nil {
		return fmt.Errorf("kwokctl %s: %w\n%s", strings.Join(args, " "), err, tail(out, 2000))
	}
	return nil
}

// kwokctlConfig raises kube-controller-manager's and kube-scheduler's
// client rate limits (defaults 20 and 50 requests/s), as large clusters
// do: at the defaults, the ReplicaSet controller creates a 50,000-pod
// Deployment at 20 pods/s and the scheduler binds at 50/s, so setting up
// the 5,000-node run alone would take most of an hour, and a drain's
// replacement pods would wait for the controller's rate limit instead of
// the apiserver.
const kwokctlConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - {key: kube-api-qps, value: "1000"}
  - {key: kube-api-burst, value: "1000"}
- name: kube-scheduler
  extraArgs:
  - {key: kube-api-qps, value: "1000"}
  - {key: kube-api-burst, value: "1000"}
`

// create starts the cluster and waits for kwokctl to report it ready.
func (c *cluster) create(ctx context.Context, timeout time.Duration) error {
	b := func(name string) string { return filepath.Join(c.binDir, name) }
	config := filepath.Join(os.TempDir(), c.name+".kwokctl.yaml")
	if err := os.WriteFile(config, []byte(kwokctlConfig), 0o600); err != nil {
		return err
	}
	defer func() { _ = os.Remove(config) }()
	return c.kwokctl(ctx, "create", "cluster",
		"--runtime", "binary",
		"--config", config,
		"--kubeconfig", c.kubeconfig,
		"--timeout", timeout.String(),
		"--wait", timeout.String(),
		"--etcd-binary", b("etcd"),
		"--kube-apiserver-binary", b("kube-apiserver"),
		"--kube-controller-manager-binary", b("kube-controller-manager"),
		"--kube-scheduler-binary", b("kube-scheduler"),
		"--kwok-controller-binary", b("kwok"))
}

// delete removes the cluster, its processes and files.
func (c *cluster) delete(ctx context.Context) error {
	err := c.kwokctl(ctx, "delete", "cluster", "--kubeconfig", c.kubeconfig)
	_ = os.Remove(c.kubeconfig)
	return err
}

// harness holds the clients and watches of one run.
type harness struct {
	o   options
	c   *cluster
	cfg *rest.Config // admin, unthrottled
	cs  kubernetes.Interface
	dyn dynamic.Interface
	crc client.Client // created once the CRDs are established

	nodes       *nodeWatch
	nodeHealths *phaseWatch
	stopCh      chan struct{}
}

// newHarness connects to the cluster and starts the node watch.
func newHarness(ctx context.Context, c *cluster, o options) (*harness, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.adminKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading admin kubeconfig %s: %w", c.adminKubeconfig, err)
	}
	// No client-side rate limit: the harness measures what the apiserver allows.
	cfg.QPS, cfg.Burst = -1, 1000
	cfg.Timeout = time.Minute
	cfg.UserAgent = "gpuhealth-bench"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	h := &harness{o: o, c: c, cfg: cfg, cs: cs, dyn: dyn, stopCh: make(chan struct{})}
	if err := h.waitReadyz(ctx); err != nil {
		return nil, err
	}
	h.nodes = startNodeWatch(cs, h.stopCh)
	return h, nil
}

func (h *harness) stopWatches() { close(h.stopCh) }

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
	kc := "--kubeconfig=" + h.c.adminKubeconfig
	if out, err := runOut(ctx, "kubectl", kc, "apply", "-f", "config/manager/namespace.yaml", "-f", "config/crd", "-f", "config/rbac",
		"-f", "config/monitor/service_account.yaml", "-f", "config/monitor/role.yaml", "-f", "config/monitor/role_binding.yaml",
		"-f", "config/monitor/admission_policy.yaml"); err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, tail(out, 2000))
	}
	crds := []string{"crd/nodehealthevents.gpuhealth.dev", "crd/nodehealths.gpuhealth.dev", "crd/remediationpolicies.gpuhealth.dev"}
	args := append([]string{kc, "wait", "--for=condition=Established", "--timeout=" + h.o.timeout.String()}, crds...)
	if out, err := runOut(ctx, "kubectl", args...); err != nil {
		return fmt.Errorf("kubectl wait for CRDs: %w\n%s", err, tail(out, 2000))
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

// createPolicy creates the bench RemediationPolicy with spec. It is
// unstructured so that it reads the same whatever the Go types of this
// checkout carry.
func (h *harness) createPolicy(ctx context.Context, spec map[string]any) error {
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gpuhealthv1alpha1.GroupVersion.String(),
		"kind":       "RemediationPolicy",
		"metadata":   map[string]any{"name": policyName},
		"spec":       spec,
	}}
	if err := h.crc.Create(ctx, p); err != nil {
		return fmt.Errorf("creating RemediationPolicy: %w", err)
	}
	if enabled, found, _ := unstructured.NestedBool(p.Object, "spec", "circuitBreaker", "enabled"); !found || enabled {
		logf("WARNING: the stored policy has no circuitBreaker.enabled=false (CRD without it?); a breaker, if any, may stop the burst")
	}
	return nil
}

// tokenKubeconfig writes a kubeconfig that authenticates as the operator's
// service account with a bound token only (no client certificate), as
// `kubectl -n gpuhealth-system create token gpuhealth-operator --duration 2h`
// would issue it.
func (h *harness) tokenKubeconfig(ctx context.Context, path string) error {
	exp := int64((2 * time.Hour).Seconds())
	tr, err := h.cs.CoreV1().ServiceAccounts(operatorNamespace).CreateToken(ctx, operatorServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating a token for %s/%s: %w", operatorNamespace, operatorServiceAccount, err)
	}
	ca := h.cfg.CAData
	if len(ca) == 0 && h.cfg.CAFile != "" {
		if ca, err = os.ReadFile(h.cfg.CAFile); err != nil {
			return fmt.Errorf("reading the cluster CA: %w", err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: h.cfg.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: len(ca) == 0 && h.cfg.Insecure}
	kc.AuthInfos["gpuhealth-operator"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "gpuhealth-operator"}
	kc.CurrentContext = "bench"
	return clientcmd.WriteToFile(*kc, path)
}

// controlPlaneDir runs hack/controlplane.sh and returns its last stdout line.
func controlPlaneDir(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "hack/controlplane.sh")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/controlplane.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", fmt.Errorf("hack/controlplane.sh printed no directory")
	}
	return dir, nil
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

// tail returns at most the last n bytes of b, as text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
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
