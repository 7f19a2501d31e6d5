// Command gangbench measures the GPU-time a multi-node job strands when one
// of its nodes fails, under drain.gangs Pods against drain.gangs Gang, side
// by side in one run on one kwok cluster (the real apiserver, scheduler
// and controller-manager, the chart's operator and a monitor as host
// processes). The job is a JobSet-shaped gang of one 8-GPU pod on each of
// 16 nodes; an XID 79 takes the first node out. The bench plays the job:
// once any rank is gone, the others wait for NCCL's collective timeout
// (-collective-timeout) and then exit, as torchrun does. The stranded
// GPU-time is, over the ranks on healthy nodes, their GPUs times the time
// from the node's fence (cordon) to the rank's end.
//
//	go run ./hack/gangbench -collective-timeout 120s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// patch is the e2e suite's short durations: the node's cycle runs
// exit-code Jobs that kwok finishes in about a second. The drain budget
// lets the one faulty node drain at once.
const patch = `{"spec":{
  "certification":{"newNodes":false},
  "recertification":{"soakWindow":"3s","backoff":"2s","steps":[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m","parser":{"type":"exit-code"}}]},
  "remediation":{"diagnostics":null,"rebootNode":{"timeout":"2m"}},
  "circuitBreaker":{"enabled":false},
  "drain":{"namespaces":[{"namespace":"bench-gang","mode":"Evict","gangs":"Gang"}]}
}}`

const (
	poll        = 20 * time.Millisecond
	gpusPerRank = 8
)

func main() {
	nodes := flag.Int("nodes", 16, "nodes the job spans, one 8-GPU rank each")
	timeout := flag.Duration("collective-timeout", 120*time.Second, "how long the healthy ranks wait for the lost one before they exit (NCCL's collective timeout)")
	flag.Parse()
	if err := run(*nodes, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "gangbench:", err)
		os.Exit(1)
	}
}

