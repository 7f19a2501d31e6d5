// Command demo is `make demo`: it builds what it needs, starts a local kwok
// cluster with four fake GPU nodes and a sample training workload, runs the
// real gpuhealth-operator and a real gpuhealth-monitor per node (with a fake
// NVML library), injects XID 79 on one node and prints the story live until
// that node is Healthy again. Then it publishes another node's GPUs as
// NVIDIA's DRA driver would, runs eight ranks there that each claim one
// GPU, injects XID 48 on one GPU and prints how that GPU alone goes out of
// service and back while the node and the seven other ranks run on. The
// cluster and processes stay up afterwards; `make demo-down` (demo -down)
// removes them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

const (
	clusterName = "gpuhealth-demo"
	faultyNode  = "gpu-node-1"
	// draNode publishes its GPUs as NVIDIA's DRA driver does; gpu-5 of it
	// fails alone.
	draNode      = "gpu-node-3"
	draNodeIndex = 3
	draGPU       = 5
)

// demoPolicy shortens the default policy's waits so the story takes
// seconds. kwok runs no container, so nothing prints the DCGM and NCCL
// reports the shipped suite judges: here the suite is one step judged by
// its exit code (kwok finishes the Job's pod), and new nodes are not
// certified.
const demoPolicy = `{"spec":{
  "certification":{"newNodes":false},
  "recertification":{"soakWindow":"5s","backoff":"5s","steps":[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok"},"timeout":"5m","parser":{"type":"exit-code"}}]},
  "circuitBreaker":{"threshold":"100%"},
  "drain":{"timeout":"5m"}
}}`

func main() {
	down := flag.Bool("down", false, "Remove the demo cluster and stop its processes.")
	flag.Parse()
	dir := demoDir()
	var err error
	if *down {
		err = teardown(dir)
		if err == nil {
			fmt.Println("demo removed")
		}
	} else {
		err = run(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// demoDir is where the demo keeps binaries, kubeconfigs and logs: outside
// the repository, next to the cached control-plane binaries.
func demoDir() string {
	if c := os.Getenv("GPUHEALTH_CACHE"); c != "" {
		return filepath.Join(c, "demo")
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "gpuhealth", "demo")
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(dir string) error {
	started := time.Now()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if _, err := os.Stat(dir); err == nil {
		say("removing the previous demo")
		if err := teardown(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	env, err := framework.Setup(ctx, framework.Options{
		Prefix: clusterName, ExactName: true, Root: root, Dir: dir, Nodes: 4, PolicyPatch: demoPolicy, Scenario: demoScenario,
		Log: func(format string, args ...any) { say(format, args...) },
	})
	if err := savePids(dir, env); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (logs in %s; make demo-down cleans up)", err, dir)
	}
	say("starting a sample training job: 3 replicas × 8 GPUs, PodDisruptionBudget minAvailable 2")
	if err := framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
		Namespace: "ml", Name: "llm-pretrain", Replicas: 3,
		Allowed:      env.Nodes,
		Preferred:    []string{"gpu-node-0", "gpu-node-1", "gpu-node-2"},
		MinAvailable: ptr.To[int32](2),
	}); err != nil {
		return err
	}
	c := env.Cluster.Client
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "llm-pretrain")
		if err != nil {
			return false, err.Error()
		}
		return running(pods) == 3, fmt.Sprintf("%d of 3 training pods running", running(pods))
	}); err != nil {
		return err
	}
	printPods(ctx, env)
	time.Sleep(3 * time.Second)

	say("injecting XID 79 (GPU has fallen off the bus) on %s, GPU 3", faultyNode)
	if err := env.Monitors[faultyNode].InjectXID(3, 79); err != nil {
		return err
	}
	w := &watcher{c: c, events: map[string]string{}, phases: map[string]string{}, devices: map[string]string{}}
	err = framework.Poll(ctx, 5*time.Minute, func() (bool, string) {
		w.poll(ctx)
		w.pollPods(ctx, env)
		return w.phases[faultyNode] == string(gpuhealthv1alpha1.PhaseHealthy) && w.sawFault, "waiting for " + faultyNode + " to come back"
	})
	if err != nil {
		return err
	}
	say("%s is Healthy again — %s after make demo started", faultyNode, time.Since(started).Round(time.Second))
	printPods(ctx, env)
	printNodeEvents(ctx, c, faultyNode)
	if err := oneGPU(ctx, env, w); err != nil {
		return err
	}
	if err := drift(ctx, c); err != nil {
		return err
	}
	fmt.Printf(`
The cluster, the operator and the monitors keep running. Look around:

  export KUBECONFIG=%s
  kubectl get nodehealthevents            # what the monitors found (short name nhe)
  kubectl get nodehealth                  # where every node is (nh)
  kubectl get nodehealth %s -o yaml   # its history
  kubectl get jobs -n %s      # the reboot and recertification Jobs
  kubectl get pods -n ml -o wide          # where the training job runs now
  kubectl describe node %s            # the GPUHealthy condition and the Events

  export PATH=%s:$PATH
                                          # the kubectl plugin, kubectl-gpuhealth
  kubectl gpuhealth status                # the fleet: phases, budgets, breakers, Failed nodes, drift
  kubectl get nodeinventories             # each node's driver, VBIOS, modes (ninv)
  kubectl gpuhealth story %s   # the node's story in time order
  kubectl gpuhealth story %s   # one GPU out of service alone, and back
  kubectl get deviceTaintRules            # a GPU out alone has one while it is out

Inject another fault:  echo "xid device=0 code=48 at=@$(date +%%s)" >> %s
Logs:                  %s/operator.log, %s/<node>/monitor.log
Remove everything:     make demo-down
`, env.Cluster.Kubeconfig, faultyNode, framework.Namespace, faultyNode, pluginDir(), faultyNode, draNode, env.Monitors["gpu-node-2"].Scenario, dir, dir)
	return nil
}

