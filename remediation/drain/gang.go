package drain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

// gpuResource is the extended resource NVIDIA's device plugin advertises;
// a member's GPUs are what its containers ask of it.
const gpuResource corev1.ResourceName = "nvidia.com/gpu"

// maxWaveNodes is how many nodes a Wave names: the MaxItems of
// GangWave.nodes.
const maxWaveNodes = 16

// Wave is one gang a pass stops whole (policy drain.gangs Gang): a member
// runs on the node being drained, so every member, on every node, is
// evicted in one wave.
type Wave struct {
	Key   gang.Key
	Owner gang.Owner
	// Members is how many pods the wave counts: the gang's unfinished pods
	// created before the drain began (replacements its controller makes
	// after the wave are never part of it), and its pods on the node.
	Members int
	// Nodes are the nodes the members run on, sorted; SpannedNodes counts
	// them, Nodes names the first 16.
	Nodes        []string
	SpannedNodes int
	// Evicted is how many members' evictions the apiserver accepted in
	// this pass, on every node; Leaving how many were already terminating.
	Evicted, Leaving int
	// Pending is how many members on other nodes are left to evict after
	// this pass (the wave goes on in the next, and the drain waits for
	// them). Late is how many are left past the drain timeout: their
	// evictions are still tried while the node drains, but it no longer
	// waits for them (they are reported timed out).
	Pending, Late int
	// PeerGPUs are the GPUs (nvidia.com/gpu) the members on other nodes
	// that this pass evicted held: the GPUs a pod-by-pod drain would have
	// left stranded, waiting for the lost rank.
	PeerGPUs int
	// expired is set when the drain's timeout for the gang's namespace
	// has passed.
	expired bool
	// Held says why the wave was not sent: a member's PodDisruptionBudget
	// allowed no disruption. The whole gang stays until it does, or until
	// the drain timeout.
	Held string
}

// Sent reports whether this pass evicted any member.
func (w Wave) Sent() bool { return w.Evicted > 0 }

// openWaves remembers the gangs whose wave has begun and is not sent
// whole, per drain (a node's, or one GPU's: told apart by the drain's
// start), so a wave goes on (a member on another node whose eviction was
// refused or deferred) after the drain's own members have left, under the
// decision it began with, and is never held again once begun. It is only
// memory: an operator restarted mid-wave finishes the waves whose members
// are still on the node, and leaves the others to the gang's controller.
// A drain whose passes stop (its node released, say) is forgotten after
// openWaveIdle.
type openWaves struct {
	mu     sync.Mutex
	drains map[drainID]map[gang.Key]*openWave
}

// drainID is one drain: its node and when it began.
type drainID struct {
	node    string
	started time.Time
}

// openWave is a wave begun: the drain decision of its namespace when it
// began, and the last pass that saw it.
type openWave struct {
	dec  decision
	seen time.Time
}

// openWaveIdle is how long a wave no pass has seen is kept: a drain
// passes at least every drainRecheck (seconds), so only drains that
// ended get this old.
const openWaveIdle = time.Hour

func newOpenWaves() *openWaves {
	return &openWaves{drains: map[drainID]map[gang.Key]*openWave{}}
}

// of returns the drain's open waves, and forgets those of any drain no
// pass has seen for openWaveIdle.
func (o *openWaves) of(id drainID, now time.Time) map[gang.Key]decision {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[gang.Key]decision{}
	for d, waves := range o.drains {
		for k, w := range waves {
			if now.Sub(w.seen) > openWaveIdle {
				delete(waves, k)
				continue
			}
			if d == id {
				out[k] = w.dec
			}
		}
		if len(waves) == 0 {
			delete(o.drains, d)
		}
	}
	return out
}

// set opens (or keeps open) the drain's wave of k under dec, or closes it.
func (o *openWaves) set(id drainID, k gang.Key, dec decision, open bool, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !open {
		delete(o.drains[id], k)
		if len(o.drains[id]) == 0 {
			delete(o.drains, id)
		}
		return
	}
	if o.drains[id] == nil {
		o.drains[id] = map[gang.Key]*openWave{}
	}
	if w, ok := o.drains[id][k]; ok {
		w.seen = now
		return
	}
	o.drains[id][k] = &openWave{dec: dec, seen: now}
}

// waveInput is a gang with members on the node, found in a pass.
type waveInput struct {
	key gang.Key
	// dec is the drain decision of the gang's namespace (mode, timeout).
	dec decision
	// open is set for a wave begun in an earlier pass: it is never held.
	open bool
}

// compareKeys orders gangs by namespace, kind, name and part.
func compareKeys(a, b gang.Key) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Part, b.Part))
}

// members lists the gang's pods that a wave stops: in its namespace,
// marked as its members, unfinished, not DaemonSet, mirror or gpuhealth Job
// pods, and either on node or not made after startedAt (madeAfter). The list is the apiserver's, never a cache's.
func (d *Drainer) members(ctx context.Context, finder gang.Finder, k gang.Key, node string, spec gpuhealthv1alpha1.DrainSpec, startedAt time.Time) ([]*corev1.Pod, error) {
	list := &corev1.PodList{}
	if err := d.pods.List(ctx, list, client.InNamespace(k.Namespace), client.MatchingLabelsSelector{Selector: finder.Candidates(k)}); err != nil {
		return nil, fmt.Errorf("listing the members of %s: %w", k, err)
	}
	chain := []podFilter{skipDaemonSetPods, skipOwnJobPods(d.jobNamespace), skipMirrorPods, skipFinishedPods}
	var out []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if got, ok := finder.Of(p); !ok || got != k || leftToKueue(spec, p) {
			continue
		}
		if dec, err := decide(ctx, chain, p); err != nil || dec.verdict == skip {
			continue
		}
		if p.Spec.NodeName != node && madeAfter(p, startedAt) {
			continue // made after the drain began: a replacement, not a rank of this gang
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePods)
	return out, nil
}

