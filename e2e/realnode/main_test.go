//go:build e2enode

package realnode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// env is the real node and the installation every case runs against, in
// order.
var env *nodeEnv

var ctx = context.Background()

// nodeEnv is hack/realnode.sh's node with gpuhealth installed on it.
type nodeEnv struct {
	Root string
	// Run is the node's run folder (GPUHEALTH_REALNODE_DIR).
	Run string
	// Vars are the lines hack/realnode.sh up printed (KUBECONFIG=…).
	Vars    map[string]string
	Cluster *framework.Cluster
	// Node is the real node's name.
	Node string
	// FakeGPU is the host folder mounted into the monitor pod: the fake
	// NVML library, its scenario and the kernel log file.
	FakeGPU  string
	Scenario string
	// Spool is the host folder of the monitor's spool (its hostPath).
	Spool string
	// ValuesFile holds the suite's chart values.
	ValuesFile string
	// ImageTag of the gpuhealth images (make image).
	ImageTag string
	Log      func(format string, args ...any)
}

// realIndex numbers the real node's GPUs (framework.GPUUUID) apart from the
// fake nodes'.
const realIndex = 9

// testJobImage is e2e/testjob, built and imported by TestMain.
const testJobImage = "localhost/gpuhealth-testjob:e2e"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	log.SetLogger(logr.Discard())
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[e2e-node %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	keep := os.Getenv("GPUHEALTH_E2E_KEEP") != ""
	if _, err := realnode(root, "status"); err == nil {
		logf("a real node is already up on this machine (one kept with GPUHEALTH_E2E_KEEP?); run hack/realnode.sh down first")
		return 1
	}
	env = &nodeEnv{Root: root, Log: logf, ImageTag: os.Getenv("GPUHEALTH_IMAGE_TAG")}
	if env.ImageTag == "" {
		env.ImageTag = "dev"
	}
	code := 1
	start := time.Now()
	if err := env.setup(); err != nil {
		logf("setting up: %v", err)
	} else {
		logf("real node up and gpuhealth installed in %s", time.Since(start).Round(time.Millisecond))
		SetDefaultEventuallyTimeout(2 * time.Minute)
		SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
		code = m.Run()
	}
	if env.Run != "" {
		env.saveLogs()
	}
	if keep {
		logf("the node stays up (GPUHEALTH_E2E_KEEP): export $(hack/realnode.sh env | grep KUBECONFIG); hack/realnode.sh down when done")
		return code
	}
	if _, err := realnode(root, "down"); err != nil {
		logf("tearing down: %v", err)
		code = 1
	}
	if code == 0 {
		_ = os.RemoveAll(env.Run)
	} else {
		logf("logs of every component, the pods and the objects are in %s/logs", env.Run)
	}
	return code
}

