package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

// victimLabel marks the nodes a drain race drains (the rest of its set
// are spares that take the replacement pods).
const victimLabel = "bench.gpuhealth.dev/victim"

// drainRun is one drainer's race on its own node set.
type drainRun struct {
	Name string
	// EvictionsPerSecond and MaxConcurrent are the policy's drain limits
	// (zero for kubectl drain).
	EvictionsPerSecond, MaxConcurrent int
	// Time is the first finding (or the drain command) to the last victim
	// seen with no workload pod.
	Time time.Duration
	// Exited is when kubectl drain returned (kubectl only).
	Exited time.Duration
	// Evictions is the workload pods that left the victims.
	Evictions int
	// Replacement is the median time from a workload pod's deletion to a
	// new pod of the Deployment becoming Ready (paired in order).
	Replacement time.Duration
	// PerNode are the victims' times, sorted.
	PerNode []time.Duration
	// Exhausted is how much of Time the PDB allowed no disruption: the
	// drainer could only wait for replacements to become Ready.
	Exhausted time.Duration
	// Apiserver is what the apiserver served of evictions and budget
	// status writes during the run.
	Apiserver evictionStats
}

// drainResults is the whole drain race.
type drainResults struct {
	Command        string
	Date           time.Time
	Nodes, Pods    int
	PDB            string
	KubectlVersion string
	Runs           []drainRun
	OperatorErrors int
}

// drainRace drains three identical fresh node sets in one cluster: by
// gpuhealth with the sample policy's eviction limits, by gpuhealth with
// raised limits, and by kubectl drain -l. Each set is -drain-nodes victims
// running -drain-pods pods each of one Deployment with a PDB of
// maxUnavailable 10%, and as many spare nodes for the replacements.
func (h *harness) drainRace(ctx context.Context, cancel context.CancelCauseFunc, cleanup func(func())) (*drainResults, error) {
	o := h.o
	res := &drainResults{Nodes: o.drainNodes, Pods: o.drainPods, PDB: "10%"}
	kubectl := filepath.Join(o.controlPlane, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		kubectl = "kubectl"
	}
	if out, err := runOut(ctx, kubectl, "version", "--client"); err == nil {
		res.KubectlVersion = firstLine(string(out))
	}
	pods := h.podWatch()
	if err := h.createPolicy(ctx, policyName, drainPolicy(20, 16)); err != nil {
		return nil, err
	}
	op, err := h.startOperator(ctx, cancel)
	if err != nil {
		return nil, err
	}
	cleanup(op.stop)
	if err := op.waitReady(ctx, o.timeout); err != nil {
		return nil, err
	}
	for _, run := range []drainRun{
		{Name: "gpuhealth, the sample policy's limits", EvictionsPerSecond: 20, MaxConcurrent: 16},
		{Name: "gpuhealth, limits raised", EvictionsPerSecond: 200, MaxConcurrent: 64},
		{Name: "kubectl drain -l"},
	} {
		set := fmt.Sprintf("drain%d", len(res.Runs))
		gpuhealth := run.EvictionsPerSecond > 0
		if gpuhealth {
			if err := h.patchDrainLimits(ctx, run.EvictionsPerSecond, run.MaxConcurrent); err != nil {
				return nil, err
			}
		}
		victims, err := h.drainSet(ctx, set, gpuhealth, o.drainNodes, o.drainPods)
		if err != nil {
			return nil, err
		}
		if gpuhealth {
			if err := h.waitPhase(ctx, victims, phaseHealthy); err != nil {
				return nil, err
			}
		}
		logf("drain race: %s on %d nodes × %d pods", run.Name, len(victims), o.drainPods)
		served, err := h.apiserverEvictions(ctx)
		if err != nil {
			return nil, err
		}
		pods.arm(victims, set)
		start := time.Now()
		var exited chan error
		if gpuhealth {
			if _, _, err := h.createEvents(ctx, victims); err != nil {
				return nil, err
			}
		} else {
			exited = make(chan error, 1)
			go func() {
				out, err := runOut(ctx, kubectl, "--kubeconfig", h.c.Kubeconfig, "drain", "-l", victimLabel+"="+set,
					"--ignore-daemonsets", "--delete-emptydir-data", "--timeout", o.timeout.String())
				if err != nil {
					err = fmt.Errorf("kubectl drain: %w\n%s", err, framework.Tail(out, 2000))
				}
				run.Exited = time.Since(start)
				exited <- err
			}()
		}
		if err := h.waitEmptied(ctx, run.Name, len(victims)); err != nil {
			return nil, err
		}
		if exited != nil {
			if err := <-exited; err != nil {
				return nil, err
			}
		}
		run.PerNode, run.Evictions, run.Replacement = pods.result(start)
		run.Time = run.PerNode[len(run.PerNode)-1]
		run.Exhausted = pods.exhausted(start, start.Add(run.Time))
		after, err := h.apiserverEvictions(ctx)
		if err != nil {
			return nil, err
		}
		run.Apiserver = after.minus(served)
		logf("drain race: %s: the apiserver served %.0f evictions (p50 ≤ %s, p90 ≤ %s) and %.0f budget status writes, %.0f of them conflicts", run.Name,
			run.Apiserver.evictions(), seconds(run.Apiserver.quantile(0.5)), seconds(run.Apiserver.quantile(0.9)), run.Apiserver.statusWrites, run.Apiserver.conflicts)
		logf("drain race: %s: the PDB's status changed %d times; it allowed no disruption for %s", run.Name, pods.budgetChanges(), dur(run.Exhausted))
		logf("drain race: %s: %d evictions, last victim empty after %s (median replacement %s)", run.Name, run.Evictions, dur(run.Time), dur(run.Replacement))
		res.Runs = append(res.Runs, run)
	}
	op.stop()
	res.OperatorErrors, _, _ = op.logErrors()
	return res, nil
}