func run(nodes int, timeout time.Duration) error {
	ctx := context.Background()
	root, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gpuhealth-gangbench-")
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[gangbench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	env, err := framework.Setup(ctx, framework.Options{Prefix: "gpuhealth-gangbench", Root: root, Dir: dir, Nodes: nodes, MonitorNodes: 1, PolicyPatch: patch, Log: logf})
	defer func() {
		if env != nil {
			_ = env.Teardown(ctx, false)
		}
	}()
	if err != nil {
		return err
	}
	b := &bench{ctx: ctx, env: env, c: env.Cluster.Client, timeout: timeout, logf: logf}
	results := map[string]stranded{}
	for _, mode := range []string{"bench-gang", "bench-pods"} {
		s, err := b.fault(mode)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		results[mode] = s
	}
	g, p := results["bench-gang"], results["bench-pods"]
	fmt.Printf("| measure | drain.gangs Pods | drain.gangs Gang |\n|---|---|---|\n")
	fmt.Printf("| stranded GPU-time, fence → every rank ended (%d ranks × %d GPUs, %s collective timeout) | %.0f GPU-s | %.0f GPU-s |\n",
		nodes, gpusPerRank, timeout, p.gpuSeconds, g.gpuSeconds)
	fmt.Printf("| fence → last rank ended | %s | %s |\n", p.last.Round(time.Millisecond), g.last.Round(time.Millisecond))
	fmt.Printf("| ratio Gang / Pods | 1 | %.4f |\n", g.gpuSeconds/p.gpuSeconds)
	return nil
}

type bench struct {
	ctx     context.Context
	env     *framework.Env
	c       client.Client
	timeout time.Duration
	logf    func(string, ...any)
}

// stranded is what one fault cost the job.
type stranded struct {
	gpuSeconds float64
	last       time.Duration
}

// fault runs the job in namespace ns, takes its first node out, and
// measures until every rank has ended.
func (b *bench) fault(ns string) (stranded, error) {
	faulty := b.env.Nodes[0]
	if err := framework.Poll(b.ctx, 5*time.Minute, func() (bool, string) {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		n := &corev1.Node{}
		if b.c.Get(b.ctx, types.NamespacedName{Name: faulty}, nh) != nil || b.c.Get(b.ctx, types.NamespacedName{Name: faulty}, n) != nil {
			return false, "reading " + faulty
		}
		return nh.Status.Phase == gpuhealthv1alpha1.PhaseHealthy && !n.Spec.Unschedulable, faulty + " is " + string(nh.Status.Phase)
	}); err != nil {
		return stranded{}, err
	}
	if err := b.c.Create(b.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return stranded{}, err
	}
	for i, n := range b.env.Nodes {
		if err := b.c.Create(b.ctx, rank(ns, fmt.Sprintf("rank-%d", i), n)); err != nil {
			return stranded{}, err
		}
	}
	if err := framework.Poll(b.ctx, 2*time.Minute, func() (bool, string) {
		running, err := b.running(ns)
		return err == nil && len(running) == len(b.env.Nodes), fmt.Sprintf("%d of %d ranks running", len(running), len(b.env.Nodes))
	}); err != nil {
		return stranded{}, err
	}

	// Watch the ranks end, and play the job: once one is gone, the others
	// exit after the collective timeout.
	ended := map[string]time.Time{}
	var mu sync.Mutex
	stop := make(chan struct{})
	var fenced time.Time
	done := make(chan error, 1)
	go func() {
		var first time.Time
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-time.After(poll):
			}
			now := time.Now()
			if fenced.IsZero() {
				n := &corev1.Node{}
				if b.c.Get(b.ctx, types.NamespacedName{Name: faulty}, n) == nil && n.Spec.Unschedulable {
					fenced = now
				}
			}
			running, err := b.running(ns)
			if err != nil {
				continue
			}
			mu.Lock()
			for i := range b.env.Nodes {
				name := fmt.Sprintf("rank-%d", i)
				if _, ok := running[name]; !ok {
					if _, seen := ended[name]; !seen {
						ended[name] = now
					}
				}
			}
			over := len(ended) == len(b.env.Nodes)
			mu.Unlock()
			if first.IsZero() && len(running) < len(b.env.Nodes) {
				first = now
			}
			if !first.IsZero() && now.Sub(first) >= b.timeout {
				// NCCL gave up: every rank still there exits.
				for name := range running {
					_ = b.c.Delete(b.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.GracePeriodSeconds(0))
				}
			}
			if over {
				done <- nil
				return
			}
		}
	}()
	start := time.Now()
	if err := b.env.Monitors[faulty].InjectXID(0, 79); err != nil {
		close(stop)
		return stranded{}, err
	}
	select {
	case err := <-done:
		if err != nil {
			return stranded{}, err
		}
	case <-time.After(b.timeout + 3*time.Minute):
		close(stop)
		return stranded{}, fmt.Errorf("the ranks did not all end within %s", b.timeout+3*time.Minute)
	}
	if fenced.IsZero() {
		return stranded{}, fmt.Errorf("never saw %s cordoned", faulty)
	}
	var s stranded
	for i := range b.env.Nodes {
		if i == 0 {
			continue // the faulty node's rank is lost either way
		}
		end := ended[fmt.Sprintf("rank-%d", i)]
		s.gpuSeconds += gpusPerRank * max(end.Sub(fenced), 0).Seconds()
		s.last = max(s.last, end.Sub(fenced))
	}
	late := []string{}
	for i := range b.env.Nodes {
		name := fmt.Sprintf("rank-%d", i)
		if d := ended[name].Sub(fenced); d > 10*time.Second {
			late = append(late, fmt.Sprintf("%s +%s", name, d.Round(time.Millisecond)))
		}
	}
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := b.c.Get(b.ctx, types.NamespacedName{Name: faulty}, nh); err == nil && nh.Status.Drain != nil {
		for _, g := range nh.Status.Drain.Gangs {
			b.logf("%s: wave of %s %s/%s: %d members on %d nodes, sent %v", ns, g.Kind, g.Namespace, g.Name, g.Size, g.SpannedNodes, g.EvictedAt)
		}
	}
	if len(late) > 0 {
		b.logf("%s: ranks that ended more than 10 s after the fence: %v", ns, late)
	}
	b.logf("%s: XID 79 at +0s, fenced at +%s, last rank ended %s after the fence: %.0f GPU-seconds stranded",
		ns, fenced.Sub(start).Round(time.Millisecond), s.last.Round(time.Millisecond), s.gpuSeconds)
	return s, nil
}

// running are the ranks of ns not terminating, by name.
func (b *bench) running(ns string) (map[string]bool, error) {
	var list corev1.PodList
	if err := b.c.List(b.ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.Name] = true
		}
	}
	return out, nil
}

// rank is one JobSet-shaped rank of 8 GPUs on node.
func rank(ns, name, node string) *corev1.Pod {
	gpus := corev1.ResourceList{framework.GPUResource: *resource.NewQuantity(gpusPerRank, resource.DecimalSI)}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			"jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/restart-attempt": "0"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "train", Image: "trainer:fake", Command: []string{"torchrun", "train.py"},
				Resources: corev1.ResourceRequirements{Requests: gpus, Limits: gpus}}},
		},
	}
}
