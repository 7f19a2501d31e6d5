package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels of a fake GPU node, as NVIDIA's GPU Operator and DRA driver set
// them on real ones.
const (
	GPUPresentLabel = "nvidia.com/gpu.present"
	CliqueLabel     = "nvidia.com/gpu.clique"
	GPUResource     = "nvidia.com/gpu"
	// ClusterUUID is the fake NVLink domain the nodes' cliques belong to.
	ClusterUUID = "7c3e2f10-0c0a-4a6e-9f3e-6d1b2a4c5e80"
)

// Options configure an Env.
type Options struct {
	// Prefix names the cluster (a random suffix is added unless
	// ExactName).
	Prefix    string
	ExactName bool
	// Root is the repository root.
	Root string
	// Dir holds binaries, kubeconfigs, scenarios, spools and logs.
	Dir string
	// Nodes is how many fake GPU nodes to create (gpu-node-0 …).
	Nodes int
	// MonitorNodes is how many of them, the first ones, get a
	// gpuhealth-monitor process; 0 means every node.
	MonitorNodes int
	// NoControllerLeaderElection: see Cluster.NoControllerLeaderElection
	// (for apiserver outages longer than 10 s).
	NoControllerLeaderElection bool
	// KernelLog makes each monitor also read a kernel log of its own (a
	// file in the node's folder, see Monitor.InjectKernelXIDs) besides
	// NVML.
	KernelLog bool
	// Scenario gives node i's fake NVML scenario; nil means Scenario.
	Scenario func(i int) string
	// PolicyPatch is a JSON merge patch applied to the chart's default
	// RemediationPolicy (config/samples') (shorter durations for a quick run).
	PolicyPatch string
	// OperatorArgs are extra flags for the operator.
	OperatorArgs []string
	// ComponentArgs are extra flags for the control-plane components
	// (feature gates, runtime-config).
	ComponentArgs []ComponentArg
	// Log receives progress lines.
	Log func(format string, args ...any)
}

// Env is a running gpuhealth installation on a kwok cluster.
type Env struct {
	Options
	Cluster  *Cluster
	Bins     Binaries
	Operator *Process
	Monitors map[string]*Monitor
	Nodes    []string
}

// Setup builds the binaries, creates the cluster, installs the manifests and
// the default policy, creates the GPU nodes, and starts a monitor per node
// and the operator. On error it returns what it made so far, for Teardown.
func Setup(ctx context.Context, o Options) (*Env, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	e := &Env{Options: o, Monitors: map[string]*Monitor{}}
	binDir, err := ControlPlane(ctx, o.Root)
	if err != nil {
		return e, err
	}
	o.Log("building gpuhealth-operator, gpuhealth-monitor and the fake NVML library")
	if e.Bins, err = Build(ctx, o.Root, o.Dir); err != nil {
		return e, err
	}
	if e.Cluster, err = NewCluster(o.Prefix, o.ExactName, o.Root, binDir, filepath.Join(o.Dir, "kwok")); err != nil {
		return e, err
	}
	e.Cluster.NoControllerLeaderElection = o.NoControllerLeaderElection
	e.Cluster.ComponentArgs = o.ComponentArgs
	o.Log("creating kwok cluster %s (real kube-apiserver, etcd, controller-manager, scheduler; fake nodes)", e.Cluster.Name)
	if err := e.Cluster.Create(ctx); err != nil {
		return e, err
	}
	o.Log("installing gpuhealth with its Helm chart (remediation profile; the operator and monitors run as host processes)")
	start := time.Now()
	if err := e.Cluster.Install(ctx); err != nil {
		return e, err
	}
	o.Log("helm install --wait took %s", time.Since(start).Round(time.Millisecond))
	if o.PolicyPatch != "" {
		if _, err := e.Cluster.Kubectl(ctx, "patch", "remediationpolicy", "default", "--type", "merge", "-p", o.PolicyPatch); err != nil {
			return e, err
		}
	}
	o.Log("creating %d fake GPU nodes", o.Nodes)
	start = time.Now()
	// All created first, then one wait: kwok readies them together.
	for i := range o.Nodes {
		name := fmt.Sprintf("gpu-node-%d", i)
		if err := e.Cluster.createFakeNode(ctx, name, i/4); err != nil {
			return e, err
		}
		e.Nodes = append(e.Nodes, name)
	}
	if err := e.Cluster.waitNodesReady(ctx, e.Nodes); err != nil {
		return e, err
	}
	o.Log("%d nodes Ready after %s", len(e.Nodes), time.Since(start).Round(time.Millisecond))
	monitored := e.Nodes
	if o.MonitorNodes > 0 && o.MonitorNodes < len(e.Nodes) {
		monitored = e.Nodes[:o.MonitorNodes]
	}
	o.Log("starting a gpuhealth-monitor on %d nodes (fake NVML, token bound to the node's DaemonSet pod)", len(monitored))
	start = time.Now()
	if err := e.startMonitors(ctx, monitored); err != nil {
		return e, err
	}
	o.Log("%d monitors ready after %s", len(monitored), time.Since(start).Round(time.Millisecond))
	o.Log("starting gpuhealth-operator as its service account")
	if e.Operator, err = NewOperator(ctx, e.Cluster, e.Bins.Operator, o.Dir, o.OperatorArgs...); err != nil {
		return e, err
	}
	if err := e.Operator.Start(ctx); err != nil {
		return e, err
	}
	return e, nil
}