// drainPolicy manages the GPU-labelled nodes with every node allowed to
// drain at once, the breaker off and the given eviction limits.
func drainPolicy(perSecond, concurrent int) map[string]any {
	return map[string]any{
		"nodeSelector":   map[string]any{"matchLabels": map[string]any{gpuLabel: "true"}},
		"budgets":        map[string]any{"maxUnavailable": "100%"},
		"circuitBreaker": map[string]any{"enabled": false},
		"drain":          map[string]any{"evictionsPerSecond": int64(perSecond), "maxConcurrentEvictions": int64(concurrent)},
	}
}

// patchDrainLimits sets the bench policy's eviction limits.
func (h *harness) patchDrainLimits(ctx context.Context, perSecond, concurrent int) error {
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	p.Name = policyName
	patch := fmt.Sprintf(`{"spec":{"drain":{"evictionsPerSecond":%d,"maxConcurrentEvictions":%d}}}`, perSecond, concurrent)
	if err := h.crc.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("setting the drain limits: %w", err)
	}
	return nil
}

// drainSet creates the nodes of one set to drain: count victims, labelled
// victimLabel=set (and GPU-labelled when gpu, so that the bench policy
// manages them), filled with pods each of one Deployment under a PDB of
// maxUnavailable 10%, then as many spares for the replacements.
func (h *harness) drainSet(ctx context.Context, set string, gpu bool, count, pods int) ([]string, error) {
	victims, err := h.createNodes(ctx, nodeSet{name: set, gpu: gpu, pods: pods, labels: map[string]string{victimLabel: set}}, count)
	if err != nil {
		return nil, err
	}
	if err := h.createWorkload(ctx, workload{name: set, set: set, replicas: count * pods, pdbMaxUnavailable: "10%"}); err != nil {
		return nil, err
	}
	if _, err := h.createNodes(ctx, nodeSet{name: set + "-spare", pods: pods, labels: map[string]string{setLabel: set}}, count); err != nil {
		return nil, err
	}
	return victims, nil
}

// waitEmptied waits until the pod watch has seen n armed victims without
// workload pods.
func (h *harness) waitEmptied(ctx context.Context, what string, n int) error {
	pods := h.podWatch()
	return h.wait(ctx, what+": victims emptied", pods.changed, func() (bool, string) {
		emptied := pods.emptied()
		return emptied == n, fmt.Sprintf("%d/%d victims without workload pods", emptied, n)
	})
}

// podWatch follows the workload pods of the drain race.
type podWatch struct {
	notifier
	mu sync.Mutex
	// onNode counts each node's workload pods (terminating ones included).
	onNode map[string]map[types.UID]bool
	// armed maps a race's victims to when each was first seen empty.
	armed map[string]time.Time
	app   string
	// deleted and ready are when the race's pods went and when new pods of
	// its Deployment became Ready.
	deleted, ready []time.Time
	readySeen      map[types.UID]bool
	leaving        map[types.UID]bool
	// running holds every pod seen Running, whatever its node or app.
	running map[types.UID]bool
	start   time.Time
	// budget is the race's PDB's disruptionsAllowed over time, from start.
	budget []budgetSample
}

