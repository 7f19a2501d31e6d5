package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealths,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealths/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

const (
	// FieldManager is the operator's name as a field manager (the
	// composition root sets it on the manager's client) and an Event
	// reporter.
	FieldManager = "gpuhealth-operator"

	// budgetRecheck is a safety net for nodes waiting for a budget: they are
	// woken when a node leaves Draining or Recertifying (budgetFreed), so
	// this only covers a missed wake-up. It is long because at 1,000 waiting
	// nodes a short recheck is a constant load on the operator.
	budgetRecheck = 5 * time.Minute
	// drainRecheck is how often a draining node looks again while pods remain;
	// pod deletions enqueue it sooner, and so does a PodDisruptionBudget that
	// allows more disruptions while the node has pods it blocked.
	drainRecheck = 5 * time.Second
	// drainDeferredRecheck is the wait instead when a pass left pods for
	// lack of an eviction token or slot, which other nodes' passes free
	// within a second at the configured rate.
	drainDeferredRecheck = 500 * time.Millisecond
	// jobRecheck bounds the wait for a Job; Job updates enqueue the node sooner.
	jobRecheck = time.Minute
	// fencedPriority is the workqueue priority of the bookkeeping pass after
	// a fence: below fresh work (0), so a storm's fences go first, and below
	// the initial list after a start (handler.LowPriority), so a restarted
	// operator fences every node with a waiting finding before it writes any
	// of them up.
	fencedPriority = handler.LowPriority - 10
	// normalPriority is that of every other requeue, as of fresh work.
	normalPriority = 0
	// conflictRetry is the wait after an optimistic-lock conflict.
	conflictRetry = time.Second
	// budgetLockRetry is the wait of a pass that found another node's
	// budget decision under way (it takes about one count and one write).
	budgetLockRetry = 25 * time.Millisecond
	// cacheRetry is the wait for the cache to show this process's own
	// write; the write's watch event usually wakes the node sooner.
	cacheRetry = 100 * time.Millisecond
)

// Reconciler drives one node, keyed by the node's name, through the state
// machine in four steps: observe reads the world into an observation,
// decide (a pure function) makes a plan, apply carries out the plan's acts
// through the remediation packages, and record writes the NodeHealth status
// once, then publishes the plan's Events and counts its metrics.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the apiserver.
	Client client.Client
	// APIReader reads straight from the apiserver; budgets count with it so
	// that two nodes never both take the last slot from a stale cache.
	APIReader client.Reader
	// Clock is the time source; tests step a fake one.
	Clock clock.PassiveClock
	// Recorder publishes Kubernetes Events.
	Recorder events.EventRecorder
	// Drainer evicts pods; one per process so rate limits are shared.
	Drainer *drain.Drainer
	// Breaker is the quarantine circuit breaker; one per process.
	Breaker *breaker.Breaker
	// Namespace is where recertification and remediation Jobs run.
	Namespace string
	// Outputs reads what suite Jobs printed, for their parsers. Nil: a step
	// whose parser needs output fails for want of it.
	Outputs job.OutputReader
	// ComputeDomains is the read-only ComputeDomain view. Nil: membership
	// comes from node labels and daemon pods only (no clique entries).
	ComputeDomains *computedomain.View
	// MaxConcurrentReconciles is how many nodes reconcile in parallel
	// (evictions for many nodes proceed at once). Zero means 16.
	MaxConcurrentReconciles int

	// StormQuiet, when set, holds the bookkeeping after a fence while other
	// nodes are still being fenced, until none has been for this long (at
	// most StormHoldMax after the node's own fence), so that in a storm the
	// apiserver's writes go to fences first. Zero: bookkeeping follows each
	// fence at once, at a lower workqueue priority.
	StormQuiet time.Duration
	// StormHoldMax bounds that hold per node. Zero means 10 s.
	StormHoldMax time.Duration

	// budgetMu serialises budget decisions within this process (the
	// operator is leader-elected, so this process is the only one deciding).
	budgetMu   sync.Mutex
	recent     *recentList // guarded by budgetMu
	storm      *stormGate
	fleetCache *fleetCache
	expect     *expectations
}