// realnode runs hack/realnode.sh (its progress goes to stderr) and returns
// its stdout.
func realnode(root string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "hack", "realnode.sh"), args...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("hack/realnode.sh %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func (e *nodeEnv) setup() error {
	e.Log("starting the real node (hack/realnode.sh up)")
	out, err := realnode(e.Root, "up")
	if err != nil {
		return err
	}
	e.Vars = map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			e.Vars[k] = v
		}
	}
	e.Run, e.Node = e.Vars["GPUHEALTH_REALNODE_DIR"], e.Vars["REALNODE_NODE"]
	if e.Run == "" || e.Node == "" || e.Vars["KUBECONFIG"] == "" {
		return fmt.Errorf("hack/realnode.sh up printed no GPUHEALTH_REALNODE_DIR, REALNODE_NODE or KUBECONFIG:\n%s", out)
	}
	bin := e.Vars["REALNODE_BIN"]
	if e.Cluster, err = framework.Attach(e.Root, bin, e.Vars["KWOK_WORKDIR"], e.Vars["REALNODE_CLUSTER"]); err != nil {
		return err
	}
	e.Cluster.KubectlBin = filepath.Join(bin, "kubectl")
	if os.Getenv("HELM") == "" {
		_ = os.Setenv("HELM", filepath.Join(bin, "helm"))
	}

	e.Log("importing the images into the node's containerd")
	// The test Job's image is built while the others load.
	testJob := make(chan error, 1)
	go func() {
		_, err := realnode(e.Root, "static-image", "e2e/testjob", testJobImage)
		testJob <- err
	}()
	if _, err := realnode(e.Root, "load", "localhost/gpuhealth-operator:"+e.ImageTag, "localhost/gpuhealth-monitor:"+e.ImageTag); err != nil {
		return errors.Join(fmt.Errorf("%w (make image builds them)", err), <-testJob)
	}
	if err := <-testJob; err != nil {
		return err
	}

	// The GPU: the fake NVML library and its scenario, and a kernel log
	// file, in a host folder the monitor pod mounts.
	e.FakeGPU, e.Spool = filepath.Join(e.Run, "fakegpu"), filepath.Join(e.Run, "spool")
	// A new node starts with a new spool and kernel log: a kept run
	// folder's kmsg cursor would skip this run's records.
	for _, dir := range []string{e.FakeGPU, e.Spool} {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(e.FakeGPU, 0o755); err != nil {
		return err
	}
	lib, err := fakenvml.Build(e.FakeGPU)
	if err != nil {
		return err
	}
	e.Scenario = filepath.Join(e.FakeGPU, "scenario.txt")
	if err := os.WriteFile(e.Scenario, []byte(framework.Scenario(realIndex)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.FakeGPU, "kmsg"), nil, 0o644); err != nil {
		return err
	}

	e.Log("creating 4 fake GPU nodes beside %s", e.Node)
	for i := range 4 {
		if err := e.Cluster.AddFakeNode(ctx, fmt.Sprintf("gpu-node-%d", i), 0); err != nil {
			return err
		}
	}

	e.ValuesFile = filepath.Join(e.Run, "values-e2e.yaml")
	if err := os.WriteFile(e.ValuesFile, []byte(e.values(filepath.Base(lib))), 0o600); err != nil {
		return err
	}
	e.Log("helm install of charts/gpuhealth (remediation profile and %s)", e.ValuesFile)
	start := time.Now()
	if _, err := e.helmRelease(ctx, "install"); err != nil {
		return err
	}
	e.Log("helm install --wait took %s", time.Since(start).Round(time.Millisecond))
	// helm's --wait accepts a DaemonSet with monitor.updateStrategy's
	// maxUnavailable of its pods not ready: the fake nodes' pods may stand
	// in for the real one. Wait for the real one.
	if err := framework.Poll(ctx, 2*time.Minute, e.monitorReady); err != nil {
		return err
	}
	e.Log("the monitor pod on %s is Ready %s after helm install began", e.Node, time.Since(start).Round(time.Millisecond))
	return nil
}

// monitorReady: the monitor DaemonSet's pod on the real node is Ready.
func (e *nodeEnv) monitorReady() (bool, string) {
	var list corev1.PodList
	if err := e.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
		client.MatchingLabels{"app.kubernetes.io/name": "gpuhealth-monitor"}, client.MatchingFields{"spec.nodeName": e.Node}); err != nil {
		return false, err.Error()
	}
	for _, p := range list.Items {
		if running(&p) {
			return true, ""
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Waiting != nil {
				return false, fmt.Sprintf("monitor pod %s: %s: %s", p.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
			}
		}
	}
	return false, fmt.Sprintf("no ready monitor pod on %s (%d pods)", e.Node, len(list.Items))
}

// helmRelease runs helm install or upgrade of the suite's release with its
// values, and more arguments.
func (e *nodeEnv) helmRelease(ctx context.Context, verb string, more ...string) (string, error) {
	args := append([]string{verb, framework.ReleaseName, "charts/gpuhealth", "--namespace", framework.Namespace, "--create-namespace",
		"-f", "charts/gpuhealth/values-remediation.yaml", "-f", e.ValuesFile, "--wait", "--timeout", "3m"}, more...)
	return e.Cluster.Helm(ctx, args...)
}

