package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"maps"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

const (
	// NodeNameField is the field the Drainer lists and watches a node's pods
	// by, a field selector the apiserver serves from its watch cache's index.
	NodeNameField = "spec.nodeName"

	// passTimeout bounds one pass, so a reconciler worker is never held long;
	// the caller requeues and the next pass carries on where this one stopped.
	passTimeout = 5 * time.Second

	// admitTimeout bounds how long a pass waits for eviction tokens and
	// in-flight slots. At the default 20 evictions a second that is up to about
	// 40 evictions per pass (a full bucket plus a second's refill) when no other
	// node competes; a pass that gets no token within a second is sharing the
	// budget with other nodes and hands its worker back instead of queueing
	// behind them. It leaves the rest of passTimeout for the requests themselves.
	admitTimeout = time.Second

	// requestTimeout bounds one eviction or delete request once it is sent.
	requestTimeout = 30 * time.Second

	// defaultEvictionsPerSecond, defaultMaxConcurrentEvictions and
	// defaultTimeout are the schema defaults of DrainSpec, applied here too for
	// a spec that was never defaulted (a zero value in a test or a caller).
	defaultEvictionsPerSecond     = 20
	defaultMaxConcurrentEvictions = 16
	defaultTimeout                = time.Hour

	// maxBlockedPods is how many blocked pods a Result lists: the MaxItems of
	// NodeHealth status.drain.blocked. TimedOutPods lists as many.
	maxBlockedPods = 10
)

// Drainer empties nodes through the Eviction API. It is safe for concurrent
// use by many reconcilers; make one per process, because its eviction rate and
// in-flight limits are shared by every node it drains.
type Drainer struct {
	client client.Client
	// pods lists and watches pods on the apiserver, never from a cache.
	pods  client.WithWatch
	clock clock.PassiveClock
	// jobNamespace is where gpuhealth creates its Jobs: only pods there can
	// be its Job pods (isOwnJobPod).
	jobNamespace string
	// watches wakes the nodes being drained when their pods leave.
	watches *podWatches

	// limiter is the token bucket every eviction and deletion request takes a
	// token from. Its rate is the last spec.evictionsPerSecond seen and its burst
	// one second's worth, so a quiet bucket lets a pass start at once.
	limiter *rate.Limiter
	// inFlight bounds the eviction and deletion requests in flight at once.
	inFlight *gate
	// budgets counts, per PodDisruptionBudget, the evictions admitted
	// since the cache last showed it changed, across every node's pass.
	budgets *ledger
	// pacers spaces the evictions under each PodDisruptionBudget.
	pacers *budgetPacers
	// open are the gang waves begun and not yet sent whole, by node.
	open *openWaves
}

// New returns a Drainer that reads and writes through c, lists and watches
// pods through pods (a client without a cache: the operator caches no
// workload pods) and takes the time from clk. jobNamespace is the namespace
// gpuhealth creates its Jobs in (the operator's): the pods of those Jobs
// stay on a drained node and do not make it busy, and a pod elsewhere is
// never taken for one of them. Until Start runs, no pod watch wakes a
// drained node; its passes still see every pod.
func New(c client.Client, pods client.WithWatch, clk clock.PassiveClock, jobNamespace string) *Drainer {
	return &Drainer{
		client:       c,
		pods:         pods,
		clock:        clk,
		jobNamespace: jobNamespace,
		watches:      newPodWatches(pods, clk),
		limiter:      rate.NewLimiter(defaultEvictionsPerSecond, defaultEvictionsPerSecond),
		inFlight:     newGate(defaultMaxConcurrentEvictions),
		budgets:      newLedger(),
		pacers:       newBudgetPacers(),
		open:         newOpenWaves(),
	}
}

// Start runs the pod watches of the nodes being drained until ctx is done
// (a manager.Runnable: the elected leader's).
func (d *Drainer) Start(ctx context.Context) error { return d.watches.start(ctx) }

// Wakeups carries a Node (only its name set) each time a pod of a node
// being drained leaves, terminates or finishes; the caller requeues it.
func (d *Drainer) Wakeups() <-chan event.GenericEvent { return d.watches.wake }

// Watching reports whether node's pods are being watched: from a pass that
// left some on it until the pass that finds none (or watchIdle after the last).
func (d *Drainer) Watching(node string) bool { return d.watches.watching(node) }