// GPUUUID is the UUID of GPU device on the node with index node.
func GPUUUID(node, device int) string {
	return fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", node, device, node*8+device)
}

// Scenario is the fake NVML scenario of node i: eight idle H200s with 18
// NVLinks each and a healthy fabric. Idle as real ones are: the clocks say
// gpu_idle and the PCIe links have dropped to generation 1, which the
// slow-GPU checks must take for what it is.
func Scenario(i int) string {
	var b strings.Builder
	b.WriteString("# eight idle GPUs, 18 NVLinks each, fabric up\n")
	for d := range 8 {
		fmt.Fprintf(&b, "device index=%d uuid=%s pci=0000:%02x:00.0 name=\"NVIDIA H200\" links=18\n", d, GPUUUID(i, d), 0x18+d*0x10)
		fmt.Fprintf(&b, "fabric device=%d state=completed health=healthy status=success clique=%d cluster=%s\n", d, i/4, strings.ReplaceAll(ClusterUUID, "-", ""))
		fmt.Fprintf(&b, "clocks device=%d reasons=gpu_idle sm=345\nutil device=%d gpu=0\npcie device=%d gen=1\ntemp device=%d gpu=31 slowdown=87\n", d, d, d, d)
	}
	return b.String()
}

// startMonitors starts the monitors of nodes (node i of e.Nodes gets
// Scenario(i)) side by side, each waiting for its DaemonSet pod and then
// its /readyz; every one that was made is in e.Monitors, for Teardown,
// also when another failed.
func (e *Env) startMonitors(ctx context.Context, nodes []string) error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for i, n := range nodes {
		wg.Go(func() {
			scenario := Scenario
			if e.Scenario != nil {
				scenario = e.Scenario
			}
			m, err := NewMonitorWith(ctx, e.Cluster, e.Bins, e.Dir, n, scenario(i), MonitorOptions{KernelLog: e.KernelLog})
			if err == nil {
				mu.Lock()
				e.Monitors[n] = m
				mu.Unlock()
				err = m.Start(ctx)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("monitor on %s: %w", n, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// AddFakeNode registers a kwok-managed fake GPU node (eight GPUs, in NVLink
// clique clique) and waits until it is Ready.
func (c *Cluster) AddFakeNode(ctx context.Context, name string, clique int) error {
	if err := c.createFakeNode(ctx, name, clique); err != nil {
		return err
	}
	return c.waitNodesReady(ctx, []string{name})
}

// createFakeNode creates a kwok-managed fake GPU node (eight GPUs, in
// NVLink clique clique) without waiting for it.
func (c *Cluster) createFakeNode(ctx context.Context, name string, clique int) error {
	q := resource.MustParse
	res := corev1.ResourceList{corev1.ResourceCPU: q("96"), corev1.ResourceMemory: q("1Ti"), corev1.ResourcePods: q("110"), GPUResource: q("8")}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{
				"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
				GPUPresentLabel: "true", CliqueLabel: fmt.Sprintf("%s.%d", ClusterUUID, clique),
			},
		},
		Status: corev1.NodeStatus{Allocatable: res, Capacity: res},
	}
	if err := c.Client.Create(ctx, n); err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	return nil
}

// waitNodesReady waits until every node of names is Ready (a minute, and
// a second more per ten nodes).
func (c *Cluster) waitNodesReady(ctx context.Context, names []string) error {
	return Poll(ctx, time.Minute+time.Duration(len(names))*100*time.Millisecond, func() (bool, string) {
		var list corev1.NodeList
		if err := c.Client.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		ready := map[string]bool{}
		for i := range list.Items {
			ready[list.Items[i].Name] = nodeReady(&list.Items[i])
		}
		var not []string
		for _, n := range names {
			if !ready[n] {
				not = append(not, n)
			}
		}
		if len(not) == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d of %d nodes not Ready yet (%s …)", len(not), len(names), not[0])
	})
}

// Teardown stops the processes, copies the cluster's component logs next to
// ours when keepLogs, and deletes the cluster.
func (e *Env) Teardown(ctx context.Context, keepLogs bool) error {
	// Side by side: each may take its grace period to exit.
	var wg sync.WaitGroup
	if e.Operator != nil {
		wg.Go(e.Operator.Stop)
	}
	for _, m := range e.Monitors {
		wg.Go(m.Stop)
	}
	wg.Wait()
	if e.Cluster == nil {
		return nil
	}
	var errs []error
	if keepLogs {
		dst := filepath.Join(e.Dir, "cluster-logs")
		if out, err := exec.CommandContext(ctx, "cp", "-r", e.Cluster.LogsDir(), dst).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("copying cluster logs: %w: %s", err, out))
		}
		if out, err := e.Cluster.Kubectl(ctx, "get", "nodes,nodehealths,nodehealthevents,remediationpolicies,jobs,pods,events", "-A", "-o", "yaml"); err == nil {
			_ = os.WriteFile(filepath.Join(e.Dir, "objects.yaml"), []byte(out), 0o600)
		}
	}
	errs = append(errs, e.Cluster.Delete(ctx))
	return errors.Join(errs...)
}

// ControlPlane runs hack/controlplane.sh (which builds or finds the cached
// binaries) and returns the directory it prints last.
func ControlPlane(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"))
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/controlplane.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// DownLabel marks a node kwok leaves alone (e2e/testdata/kwok-stages.yaml).
const DownLabel = "e2e.gpuhealth.dev/down"

// KillNode makes a fake node die: kwok stops managing it (no heartbeats;
// pods bound to it no longer start, and deleted ones stay Terminating), and
// its Ready condition turns Unknown, as the node lifecycle controller
// reports a node that stopped heartbeating.
func (e *Env) KillNode(ctx context.Context, name string) error {
	if err := e.setDown(ctx, name, true); err != nil {
		return err
	}
	var n corev1.Node
	if err := e.Cluster.Client.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
		return err
	}
	now := metav1.Now()
	for i := range n.Status.Conditions {
		if c := &n.Status.Conditions[i]; c.Type == corev1.NodeReady {
			c.Status, c.Reason, c.Message, c.LastTransitionTime = corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status.", now
		}
	}
	if err := e.Cluster.Client.Status().Update(ctx, &n); err != nil {
		return fmt.Errorf("marking node %s NotReady: %w", name, err)
	}
	return nil
}

// ReviveNode hands a killed node back to kwok, which makes it Ready again
// and runs its pods.
func (e *Env) ReviveNode(ctx context.Context, name string) error {
	if err := e.setDown(ctx, name, false); err != nil {
		return err
	}
	return Poll(ctx, time.Minute, func() (bool, string) {
		var n corev1.Node
		if err := e.Cluster.Client.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
			return false, err.Error()
		}
		return nodeReady(&n), "node " + name + " not Ready again"
	})
}

func (e *Env) setDown(ctx context.Context, name string, down bool) error {
	var n corev1.Node
	if err := e.Cluster.Client.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
		return err
	}
	patch := client.MergeFrom(n.DeepCopy())
	if down {
		n.Labels[DownLabel] = "true"
	} else {
		delete(n.Labels, DownLabel)
	}
	if err := e.Cluster.Client.Patch(ctx, &n, patch); err != nil {
		return fmt.Errorf("labelling node %s %s=%v: %w", name, DownLabel, down, err)
	}
	return nil
}
