// Command devicebench measures what one GPU's fault costs under a rule of
// scope Device against the same fault under scope Node, side by side in
// one run on one kwok cluster (the real apiserver, scheduler and
// controller-manager, the chart's operator and monitors as host
// processes): GPU-seconds out of service per fault, the time from the
// finding to the DeviceTaintRule, and the pods each fault disturbed. Each
// of the two nodes runs eight ranks that each claim one GPU through a
// ResourceClaimTemplate (the e2e DRA stand-in publishes the GPUs).
//
//	go run ./hack/devicebench -faults 10
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
)

// patch is the e2e suite's short durations (seconds, not the minutes real
// machines need): both scopes run the same exit-code Jobs, which kwok
// finishes in about a second.
const patch = `{"spec":{
  "certification":{"newNodes":false},
  "recertification":{"soakWindow":"3s","backoff":"2s","steps":[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m","parser":{"type":"exit-code"}}]},
  "remediation":{"diagnostics":null,"resetGPU":{"job":{"image":"registry.invalid/reset:kwok","privileged":false},"timeout":"2m"}},
  "circuitBreaker":{"enabled":false},
  "devices":{"reset":{"image":"registry.invalid/reset:kwok","privileged":false},"job":{"image":"registry.invalid/recertify:kwok"},"timeout":"2m"}
}}`

const poll = 20 * time.Millisecond

type bench struct {
	ctx context.Context
	env *framework.Env
	c   client.Client
	// seen is when a watch first showed each finding's occurrence and each
	// rule's creation: the two watches see both with the same delay, so
	// the difference is the operator's.
	seen *sightings
}

// sightings are the times the watches saw findings occur (created, or
// their count go up) and rules made, by name.
type sightings struct {
	mu     sync.Mutex
	events map[string][]time.Time
	rules  map[string][]time.Time
}

// first is the first sighting of name in at at or after t.
func (s *sightings) first(at map[string][]time.Time, name string, t time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range at[name] {
		if !x.Before(t) {
			return x, true
		}
	}
	return time.Time{}, false
}

// watch records sightings until ctx ends.
func (b *bench) watch() error {
	wc, err := client.NewWithWatch(b.env.Cluster.Config, client.Options{Scheme: b.env.Cluster.Scheme})
	if err != nil {
		return err
	}
	b.seen = &sightings{events: map[string][]time.Time{}, rules: map[string][]time.Time{}}
	ew, err := wc.Watch(b.ctx, &gpuhealthv1alpha1.NodeHealthEventList{})
	if err != nil {
		return err
	}
	rw, err := wc.Watch(b.ctx, &resourcev1.DeviceTaintRuleList{})
	if err != nil {
		return err
	}
	counts := map[string]int64{}
	go func() {
		for e := range ew.ResultChan() {
			ev, ok := e.Object.(*gpuhealthv1alpha1.NodeHealthEvent)
			if !ok || ev.Status.Count <= counts[ev.Name] && e.Type != watch.Added {
				continue
			}
			counts[ev.Name] = ev.Status.Count
			b.seen.mu.Lock()
			b.seen.events[ev.Name] = append(b.seen.events[ev.Name], time.Now())
			b.seen.mu.Unlock()
		}
	}()
	go func() {
		for e := range rw.ResultChan() {
			if r, ok := e.Object.(*resourcev1.DeviceTaintRule); ok && e.Type == watch.Added {
				b.seen.mu.Lock()
				b.seen.rules[r.Name] = append(b.seen.rules[r.Name], time.Now())
				b.seen.mu.Unlock()
			}
		}
	}()
	return nil
}

func main() {
	faults := flag.Int("faults", 10, "single-GPU faults under scope Device (the node-scope fault runs once: it takes the node)")
	flag.Parse()
	if err := run(*faults); err != nil {
		fmt.Fprintln(os.Stderr, "devicebench:", err)
		os.Exit(1)
	}
}