// Result is what one pass found and did. The counts cover the pods that must
// leave the node; DaemonSet pods, mirror pods, finished pods and pods in
// skipped namespaces are not counted anywhere.
type Result struct {
	// Total is the number of pods that must leave, including those already terminating.
	Total int
	// Remaining is how many of those are still on the node, terminating or not,
	// including those evicted in this pass; the drain is done when it is 0.
	Remaining int
	// Evicted is the number of evictions the apiserver accepted in this pass.
	Evicted int
	// Blocked is the number of pods whose eviction was refused with 429 Too Many
	// Requests in this pass, which a PodDisruptionBudget does when it allows no
	// disruption, or not sent because the budget (as the cache shows it) allowed
	// none, or no more than this pass had already evicted.
	Blocked int
	// Deferred is the number of pods left for the next pass without a request:
	// no eviction token, in-flight slot or time came within this pass. Unlike a
	// blocked pod, one can be retried at once.
	Deferred int
	// Waiting is the number of running pods left alone because their namespace
	// is WaitForCompletion, including those past their timeout with onTimeout Wait.
	Waiting int
	// TimedOut is the number of pods that must leave, were not terminating
	// when the pass listed them, are past their drain timeout (the namespace
	// entry's, else spec.timeout), and that this pass neither evicted nor
	// deleted nor found gone: Evict pods whose eviction was refused, failed or
	// left for the next pass, WaitForCompletion pods left running with
	// onTimeout Wait, and pods whose deletion after the timeout failed or was
	// left for the next pass; and members of its gang waves on other
	// nodes left past the timeout (Wave.Late). Pods it counts are counted
	// in Blocked or Waiting too when those apply.
	TimedOut int
	// BlockedPods lists up to 10 of the blocked pods, sorted by namespace and
	// name, with the PodDisruptionBudget that selects each when one does.
	BlockedPods []gpuhealthv1alpha1.BlockedPod
	// TimedOutPods lists up to 10 of the pods TimedOut counts, sorted by
	// namespace and name, each with a message saying why it is still there
	// ("blocked by PodDisruptionBudget web past the 1h0m0s drain timeout") and,
	// for a refused eviction, the PodDisruptionBudget that selects it.
	TimedOutPods []gpuhealthv1alpha1.BlockedPod
	// ForceDeleted lists, sorted, the pods deleted in this pass because their
	// timeout expired (DeleteAfterTimeout, or onTimeout Delete), so the caller
	// can emit an Event for each.
	ForceDeleted []types.NamespacedName
	// Waves are the gangs with members on the node that this pass stops
	// whole (drain.gangs Gang), sorted by namespace, kind and name; their
	// members on the node are counted above as well.
	Waves []Wave
	// WavePending is how many members of those waves on other nodes are
	// left to evict; the drain is not done until it is 0.
	WavePending int
}

// Done reports whether no pod that must leave is left on the node, and
// every gang wave it began is sent whole.
func (r Result) Done() bool {
	return r.Remaining == 0 && r.WavePending == 0
}

// TimedOutMessage describes the timed-out pods in one line for a condition
// or an Event, such as "2 pods still on the node past the drain timeout:
// ns/web-0 blocked by PodDisruptionBudget web past the 1h0m0s drain timeout;
// ns/train still running past the 1h0m0s drain timeout (WaitForCompletion)".
// It names the pods of TimedOutPods and counts the rest; it is "" when
// TimedOut is 0.
func (r Result) TimedOutMessage() string {
	if r.TimedOut == 0 {
		return ""
	}
	var b strings.Builder
	if r.TimedOut == 1 {
		b.WriteString("1 pod still on the node past the drain timeout")
	} else {
		fmt.Fprintf(&b, "%d pods still on the node past the drain timeout", r.TimedOut)
	}
	if len(r.TimedOutPods) == 0 {
		return b.String()
	}
	shown := make([]string, len(r.TimedOutPods))
	for i, p := range r.TimedOutPods {
		shown[i] = fmt.Sprintf("%s/%s %s", p.Namespace, p.Name, p.Message)
	}
	b.WriteString(": ")
	b.WriteString(gpuhealthv1alpha1.JoinMore(shown, r.TimedOut-len(r.TimedOutPods), "; "))
	return b.String()
}