// driftedNode runs another VBIOS than the demo's other nodes, as a node
// flashed by hand and forgotten would.
const driftedNode = "gpu-node-3"

// demoScenario is framework.Scenario, with driftedNode's GPUs on another
// VBIOS.
func demoScenario(i int) string {
	s := framework.Scenario(i)
	if fmt.Sprintf("gpu-node-%d", i) == driftedNode {
		s = strings.ReplaceAll(s, `name="NVIDIA H200"`, `name="NVIDIA H200" vbios=96.00.89.00.01`)
	}
	return s
}

// drift waits for the operator's Drift finding about driftedNode and says
// what it found.
func drift(ctx context.Context, c client.Client) error {
	name := gpuhealthv1alpha1.EventName(driftedNode, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, "", string(gpuhealthv1alpha1.DriftVBIOS))
	var ev gpuhealthv1alpha1.NodeHealthEvent
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Name: name}, &ev)
		return err == nil, "waiting for the stack drift of " + driftedNode
	}); err != nil {
		return err
	}
	say("%s runs another VBIOS than its pool (observed, it stays in service): %s", driftedNode, ev.Spec.Message)
	say("kubectl gpuhealth status shows drift per pool; kubectl get nodeinventories the stacks")
	return nil
}

func running(pods map[string][]corev1.Pod) int {
	n := 0
	for _, ps := range pods {
		for _, p := range ps {
			if p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
	}
	return n
}

func printPods(ctx context.Context, env *framework.Env) {
	pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "llm-pretrain")
	if err != nil {
		return
	}
	var where []string
	for _, n := range env.Nodes {
		for _, p := range pods[n] {
			where = append(where, fmt.Sprintf("%s on %s (%s)", p.Name, n, p.Status.Phase))
		}
	}
	say("training pods: %s", strings.Join(where, ", "))
}