// budgetSample is the disruptions a PDB allowed from a moment on.
type budgetSample struct {
	at      time.Time
	allowed int32
}

func startPodWatch(cs kubernetes.Interface, stop <-chan struct{}) *podWatch {
	w := newPodWatch()
	inf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(workloadNamespace)).Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.update,
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				w.set(p, false)
			}
		},
	})
	go inf.Run(stop)
	pdbs := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(workloadNamespace)).Policy().V1().PodDisruptionBudgets().Informer()
	_, _ = pdbs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.budgetChanged,
		UpdateFunc: func(_, obj any) { w.budgetChanged(obj) },
	})
	go pdbs.Run(stop)
	return w
}

// runningCount is how many pods are Running now.
func (w *podWatch) runningCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

// budgetChanged records the race's PDB's disruptionsAllowed.
func (w *podWatch) budgetChanged(obj any) {
	pdb, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.app != "" && pdb.Name == w.app {
		w.budget = append(w.budget, budgetSample{at: now, allowed: pdb.Status.DisruptionsAllowed})
	}
}

// exhausted is how long, from start until end, the race's PDB allowed no
// disruption: time a drainer could only wait for replacements.
func (w *podWatch) exhausted(start, end time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var total time.Duration
	allowed, from := int32(1), start // the budget allowed disruptions when the race began
	for _, b := range w.budget {
		if b.at.After(end) {
			break
		}
		if allowed == 0 {
			total += b.at.Sub(later(from, start))
		}
		allowed, from = b.allowed, b.at
	}
	if allowed == 0 {
		total += end.Sub(later(from, start))
	}
	return total
}

// budgetChanges is how many PDB status changes the race saw.
func (w *podWatch) budgetChanges() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.budget)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func newPodWatch() *podWatch {
	return &podWatch{onNode: map[string]map[types.UID]bool{}, readySeen: map[types.UID]bool{}, leaving: map[types.UID]bool{}, running: map[types.UID]bool{}}
}

func (w *podWatch) update(obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		w.set(p, true)
	}
}

// set records pod p as present (or gone) on its node, and the race's
// deletions and new Ready pods.
func (w *podWatch) set(p *corev1.Pod, present bool) {
	now := time.Now()
	w.mu.Lock()
	if present && p.Status.Phase == corev1.PodRunning {
		w.running[p.UID] = true
	} else {
		delete(w.running, p.UID)
	}
	node := p.Spec.NodeName
	if node != "" {
		pods := w.onNode[node]
		if pods == nil {
			pods = map[types.UID]bool{}
			w.onNode[node] = pods
		}
		if present {
			pods[p.UID] = true
		} else {
			delete(pods, p.UID)
		}
		// A pod leaves when it starts terminating (an eviction) or, if
		// it never showed that, when it is gone.
		if (!present || p.DeletionTimestamp != nil) && w.app != "" && p.Labels["app"] == w.app && !w.leaving[p.UID] {
			w.leaving[p.UID] = true
			w.deleted = append(w.deleted, now)
		}
		if seen, armed := w.armed[node]; armed && seen.IsZero() && len(pods) == 0 {
			w.armed[node] = now
		}
	}
	if present && w.app != "" && p.Labels["app"] == w.app && !w.readySeen[p.UID] && p.CreationTimestamp.After(w.start.Add(-time.Second)) && readiness.Pod(p) {
		w.readySeen[p.UID] = true
		w.ready = append(w.ready, now)
	}
	w.mu.Unlock()
	w.fire()
}

// arm starts a race on victims, whose pods belong to the Deployment app.
func (w *podWatch) arm(victims []string, app string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = make(map[string]time.Time, len(victims))
	for _, v := range victims {
		w.armed[v] = time.Time{}
	}
	w.app, w.deleted, w.ready, w.start, w.budget = app, nil, nil, time.Now(), nil
	w.leaving = map[types.UID]bool{}
}

// emptied says how many victims have been seen without workload pods.
func (w *podWatch) emptied() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, t := range w.armed {
		if !t.IsZero() {
			n++
		}
	}
	return n
}

// emptiedAt returns when each of names was first seen without workload
// pods since it was armed (zero where not yet, or not armed).
func (w *podWatch) emptiedAt(names []string) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return timesOf(w.armed, names)
}