// Drain makes one bounded pass over the pods of node: it evicts what spec
// says to evict, deletes what has outlived its timeout in a DeleteAfterTimeout
// namespace (or in any mode with spec.onTimeout Delete), and reports what is
// left, and what of it is past its timeout. startedAt is when the drain of
// this node began; timeouts count from it, and a zero startedAt never lets one
// expire. A pass takes about five seconds at most; pods it had no time or
// token for are tried by the next pass, so the caller requeues until Done.
//
// Errors from independent pods are joined; the Result still counts what the
// pass did and saw.
func (d *Drainer) Drain(ctx context.Context, node string, spec gpuhealthv1alpha1.DrainSpec, startedAt time.Time) (Result, error) {
	return d.drain(ctx, node, spec, startedAt, nil)
}

// DrainPods is Drain for only the pods of node that only returns true for
// (the pods holding one GPU, when the GPU alone is taken out of service),
// with the same modes, timeouts and PodDisruptionBudgets. Every other pod
// stays, and Result counts only these.
func (d *Drainer) DrainPods(ctx context.Context, node string, spec gpuhealthv1alpha1.DrainSpec, startedAt time.Time, only func(context.Context, *corev1.Pod) (bool, error)) (Result, error) {
	return d.drain(ctx, node, spec, startedAt, func(ctx context.Context, pod *corev1.Pod) (decision, error) {
		if ok, err := only(ctx, pod); err != nil || !ok {
			return decision{verdict: skip}, err
		}
		return decision{}, nil // the drain's own filters and modes decide
	})
}