func run(faults int) error {
	ctx := context.Background()
	root, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gpuhealth-devicebench-")
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[devicebench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	env, err := framework.Setup(ctx, framework.Options{Prefix: "gpuhealth-devicebench", Root: root, Dir: dir, Nodes: 2, PolicyPatch: patch, Log: logf})
	defer func() {
		if env != nil {
			_ = env.Teardown(ctx, false)
		}
	}()
	if err != nil {
		return err
	}
	b := &bench{ctx: ctx, env: env, c: env.Cluster.Client}
	if err := b.watch(); err != nil {
		return err
	}
	for i, n := range env.Nodes {
		if _, err := framework.PublishGPUs(ctx, env.Cluster, n, i); err != nil {
			return err
		}
		if err := b.ranks(n); err != nil {
			return err
		}
	}
	for _, n := range env.Nodes {
		if err := b.waitRanks(n, 8); err != nil {
			return err
		}
	}

	// Scope Device, on gpu-node-0: one fault at a time, each on the next GPU.
	var toRule []time.Duration
	var deviceOut time.Duration
	deviceDisturbed := 0
	for k := range faults {
		n, dev := env.Nodes[0], k%8
		before, err := b.rankUIDs(n)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := env.Monitors[n].InjectXID(dev, 48); err != nil {
			return err
		}
		back, err := b.deviceCycle(n, framework.GPUUUID(0, dev), fmt.Sprintf("gpu-%d", dev))
		if err != nil {
			return err
		}
		seen, ok1 := b.seen.first(b.seen.events, gpuhealthv1alpha1.EventName(n, gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, framework.GPUUUID(0, dev), "48"), start)
		ruled, ok2 := b.seen.first(b.seen.rules, devicetaint.RuleName(n, fmt.Sprintf("gpu-%d", dev)), start)
		if !ok1 || !ok2 {
			return fmt.Errorf("fault %d: the watches missed the finding (%v) or the rule (%v)", k+1, ok1, ok2)
		}
		toRule = append(toRule, ruled.Sub(seen))
		deviceOut += back.Sub(start)
		if err := b.waitRanks(n, 8); err != nil {
			return err
		}
		after, err := b.rankUIDs(n)
		if err != nil {
			return err
		}
		deviceDisturbed += disturbed(before, after)
		logf("device fault %d on gpu-%d: finding → rule %s, out %s", k+1, dev, ruled.Sub(seen).Round(time.Millisecond), back.Sub(start).Round(time.Millisecond))
	}

	// Scope Node, on gpu-node-1: the same fault takes the node.
	if err := b.scope(gpuhealthv1alpha1.ScopeNode); err != nil {
		return err
	}
	n := env.Nodes[1]
	before, err := b.rankUIDs(n)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := env.Monitors[n].InjectXID(3, 48); err != nil {
		return err
	}
	back, err := b.nodeCycle(n)
	if err != nil {
		return err
	}
	if err := b.waitRanks(n, 8); err != nil {
		return err
	}
	after, err := b.rankUIDs(n)
	if err != nil {
		return err
	}
	nodeOut := back.Sub(start)
	slices.Sort(toRule)
	perDevice := deviceOut.Seconds() / float64(faults)
	perNode := 8 * nodeOut.Seconds()
	fmt.Printf("| measure | scope Device | scope Node |\n|---|---|---|\n")
	fmt.Printf("| GPU-seconds out of service per single-GPU fault | %.1f (1 GPU × %.1f s, mean of %d) | %.1f (8 GPUs × %.1f s) |\n", perDevice, perDevice, faults, perNode, nodeOut.Seconds())
	fmt.Printf("| ratio device / node | %.3f | 1 |\n", perDevice/perNode)
	fmt.Printf("| finding → DeviceTaintRule p50 / p99 (seen by watches) | %s / %s (%d faults) | — |\n", pct(toRule, 50), pct(toRule, 99), faults)
	fmt.Printf("| pods disturbed per fault | %.1f (of 8 ranks) | %d (of 8 ranks) |\n", float64(deviceDisturbed)/float64(faults), disturbed(before, after))
	return nil
}

func pct(ds []time.Duration, p int) string {
	i := (len(ds)*p + 99) / 100
	return ds[max(min(i, len(ds))-1, 0)].Round(100 * time.Microsecond).String()
}

// scope sets the shipped per-GPU XID rule's scope.
func (b *bench) scope(s gpuhealthv1alpha1.RuleScope) error {
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	if err := b.c.Get(b.ctx, types.NamespacedName{Name: "default"}, p); err != nil {
		return err
	}
	for i := range p.Spec.Rules {
		if p.Spec.Rules[i].Name == "per-gpu-xids" {
			p.Spec.Rules[i].Scope = s
		}
	}
	return b.c.Update(b.ctx, p)
}

// ranks creates eight pods on node, each claiming one GPU.
func (b *bench) ranks(node string) error {
	_, err := framework.CreateRanks(b.ctx, b.env.Cluster, "bench-"+node, "ranks", node, 8)
	return err
}

// rankUIDs are the UIDs of node's running ranks.
func (b *bench) rankUIDs(node string) (map[types.UID]bool, error) {
	var list corev1.PodList
	if err := b.c.List(b.ctx, &list, client.InNamespace("bench-"+node)); err != nil {
		return nil, err
	}
	out := map[types.UID]bool{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.UID] = true
		}
	}
	return out, nil
}

func disturbed(before, after map[types.UID]bool) int {
	n := 0
	for uid := range before {
		if !after[uid] {
			n++
		}
	}
	return n
}

func (b *bench) waitRanks(node string, want int) error {
	return framework.Poll(b.ctx, 2*time.Minute, func() (bool, string) {
		uids, err := b.rankUIDs(node)
		if err != nil {
			return false, err.Error()
		}
		return len(uids) == want, fmt.Sprintf("%d of %d ranks running on %s", len(uids), want, node)
	})
}

// deviceCycle waits for the GPU to go out and come back, and says when it
// was back.
func (b *bench) deviceCycle(node, uuid, device string) (time.Time, error) {
	deadline := time.Now().Add(3 * time.Minute)
	out := false
	for time.Now().Before(deadline) {
		now := time.Now()
		{
			// Back once the status named the GPU out and no longer does
			// (the rule is made before the status is written).
			nh := &gpuhealthv1alpha1.NodeHealth{}
			if b.c.Get(b.ctx, types.NamespacedName{Name: node}, nh) == nil {
				named := slices.ContainsFunc(nh.Status.Devices, func(d gpuhealthv1alpha1.DeviceStatus) bool { return d.UUID == uuid })
				switch {
				case named:
					out = true
				case out:
					return now, nil
				}
			}
		}
		time.Sleep(poll)
	}
	return time.Time{}, fmt.Errorf("GPU %s of %s did not go out and back within 3 minutes (out %v)", device, node, out)
}

// nodeCycle waits for the node to leave service and return, and says when
// it was back.
func (b *bench) nodeCycle(node string) (time.Time, error) {
	out := false
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		n := &corev1.Node{}
		if b.c.Get(b.ctx, types.NamespacedName{Name: node}, nh) == nil && b.c.Get(b.ctx, types.NamespacedName{Name: node}, n) == nil {
			if n.Spec.Unschedulable || nh.Status.Phase != gpuhealthv1alpha1.PhaseHealthy {
				out = true
			} else if out {
				return time.Now(), nil
			}
		}
		time.Sleep(poll)
	}
	return time.Time{}, fmt.Errorf("node %s did not go out and back within 5 minutes", node)
}