// result returns each victim's time from start until it was empty
// (sorted), the pods deleted, and the median deletion-to-replacement-Ready
// time, pairing the i-th deletion with the i-th new Ready pod.
func (w *podWatch) result(start time.Time) (perNode []time.Duration, evictions int, replacement time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.armed {
		perNode = append(perNode, t.Sub(start))
	}
	sort.Slice(perNode, func(i, j int) bool { return perNode[i] < perNode[j] })
	var lat []time.Duration
	for i := 0; i < len(w.deleted) && i < len(w.ready); i++ {
		lat = append(lat, w.ready[i].Sub(w.deleted[i]))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return perNode, len(w.deleted), percentile(lat, 0.5)
}

// markdown renders the drain race for docs/performance.md.
func (r *drainResults) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	replicas := r.Nodes * r.Pods
	allowed := max(replicas/10, 1) // the PDB's maxUnavailable 10%
	p("### Drain race: gpuhealth against kubectl drain -l")
	p("")
	p("| Run | |")
	p("|---|---|")
	p("| Date | %s |", r.Date.UTC().Format("2006-01-02 15:04 MST"))
	p("| Command | `%s` |", r.Command)
	p("| Each set | %d victims × %d pods of one Deployment (%d replicas), PDB maxUnavailable %s (%d at a time), %d spare nodes for the replacements; fresh nodes per drainer |", r.Nodes, r.Pods, replicas, r.PDB, allowed, r.Nodes)
	p("| kubectl | %s |", orNA(r.KubectlVersion))
	p("| Operator log | %d error lines |", r.OperatorErrors)
	p("")
	p("| Drainer | evictions/s · concurrent | first finding (or command) → last victim without workload pods | victims' p50 | pods evicted | eviction → replacement Ready (median) | rate floor | PDB bound (≈ %d rounds × replacement) | time / max(floors) | PDB allowing none | kubectl / this |", (replicas+allowed-1)/allowed)
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var kubectl time.Duration
	for _, run := range r.Runs {
		if run.EvictionsPerSecond == 0 {
			kubectl = run.Time
		}
	}
	for _, run := range r.Runs {
		limits, rateFloor := "kubectl's own (one node at a time, 5 s between refused evictions)", time.Duration(0)
		if run.EvictionsPerSecond > 0 {
			limits = fmt.Sprintf("%d · %d", run.EvictionsPerSecond, run.MaxConcurrent)
			rateFloor = time.Duration(float64(max(run.Evictions-1, 0)) / float64(run.EvictionsPerSecond) * float64(time.Second))
		}
		pdbBound := time.Duration((replicas+allowed-1)/allowed) * run.Replacement
		bound := max(rateFloor, pdbBound)
		p("| %s | %s | **%s** | %s | %d | %s | %s | %s | %.2f× | %s (%.0f%%) | %.1f× |", run.Name, limits, dur(run.Time), dur(percentile(run.PerNode, 0.5)), run.Evictions,
			dur(run.Replacement), dur(rateFloor), dur(pdbBound), ratio(run.Time, bound), dur(run.Exhausted), 100*ratio(run.Exhausted, run.Time), ratio(kubectl, run.Time))
	}
	p("")
	p("Each victim's clock stops when it is first seen without a workload pod (a victim that finishes its cycle returns and may take replacements). The rate floor is the evictions less one over the configured rate; the PDB bound is the rounds of %d disruptions the budget allows, each waiting for its replacements to become Ready (the median measured here), an estimate; \"PDB allowing none\" is how long of the drain the budget's status (a watch on it) allowed no disruption, when a drainer can only wait for the disruption controller to count replacements healthy.", allowed)
	p("")
	p("What the apiserver served during each run (its /metrics, read before and after; every client):")
	p("")
	p("| Drainer | eviction requests | answered 201 / 429 | eviction latency p50 · p90 · p99 (bucket bounds) | budget status writes | of them conflicts (409) |")
	p("|---|---:|---:|---:|---:|---:|")
	for _, run := range r.Runs {
		a := run.Apiserver
		p("| %s | %.0f | %.0f / %.0f | ≤ %s · ≤ %s · ≤ %s | %.0f | %.0f |", run.Name, a.evictions(), a.codes["201"], a.codes["429"],
			seconds(a.quantile(0.5)), seconds(a.quantile(0.9)), seconds(a.quantile(0.99)), a.statusWrites, a.conflicts)
	}
	p("")
	p("An eviction writes the budget's status at the resourceVersion it read; on a conflict (another eviction's write, or the disruption controller's) the apiserver waits 500 ms (±10%%) before it reads the budget again, up to 20 times.")
	return b.String()
}

// seconds renders a bucket bound in seconds ("+Inf" past the last one).
func seconds(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return dur(time.Duration(v * float64(time.Second)))
}