// SetupWithManager registers the watches. The reconciler lists through the
// cache indexes named in gpuhealthv1alpha1, which the composition root
// registers (controllers/index).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Client == nil || r.APIReader == nil || r.Clock == nil || r.Recorder == nil || r.Drainer == nil || r.Breaker == nil || r.Namespace == "" {
		return errors.New("nodehealth.Reconciler needs Client, APIReader, Clock, Recorder, Drainer, Breaker and Namespace")
	}
	r.storm = &stormGate{quiet: r.StormQuiet, maxHold: r.StormHoldMax}
	if r.storm.maxHold <= 0 {
		r.storm.maxHold = 10 * time.Second
	}
	r.fleetCache = &fleetCache{}
	if err := r.fleetCache.watch(ctx, mgr); err != nil {
		return err
	}
	r.expect = newExpectations(r.Clock)
	// The Drainer's pod watches run on the elected leader, which drains.
	if err := mgr.Add(r.Drainer); err != nil {
		return fmt.Errorf("adding the drain's pod watches: %w", err)
	}
	fleet.serve(mgr.GetCache(), mgr.Elected())
	workers := r.MaxConcurrentReconciles
	if workers == 0 {
		workers = 16
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.ComputeDomains != nil {
		// Clique entries and domain status come and go without touching the
		// node; the view names the nodes whose listing changed.
		b = b.WatchesRawSource(source.Channel(r.ComputeDomains.Changes(), handler.EnqueueRequestsFromMapFunc(nodeHealthToNode)))
	}
	return b.
		Named("nodehealth").
		For(&corev1.Node{}, builder.WithPredicates(nodeChanged)).
		Watches(&gpuhealthv1alpha1.NodeHealth{}, handler.EnqueueRequestsFromMapFunc(nodeHealthToNode)).
		WatchesRawSource(source.Kind(mgr.GetCache(), client.Object(&gpuhealthv1alpha1.NodeHealth{}),
			handler.EnqueueRequestsFromMapFunc(r.budgetFreedToWaiting), budgetFreed)).
		Watches(&gpuhealthv1alpha1.NodeHealthEvent{}, handler.EnqueueRequestsFromMapFunc(eventToNode), builder.WithPredicates(eventChanged)).
		// Workload pods are not cached: each draining node's own pod watch
		// wakes it. The cached pods are ComputeDomain daemon pods.
		WatchesRawSource(source.Channel(r.Drainer.Wakeups(), handler.EnqueueRequestsFromMapFunc(nodeHealthToNode))).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToNode), builder.WithPredicates(podLeftOrFinished)).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(jobToNode)).
		Watches(&policyv1.PodDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.budgetToBlockedNodes), builder.WithPredicates(disruptionsFreed)).
		// Only spec changes and annotations (the breaker reset) matter to
		// nodes; the policy's status changes with every count and would
		// otherwise re-enqueue every node on each of its writes.
		Watches(&gpuhealthv1alpha1.RemediationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.policyToNodes),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// nodeChanged lets through the node changes that matter: labels (policy
// selection), annotations (what we applied), cordon, taints, readiness and
// the boot ID (a reboot step waits for it). Heartbeats, which kubelets send
// every few seconds, do not.
//
// The update that a fence itself causes (our applied annotation appearing)
// is skipped: the pass that fenced already requeued the node at a lower
// priority, and reacting at normal priority would let bookkeeping compete
// with other nodes' fences in a storm.
var nodeChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		if _, had := o.Annotations[nodepkg.AppliedAnnotation]; !had {
			if _, has := n.Annotations[nodepkg.AppliedAnnotation]; has {
				return false
			}
		}
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
			o.Spec.Unschedulable != n.Spec.Unschedulable ||
			!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
			readyStatus(o) != readyStatus(n) ||
			o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID
	},
}