// printNodeEvents prints the node's Events in time order, as
// `kubectl get events --field-selector involvedObject.name=NODE` lists
// them: each transition once. Events are sent asynchronously, so it lets
// them settle first.
func printNodeEvents(ctx context.Context, c client.Client, node string) {
	time.Sleep(2 * time.Second)
	list := &eventsv1.EventList{}
	if err := c.List(ctx, list); err != nil {
		say("listing events: %v", err)
		return
	}
	var mine []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node {
			mine = append(mine, e)
		}
	}
	sort.SliceStable(mine, func(i, j int) bool { return mine[i].EventTime.Before(&mine[j].EventTime) })
	say("Events on %s (kubectl get events --field-selector involvedObject.name=%s):", node, node)
	for _, e := range mine {
		count := int32(1)
		if e.Series != nil {
			count = e.Series.Count
		}
		fmt.Printf("  %-8s %-20s ×%d  %s\n", e.Type, e.Reason, count, e.Note)
	}
}

// watcher prints each change of a NodeHealthEvent or a NodeHealth phase.
type watcher struct {
	c        client.Client
	events   map[string]string
	phases   map[string]string
	sawFault bool
	pods     string
	// devices are the GPUs out alone as last printed, by node/device.
	devices map[string]string
}

// oneGPU is the demo's second act: XID 48 on one GPU of a node whose GPUs
// a DRA driver publishes takes that GPU alone out of service and back.
func oneGPU(ctx context.Context, env *framework.Env, w *watcher) error {
	say("publishing the GPUs of %s as NVIDIA's DRA driver does (ResourceSlice: pool %s, gpu-0…7 with their UUIDs)", draNode, draNode)
	if _, err := framework.PublishGPUs(ctx, env.Cluster, draNode, draNodeIndex); err != nil {
		return err
	}
	c := env.Cluster.Client
	say("starting 8 ranks on %s, each claiming one GPU through a ResourceClaimTemplate", draNode)
	if _, err := framework.CreateRanks(ctx, env.Cluster, "ranks", "ranks", draNode, 8); err != nil {
		return err
	}
	running := func() map[string]bool {
		var pods corev1.PodList
		uids := map[string]bool{}
		if c.List(ctx, &pods, client.InNamespace("ranks")) != nil {
			return uids
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				uids[string(p.UID)] = true
			}
		}
		return uids
	}
	ranks := func() int { return len(running()) }
	if err := framework.Poll(ctx, 2*time.Minute, func() (bool, string) {
		return ranks() == 8, fmt.Sprintf("%d of 8 ranks running", ranks())
	}); err != nil {
		return err
	}
	before := running()
	say("injecting XID 48 (double-bit ECC error) on %s, GPU %d: NVIDIA's catalog says a reset of that GPU clears it", draNode, draGPU)
	if err := env.Monitors[draNode].InjectXID(draGPU, 48); err != nil {
		return err
	}
	out := false
	if err := framework.Poll(ctx, 5*time.Minute, func() (bool, string) {
		w.poll(ctx)
		nh := &gpuhealthv1alpha1.NodeHealth{}
		if c.Get(ctx, client.ObjectKey{Name: draNode}, nh) == nil {
			out = out || len(nh.Status.Devices) > 0
			return out && len(nh.Status.Devices) == 0, "waiting for the GPU to come back"
		}
		return false, "reading the NodeHealth"
	}); err != nil {
		return err
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, string) {
		return ranks() == 8, fmt.Sprintf("%d of 8 ranks running", ranks())
	}); err != nil {
		return err
	}
	after, kept := running(), 0
	for uid := range before {
		if after[uid] {
			kept++
		}
	}
	say("GPU %d of %s is back in service and holds a rank again; the node never left service, and %d of the 8 ranks ran on undisturbed", draGPU, draNode, kept)
	story := exec.CommandContext(ctx, filepath.Join(pluginDir(), "kubectl-gpuhealth"), "story", draNode, "--kubeconfig", env.Cluster.Kubeconfig)
	b, err := story.CombinedOutput()
	fmt.Printf("\n$ kubectl gpuhealth story %s\n%s\n", draNode, b)
	return err
}