func (d *Drainer) drain(ctx context.Context, node string, spec gpuhealthv1alpha1.DrainSpec, startedAt time.Time, only podFilter) (Result, error) {
	d.setLimits(spec)
	begin := d.clock.Now()
	passCtx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()

	pods := &corev1.PodList{}
	if err := d.pods.List(passCtx, pods, client.MatchingFields{NodeNameField: node}); err != nil {
		return Result{}, fmt.Errorf("listing pods on node %s: %w", node, err)
	}
	now := d.clock.Now()
	var chain []podFilter
	if only != nil {
		chain = append(chain, only)
	}
	chain = append(chain,
		skipDaemonSetPods,
		skipOwnJobPods(d.jobNamespace),
		skipMirrorPods,
		skipFinishedPods,
		skipNamespaces(spec.SkipNamespaces),
		newModeResolver(d.client, spec).filter,
	)

	deleteOnTimeout := spec.OnTimeout == gpuhealthv1alpha1.DrainTimeoutDelete
	finder := gang.NewFinder(spec.GangLabelKeys)
	var (
		res      Result
		errs     []error
		tasks    []task
		timedOut []timedOutPod
		gangs    = map[gang.Key]decision{}
		own      = map[gang.Key][]*corev1.Pod{}
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		dec, err := decide(passCtx, chain, pod)
		if err != nil {
			// Unsure whether the pod must leave, count it as staying, so the
			// drain is not reported done on a guess.
			errs = append(errs, fmt.Errorf("choosing drain mode for pod %s: %w", client.ObjectKeyFromObject(pod), err))
			res.Total++
			res.Remaining++
			continue
		}
		if dec.verdict == skip {
			continue
		}
		res.Total++
		res.Remaining++
		if pod.DeletionTimestamp != nil {
			// Already leaving: a second eviction would only delete it again.
			continue
		}
		if dec.gangs && !leftToKueue(spec, pod) {
			if k, ok := finder.Of(pod); ok {
				// The gang's wave evicts it, with the rest of its gang.
				res.Total--
				res.Remaining--
				gangs[k] = dec
				own[k] = append(own[k], pod)
				continue
			}
		}
		expired := dec.expired(startedAt, now)
		switch {
		case expired && (dec.verdict == deleteAfterTimeout || deleteOnTimeout):
			tasks = append(tasks, task{pod: pod, delete: true, expired: true, timeout: dec.timeout})
		case dec.verdict == wait:
			res.Waiting++
			if expired {
				timedOut = append(timedOut, timedOutPod{pod: pod, timeout: dec.timeout, message: fmt.Sprintf("still running past the %s drain timeout (WaitForCompletion)", dec.timeout)})
			}
		case dec.verdict == deleteAfterTimeout:
			// Not expired yet: evicted like any other pod until then.
			tasks = append(tasks, task{pod: pod, timeout: dec.timeout})
		default:
			// Evict, also past the timeout with onTimeout Wait: the budget may
			// allow the eviction in a later pass.
			tasks = append(tasks, task{pod: pod, expired: expired, timeout: dec.timeout})
		}
	}

	budgets := d.newBudgetCache()
	decided, admitted := budgets.refuse(passCtx, d.budgets, tasks)
	waveOf := make([]int, len(tasks)) // by task: 1 + its wave's index, 0 for none
	id := drainID{node: node, started: startedAt}
	open := d.open.of(id, now)
	for k, dec := range open {
		// Begun in an earlier pass: it goes on under the decision it began
		// with, also once its members on the node have left.
		gangs[k] = dec
	}
	keys := slices.SortedFunc(maps.Keys(gangs), compareKeys)
	for _, k := range keys {
		_, begun := open[k]
		w, wt, wd, wa, err := d.planWave(passCtx, waveInput{key: k, dec: gangs[k], open: begun}, finder, node, spec, startedAt, now, budgets)
		if err != nil {
			errs = append(errs, err)
			// Unsure who the members are: the node's stay counted, so
			// the drain is not reported done on a guess.
			res.Total += len(own[k])
			res.Remaining += len(own[k])
			continue
		}
		res.Waves = append(res.Waves, w)
		for _, p := range own[k] {
			if slices.ContainsFunc(wt, func(t task) bool { return t.pod.UID == p.UID }) {
				continue
			}
			// The list raced the pod's own change: it leaves as any other
			// pod (or waits with a held wave), so it is never forgotten on
			// the node.
			wt = append(wt, task{pod: p, timeout: gangs[k].timeout})
			var out *outcome
			if w.Held != "" {
				out = &outcome{kind: outcomeBlocked, pod: p, message: "the gang's wave is " + w.Held}
			}
			wd, wa = append(wd, out), append(wa, nil)
		}
		for _, t := range wt {
			if !t.peer {
				res.Total++
				res.Remaining++
			}
			waveOf = append(waveOf, len(res.Waves))
		}
		tasks, decided, admitted = append(tasks, wt...), append(decided, wd...), append(admitted, wa...)
	}
	var blocked []blockedPod
	for i, out := range d.run(passCtx, tasks, decided) {
		if a := admitted[i]; a != nil && out.kind != outcomeEvicted {
			// The budget was not spent: give the admission back.
			d.budgets.release(*a)
		}
		if w := waveOf[i]; w > 0 && tasks[i].peer {
			wave := &res.Waves[w-1]
			switch out.kind {
			case outcomeEvicted:
				wave.Evicted++
				wave.PeerGPUs += podGPUs(out.pod)
			case outcomeGone:
			default:
				if out.kind == outcomeFailed {
					errs = append(errs, out.err)
				}
				if out.kind == outcomeDeferred {
					res.Deferred++
				}
				if wave.expired {
					// Past the drain timeout the node no longer waits for
					// it: its eviction is retried while the node drains,
					// and it is reported.
					wave.Late++
					timedOut = append(timedOut, timedOutPod{pod: out.pod, timeout: tasks[i].timeout,
						message: fmt.Sprintf("member of %s on node %s, still running past the %s drain timeout: %s",
							wave.Key, out.pod.Spec.NodeName, tasks[i].timeout, cmp.Or(out.message, "its eviction did not go through"))})
					continue
				}
				wave.Pending++
			}
			continue
		}
		if w := waveOf[i]; w > 0 && out.kind == outcomeEvicted {
			res.Waves[w-1].Evicted++
		}
		switch out.kind {
		case outcomeEvicted:
			res.Evicted++
		case outcomeDeleted:
			res.ForceDeleted = append(res.ForceDeleted, client.ObjectKeyFromObject(out.pod))
		case outcomeGone:
			res.Remaining--
		case outcomeBlocked:
			res.Blocked++
			blocked = append(blocked, blockedPod{pod: out.pod, message: out.message})
		case outcomeFailed:
			errs = append(errs, out.err)
		case outcomeDeferred:
			// No token, slot or time left in this pass; the next pass retries.
			res.Deferred++
		}
		if t := tasks[i]; t.expired {
			if p, ok := t.timedOut(out); ok {
				timedOut = append(timedOut, p)
			}
		}
	}
	log.FromContext(ctx).V(1).Info("Drain pass", "Node", klog.KRef("", node), "took", d.clock.Since(begin).Round(time.Millisecond),
		"total", res.Total, "remaining", res.Remaining, "evicted", res.Evicted, "blocked", res.Blocked, "deferred", res.Deferred)
	for i := range res.Waves {
		w := &res.Waves[i]
		// Open once sent, while any member on another node is left to
		// evict; a held wave has not begun.
		d.open.set(id, w.Key, gangs[w.Key], w.Held == "" && w.Pending+w.Late > 0, now)
		res.WavePending += w.Pending
	}
	res.TimedOut = len(timedOut)
	res.BlockedPods = describeBlocked(passCtx, budgets, blocked)
	res.TimedOutPods = describeTimedOut(passCtx, budgets, timedOut)
	slices.SortFunc(res.ForceDeleted, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if err := ctx.Err(); err != nil {
		// The caller gave up; work skipped because of it is not a wait.
		errs = append(errs, err)
	}
	if res.Remaining > 0 {
		d.watches.ensure(node, pods.ResourceVersion)
	} else {
		d.watches.stop(node)
	}
	return res, errors.Join(errs...)
}

// setLimits applies the spec's rate and concurrency to the shared limits. With
// several policies the last pass wins; the schema defaults make them agree
// unless someone sets them differently on purpose.
func (d *Drainer) setLimits(spec gpuhealthv1alpha1.DrainSpec) {
	perSecond := int(cmp.Or(spec.EvictionsPerSecond, defaultEvictionsPerSecond))
	if d.limiter.Limit() != rate.Limit(perSecond) || d.limiter.Burst() != perSecond {
		d.limiter.SetLimit(rate.Limit(perSecond))
		d.limiter.SetBurst(perSecond)
	}
	d.inFlight.setLimit(int(cmp.Or(spec.MaxConcurrentEvictions, defaultMaxConcurrentEvictions)))
}

// run carries out tasks concurrently, each after taking a token and a slot,
// and returns their outcomes in the same order; a task with an outcome in
// decided is not sent and gets that one.
func (d *Drainer) run(ctx context.Context, tasks []task, decided []*outcome) []outcome {
	outcomes := make([]outcome, len(tasks))
	if len(tasks) == 0 {
		return outcomes
	}
	admitCtx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i := range tasks {
		if decided[i] != nil {
			outcomes[i] = *decided[i]
			continue
		}
		wg.Go(func() {
			outcomes[i] = d.do(ctx, admitCtx, tasks[i])
		})
	}
	wg.Wait()
	return outcomes
}

// do waits (until admitCtx is done) for its budget's turn, a token and an
// in-flight slot, then sends the task's request within ctx.
func (d *Drainer) do(ctx, admitCtx context.Context, t task) outcome {
	if t.budget != (types.NamespacedName{}) {
		if err := d.pacers.wait(admitCtx, t.budget); err != nil {
			return outcome{kind: outcomeDeferred, pod: t.pod}
		}
	}
	if t.wave {
		// A wave's members all go now: the token is taken, and the next
		// requests of every node wait for the debt, but this one does not.
		d.limiter.Reserve()
	} else if err := d.limiter.Wait(admitCtx); err != nil {
		// Wait fails at once, without taking a token, when the token
		// would come after admitCtx's deadline.
		return outcome{kind: outcomeDeferred, pod: t.pod}
	}
	if err := d.inFlight.acquire(admitCtx); err != nil {
		return outcome{kind: outcomeDeferred, pod: t.pod}
	}
	defer d.inFlight.release()
	// Once sent, a request runs to its end even past the pass deadline: an
	// eviction the client abandons can have decremented the PDB on the
	// apiserver without deleting the pod, and the PDB then refuses every
	// eviction until the disruption controller expires the entry (minutes).
	reqCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	if t.delete {
		return d.deletePod(reqCtx, t.pod)
	}
	return d.evictPod(reqCtx, t.pod, t.grace)
}

// Workloads lists the pods on the node that a drain with spec would remove
// (namespace/name, sorted): running pods that are not DaemonSet, mirror or
// gpuhealth Job pods (isOwnJobPod) and not in spec.skipNamespaces, whatever their drain
// mode. A node with any is in use.
func (d *Drainer) Workloads(ctx context.Context, node string, spec gpuhealthv1alpha1.DrainSpec) ([]string, error) {
	pods := &corev1.PodList{}
	if err := d.pods.List(ctx, pods, client.MatchingFields{NodeNameField: node}); err != nil {
		return nil, fmt.Errorf("listing pods on node %s: %w", node, err)
	}
	chain := []podFilter{skipDaemonSetPods, skipOwnJobPods(d.jobNamespace), skipMirrorPods, skipFinishedPods, skipNamespaces(spec.SkipNamespaces)}
	var out []string
	for i := range pods.Items {
		pod := &pods.Items[i]
		if dec, err := decide(ctx, chain, pod); err == nil && dec.verdict == skip {
			continue
		}
		out = append(out, pod.Namespace+"/"+pod.Name)
	}
	slices.Sort(out)
	return out, nil
}