// values are the suite's chart values on top of the remediation profile:
// the images built here, never pulled; both operator replicas on the real
// node; the monitor with the fake NVML library and a kernel log file from
// the host; remediation and recertification Jobs that run e2e/testjob; and
// durations short enough for a test.
func (e *nodeEnv) values(lib string) string {
	return fmt.Sprintf(`image:
  tag: %[1]q
  pullPolicy: Never
operator:
  image: {repository: localhost/gpuhealth-operator}
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  affinity: null
  resources: {requests: {cpu: 10m, memory: 64Mi}}
monitor:
  image: {repository: localhost/gpuhealth-monitor}
  # This machine's / is a private mount: HostToContainer propagation is
  # refused (docs/e2e.md). No IMEX here anyway.
  driverRoot: ""
  spoolHostPath: %[3]s
  config:
    nvml: {libraryPath: /fakegpu/%[5]s, pollInterval: 1s, window: 5s}
    kmsg: {path: /fakegpu/kmsg}
    publish: {window: 1s}
  extraEnv:
  - {name: %[6]s, value: /fakegpu/scenario.txt}
  extraVolumes:
  - name: fakegpu
    hostPath: {path: %[4]s, type: Directory}
  extraVolumeMounts:
  - {name: fakegpu, mountPath: /fakegpu, readOnly: true}
# The suite's Jobs run e2e/testjob, an image of this machine's.
jobs:
  allowedImagePrefixes: [%[10]q]
policy:
  spec:
    drain:
      # The operator's own pods stay: this cluster has one real node, so an
      # evicted operator replica could not be replaced (docs/e2e.md).
      skipNamespaces: [kube-system, %[7]s]
      timeout: 5m
    remediation:
      diagnostics:
        job: {image: %[8]s, command: [/testjob, --sleep=1s, diagnostics]}
        timeout: 1m
        retain: 2h
      resetGPU:
        job: {image: %[8]s, command: [/testjob, --sleep=6s, reset-gpu], privileged: false}
        timeout: 2m
      rebootNode:
        job: {image: %[8]s, command: [/testjob, --sleep=2s, reboot-node], privileged: false, hostPID: false}
        timeout: 2m
    # No DRA driver on this node: one-GPU findings fall back to the node,
    # but the policy's Jobs must still be the install's.
    devices:
      reset: {image: %[8]s, command: [/testjob, --sleep=1s, reset-one-gpu], privileged: false}
      job: {image: %[8]s, command: [/testjob, --sleep=1s, test-one-gpu]}
    # The suite prints what dcgmi diag -j and all_reduce_perf print, judged
    # by their parsers from the pods' logs; certification of new nodes
    # only on request (the fake nodes print nothing).
    certification:
      newNodes: false
      backoff: 2s
      steps: %[9]s
    recertification:
      steps: %[9]s
      soakWindow: 3s
      backoff: 2s
      maxAttempts: 2
    circuitBreaker: {enabled: false}
`, e.ImageTag, e.Node, e.Spool, e.FakeGPU, lib, fakenvml.ScenarioEnv, framework.Namespace, testJobImage, realSuite(400),
		testJobImage[:strings.LastIndex(testJobImage, ":")+1])
}

// realSuite is the real node's suite as JSON (YAML flow style): a DCGM
// level 2 diagnostic and a single-node all-reduce whose report reaches
// busbw GB/s at 4 GiB, against a 100 GB/s threshold for any product.
func realSuite(busbw float64) string {
	return fmt.Sprintf(`[{"name":"dcgm-diag","job":{"image":%[1]q,"command":["/testjob","--report=dcgm-diag","--sleep=1s"]},"timeout":"2m","parser":{"type":"dcgm-diag"}},`+
		`{"name":"nccl-allreduce","job":{"image":%[1]q,"command":["/testjob","--report=nccl-tests"],"env":[{"name":"TESTJOB_BUSBW","value":"%[2]g"}]},"timeout":"2m",`+
		`"parser":{"type":"nccl-tests","nccl":{"defaultMinBusBandwidthGBps":100}}}]`, testJobImage, busbw)
}

// injectXID makes GPU device of the real node raise XID code after delay.
func (e *nodeEnv) injectXID(device, code int, delay time.Duration) error {
	return framework.AppendScenario(e.Scenario, fmt.Sprintf("xid device=%d code=%d at=%s", device, code, fakenvml.At(time.Now().Add(delay))))
}

// saveLogs keeps what a failure needs: the control plane's logs, the pods'
// logs (the kubelet's files) and the objects, in the run folder's logs/.
func (e *nodeEnv) saveLogs() {
	dst := filepath.Join(e.Run, "logs")
	if e.Cluster != nil {
		_ = exec.Command("cp", "-r", e.Cluster.LogsDir(), filepath.Join(dst, "cluster")).Run()
		if out, err := e.Cluster.Kubectl(ctx, "get", "nodes,nodehealths,nodehealthevents,remediationpolicies,deployments,daemonsets,jobs,pods,leases,events", "-A", "-o", "yaml"); err == nil {
			_ = os.WriteFile(filepath.Join(dst, "objects.yaml"), []byte(out), 0o600)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command("cp", "-rL", filepath.Join(e.Run, "pod-logs"), filepath.Join(dst, "pods"))
	cmd.Stderr = &stderr
	_ = cmd.Run()
}

// execOutput runs a command and returns its stdout, and its stderr with
// the error.
func execOutput(name string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), err
}