// readyStatus is the node's Ready condition status; a dead ComputeDomain
// member is released some time after it turns False or Unknown.
func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// eventChanged lets through what a producer changes on a finding (a new
// finding, a repeat, a resolution, a deletion), not the judgement the
// operator itself records in its status.
var eventChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*gpuhealthv1alpha1.NodeHealthEvent), e.ObjectNew.(*gpuhealthv1alpha1.NodeHealthEvent)
		return o.Generation != n.Generation || o.Status.Count != n.Status.Count ||
			!equality.Semantic.DeepEqual(o.Status.LastSeen, n.Status.LastSeen) ||
			o.Status.Resolved != n.Status.Resolved ||
			!equality.Semantic.DeepEqual(o.Status.ResolvedAt, n.Status.ResolvedAt)
	},
}

// budgetFreed lets through a NodeHealth leaving the phases that use a
// budget (Draining, Recertifying), which is when waiting nodes may go.
var budgetFreed = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return usesBudget(e.ObjectOld.(*gpuhealthv1alpha1.NodeHealth)) && !usesBudget(e.ObjectNew.(*gpuhealthv1alpha1.NodeHealth))
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		nh, ok := e.Object.(*gpuhealthv1alpha1.NodeHealth)
		return ok && usesBudget(nh)
	},
}

func usesBudget(nh *gpuhealthv1alpha1.NodeHealth) bool {
	// Certifying counts where a policy says so; waking the waiting nodes
	// when one leaves costs little either way.
	return nh.Status.Phase.UsesBudget() || nh.Status.Phase == gpuhealthv1alpha1.PhaseCertifying
}

// budgetFreedToWaiting wakes the nodes waiting for a budget.
func (r *Reconciler) budgetFreedToWaiting(ctx context.Context, _ client.Object) []ctrl.Request {
	// The woken nodes must count without the node that left, even if the
	// fleet cache's own handler has not run yet.
	r.fleetCache.changed()
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodehealths to wake nodes waiting for a budget")
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		if st := list.Items[i].Status; st.Phase == gpuhealthv1alpha1.PhaseQuarantined && st.Reason == gpuhealthv1alpha1.ReasonWaitingForBudget {
			out = append(out, request(list.Items[i].Name)...)
		}
	}
	return out
}

// disruptionsFreed lets through the PodDisruptionBudget changes that can
// let a refused eviction through: more disruptions allowed than before (the
// disruption controller saw replacements become healthy), or the budget
// deleted.
var disruptionsFreed = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*policyv1.PodDisruptionBudget), e.ObjectNew.(*policyv1.PodDisruptionBudget)
		return n.Status.DisruptionsAllowed > 0 && n.Status.DisruptionsAllowed > o.Status.DisruptionsAllowed
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// budgetToBlockedNodes wakes the draining nodes that have pods blocked in
// the budget's namespace (or more blocked pods than their status lists),
// so a drain goes on as soon as the budget allows, not at the next recheck.
func (r *Reconciler) budgetToBlockedNodes(ctx context.Context, o client.Object) []ctrl.Request {
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodehealths to wake drains blocked by a PodDisruptionBudget")
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		if blockedIn(list.Items[i].Status, o.GetNamespace()) {
			out = append(out, request(list.Items[i].Name)...)
		}
	}
	return out
}

// blockedIn says whether a node in status is draining with pods blocked
// in namespace, as far as its status tells.
func blockedIn(st gpuhealthv1alpha1.NodeHealthStatus, namespace string) bool {
	if st.Phase != gpuhealthv1alpha1.PhaseDraining || st.Drain == nil || st.Drain.PodsBlocked == 0 {
		return false
	}
	if int(st.Drain.PodsBlocked) > len(st.Drain.Blocked) {
		return true // the list is cut short: any namespace may be among the rest
	}
	for _, b := range st.Drain.Blocked {
		if b.Namespace == namespace {
			return true
		}
	}
	return false
}

// podLeftOrFinished lets through the pod changes a drain waits for.
var podLeftOrFinished = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
		return o.Status.Phase != n.Status.Phase || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
	DeleteFunc: func(event.DeleteEvent) bool { return true },
}

func request(node string) []ctrl.Request {
	if node == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: node}}}
}

func nodeHealthToNode(_ context.Context, o client.Object) []ctrl.Request { return request(o.GetName()) }

func eventToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName)
}

func podToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.(*corev1.Pod).Spec.NodeName)
}

func jobToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.GetLabels()[job.NodeLabel])
}

func (r *Reconciler) policyToNodes(ctx context.Context, _ client.Object) []ctrl.Request {
	list := &corev1.NodeList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodes for a policy change")
		return nil
	}
	out := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, request(list.Items[i].Name)...)
	}
	return out
}

// Reconcile moves one node forward as far as it can go now: observe,
// decide, apply, record.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("Node", klog.KRef("", req.Name))
	ctx = log.IntoContext(ctx, logger)

	o, err := r.observe(ctx, req.Name)
	var behind *errCacheBehind
	if errors.As(err, &behind) {
		logger.V(1).Info("Waiting for the cache to show this operator's write", "err", err)
		return ctrl.Result{RequeueAfter: cacheRetry, Priority: ptr.To(normalPriority)}, nil
	}
	if err != nil || o == nil {
		return ctrl.Result{}, err
	}
	p := decide(o)
	reserved := false
	if p.reserveBreaker {
		// Counted now, taken back below when the quarantine does not
		// become real; a refusal (another node took the last slot since
		// the peek) is decided anew.
		view := r.reserveBreaker(o.policy, o.breaker, o.now.Time)
		reserved = view.allowed && view.enabled
		o.breaker = view
		if !view.allowed {
			p = decide(o)
		}
	}
	undo := func() {
		if reserved {
			r.undoBreaker(o.policy, o.now.Time)
			reserved = false
		}
	}
	locked := false
	if p.confirmBudget {
		// A drain decided from the cache's count is counted again from the
		// apiserver, and written, inside one lock, so two nodes never take
		// the last slot together. A pass that finds the lock taken hands
		// its worker back and comes again shortly, so that twenty nodes
		// admitted one after another do not hold every worker while other
		// nodes' drains wait for one.
		if !r.budgetMu.TryLock() {
			undo()
			return ctrl.Result{RequeueAfter: budgetLockRetry, Priority: ptr.To(normalPriority)}, nil
		}
		defer r.budgetMu.Unlock()
		locked = true
		o.budgets = r.countBudgets(ctx, o, true)
		if o.budgets.fromRecentList && (o.budgets.err != nil || len(o.budgets.blocked) > 0) {
			// A refusal is decided on a fresh list only.
			r.recent = nil
			o.budgets = r.countBudgets(ctx, o, true)
		}
		p = decide(o)
	}
	if p.terminal {
		undo()
		return ctrl.Result{}, reconcile.TerminalError(p.err)
	}
	fenced, err := r.apply(ctx, o, p)
	if err != nil {
		if !fenced {
			undo()
		}
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry, Priority: ptr.To(normalPriority)}, nil
		}
		return ctrl.Result{}, err
	}
	if p.fenceOnly {
		return result(p), nil
	}
	written, err := r.record(ctx, o, p)
	if written && locked {
		r.wroteUnderBudgetLock(o.nh.Name, p.status.Phase)
	}
	if !written && !fenced {
		undo()
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if !written {
		// Our cache was behind the object; the acts are idempotent, so
		// decide again from the fresh copy.
		return ctrl.Result{RequeueAfter: conflictRetry, Priority: ptr.To(normalPriority)}, nil
	}
	if err := r.applyAfterWrite(ctx, o, p); err != nil {
		if apierrors.IsConflict(err) {
			// The node changed under us (a kubelet's status, say): the
			// return to service is repeated from the fresh copy.
			return ctrl.Result{RequeueAfter: conflictRetry, Priority: ptr.To(normalPriority)}, nil
		}
		return ctrl.Result{}, err
	}
	if p.err != nil {
		return ctrl.Result{}, p.err
	}
	return result(p), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// describe summarises findings for a message.
func describe(js []judgement) string {
	var parts []string
	for i, j := range js {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(js)-3))
			break
		}
		sp := j.event.Spec
		p := fmt.Sprintf("%s %s on %s (%s, %s)", sp.Check, sp.Code, componentName(sp.Component), sp.Source, j.action)
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

func componentName(c gpuhealthv1alpha1.Component) string {
	if c.ID == "" {
		return string(c.Kind)
	}
	return c.ID
}