// pollPods prints where the training pods run when that changes.
func (w *watcher) pollPods(ctx context.Context, env *framework.Env) {
	pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "llm-pretrain")
	if err != nil {
		return
	}
	var where []string
	for _, n := range env.Nodes {
		for _, p := range pods[n] {
			where = append(where, fmt.Sprintf("%s (%s)", n, p.Status.Phase))
		}
	}
	if pending := pods[""]; len(pending) > 0 {
		where = append(where, fmt.Sprintf("%d unscheduled", len(pending)))
	}
	if s := strings.Join(where, ", "); s != w.pods {
		w.pods = s
		say("training pods on: %s", s)
	}
}

func (w *watcher) poll(ctx context.Context) {
	var evs gpuhealthv1alpha1.NodeHealthEventList
	if err := w.c.List(ctx, &evs); err == nil {
		for _, e := range evs.Items {
			s := fmt.Sprintf("NodeHealthEvent %s: %s %s %s code %s on %s, %s/%s, count %d, phase %s",
				e.Name, e.Spec.Source, e.Spec.Check, e.Spec.Component.Kind, e.Spec.Code, e.Spec.NodeName,
				e.Spec.Severity, e.Spec.RecommendedAction, e.Status.Count, orDash(string(e.Status.Phase)))
			if w.events[e.Name] != s {
				w.events[e.Name] = s
				say("%s", s)
			}
		}
	}
	var nhs gpuhealthv1alpha1.NodeHealthList
	if err := w.c.List(ctx, &nhs); err == nil {
		sort.Slice(nhs.Items, func(i, j int) bool { return nhs.Items[i].Name < nhs.Items[j].Name })
		for _, nh := range nhs.Items {
			p := string(nh.Status.Phase)
			detail := nh.Status.Reason
			if d := nh.Status.Drain; d != nil && p == string(gpuhealthv1alpha1.PhaseDraining) {
				detail += fmt.Sprintf(", %d of %d pods left", d.PodsRemaining, d.PodsTotal)
			}
			seen := map[string]bool{}
			for _, d := range nh.Status.Devices {
				key := nh.Name + "/" + d.Device
				seen[key] = true
				s := string(d.Phase) + ": " + d.Message
				if w.devices[key] != s {
					w.devices[key] = s
					say("GPU %s of %s (out alone, the node stays %s): %s", d.Device, nh.Name, orDash(p), s)
				}
			}
			for key := range w.devices {
				if strings.HasPrefix(key, nh.Name+"/") && !seen[key] {
					delete(w.devices, key)
					say("GPU %s is back in service", key)
				}
			}
			s := p + "|" + detail
			if w.phases[nh.Name+"|"] != s {
				w.phases[nh.Name+"|"] = s
				w.phases[nh.Name] = p
				if nh.Name == faultyNode && p != "" && p != string(gpuhealthv1alpha1.PhaseHealthy) {
					w.sawFault = true
				}
				say("NodeHealth %s: %s (%s)", nh.Name, orDash(p), orDash(detail))
			}
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// savePids records the processes the demo leaves running, for -down.
func savePids(dir string, env *framework.Env) error {
	if env == nil {
		return nil
	}
	var pids []string
	if env.Operator != nil && env.Operator.Pid() != 0 {
		pids = append(pids, strconv.Itoa(env.Operator.Pid()))
	}
	for _, m := range env.Monitors {
		if m.Pid() != 0 {
			pids = append(pids, strconv.Itoa(m.Pid()))
		}
	}
	return os.WriteFile(filepath.Join(dir, "pids"), []byte(strings.Join(pids, "\n")), 0o600)
}

// teardown stops the demo's processes, deletes its cluster and directory.
func teardown(dir string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "pids")); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	binDir, err := framework.ControlPlane(context.Background(), root)
	if err != nil {
		return err
	}
	c, err := framework.NewCluster(clusterName, true, root, binDir, filepath.Join(dir, "kwok"))
	if err != nil {
		return err
	}
	if _, statErr := os.Stat(filepath.Join(dir, "kwok", "clusters", clusterName)); statErr == nil {
		if err := c.Delete(context.Background()); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// pluginDir is where make build-plugin puts kubectl-gpuhealth: make demo
// runs from the repository root.
func pluginDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "_output/bin"
	}
	return filepath.Join(wd, "_output", "bin")
}