// madeAfter reports whether pod was created in a later second than
// startedAt (a zero startedAt: never). The apiserver keeps creation times
// to the second, as the NodeHealth keeps the drain's start, so a rank
// created in the second the drain began is taken as one of the gang's, not
// as a replacement: a replacement comes after the wave, which is at least
// one pass and, in a real cluster, a pod's termination later.
func madeAfter(pod *corev1.Pod, startedAt time.Time) bool {
	return !startedAt.IsZero() && pod.CreationTimestamp.Time.Truncate(time.Second).After(startedAt.Truncate(time.Second))
}

// planWave lists the gang's members and returns the wave's tasks (the
// node's members with their drain mode and timeout, the others as plain
// evictions), the outcome of each that is decided before any request, and
// the admissions counted against budgets. A wave is held, and nothing of
// it sent, while a member's budget (as the cache shows it) allows no
// disruption and the node's drain timeout has not passed: the node's
// members are then reported blocked, naming the member that holds them.
func (d *Drainer) planWave(ctx context.Context, in waveInput, finder gang.Finder, node string, spec gpuhealthv1alpha1.DrainSpec,
	startedAt, now time.Time, budgets *budgetCache) (Wave, []task, []*outcome, []*admission, error) {
	w := Wave{Key: in.key}
	members, err := d.members(ctx, finder, in.key, node, spec, startedAt)
	if err != nil {
		return w, nil, nil, nil, err
	}
	w.Members = len(members)
	nodes := map[string]bool{}
	expired := in.dec.expired(startedAt, now)
	w.expired = expired
	deleteOnTimeout := spec.OnTimeout == gpuhealthv1alpha1.DrainTimeoutDelete
	grace := spec.GangGracePeriod.Get(0)
	var tasks []task
	for _, p := range members {
		if p.Spec.NodeName != "" {
			nodes[p.Spec.NodeName] = true
		}
		if w.Owner == (gang.Owner{}) {
			w.Owner = finder.OwnerOf(in.key, p)
		}
		if p.DeletionTimestamp != nil {
			w.Leaving++
			continue
		}
		t := task{pod: p, wave: true, peer: p.Spec.NodeName != node, timeout: in.dec.timeout, grace: longerGrace(p, grace)}
		if !t.peer {
			t.expired = expired
			t.delete = expired && (in.dec.verdict == deleteAfterTimeout || deleteOnTimeout)
		}
		tasks = append(tasks, t)
	}
	w.SpannedNodes = len(nodes)
	for n := range nodes {
		w.Nodes = append(w.Nodes, n)
	}
	slices.Sort(w.Nodes)
	w.Nodes = w.Nodes[:min(len(w.Nodes), maxWaveNodes)]

	decided, admitted := budgets.refuse(ctx, d.budgets, tasks)
	holder := slices.IndexFunc(decided, func(o *outcome) bool { return o != nil })
	if holder < 0 || expired || in.open {
		return w, tasks, decided, admitted, nil
	}
	// Held: give every admission back, send nothing, and report the node's
	// members blocked by the member that holds them.
	for _, a := range admitted {
		if a != nil {
			d.budgets.release(*a)
		}
	}
	h := tasks[holder]
	w.Held = gpuhealthv1alpha1.Truncate(fmt.Sprintf("held by member %s/%s on node %s: %s",
		h.pod.Namespace, h.pod.Name, h.pod.Spec.NodeName, decided[holder].message), maxMessageLen)
	var own []task
	var outs []*outcome
	for _, t := range tasks {
		if t.peer {
			continue
		}
		own = append(own, t)
		outs = append(outs, &outcome{kind: outcomeBlocked, pod: t.pod, message: "the gang's wave is " + w.Held})
	}
	return w, own, outs, make([]*admission, len(own)), nil
}

// leftToKueue reports whether pod's gang is Kueue's to stop, not a wave's
// (drain.kueue Kueue).
func leftToKueue(spec gpuhealthv1alpha1.DrainSpec, pod *corev1.Pod) bool {
	return spec.Kueue == gpuhealthv1alpha1.KueueGangsKueue && gang.KueueManaged(pod)
}

// longerGrace is the grace period a wave evicts pod with: grace when it is
// longer than the pod's own terminationGracePeriodSeconds (30 s unset),
// else nil (the pod's own). It never shortens it.
func longerGrace(pod *corev1.Pod, grace time.Duration) *int64 {
	own := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		own = *pod.Spec.TerminationGracePeriodSeconds
	}
	if s := int64(grace / time.Second); s > own {
		return &s
	}
	return nil
}

// podGPUs is what pod's containers ask of nvidia.com/gpu (limits, else
// requests; the larger of its init containers' and the sum of its
// containers', as the scheduler counts).
func podGPUs(pod *corev1.Pod) int {
	of := func(c corev1.Container) int64 {
		q, ok := c.Resources.Limits[gpuResource]
		if !ok {
			q, ok = c.Resources.Requests[gpuResource]
		}
		if !ok {
			return 0
		}
		return q.Value()
	}
	var sum, initMax int64
	for _, c := range pod.Spec.Containers {
		sum += of(c)
	}
	for _, c := range pod.Spec.InitContainers {
		initMax = max(initMax, of(c))
	}
	return int(max(sum, initMax))
}
