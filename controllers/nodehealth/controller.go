package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
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
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
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
	// EventNodeIndex indexes NodeHealthEvents by spec.nodeName.
	EventNodeIndex = "spec.nodeName"
	// PodNodeIndex indexes Pods by spec.nodeName (the drain lists a node's pods through it).
	PodNodeIndex = "spec.nodeName"

	// ManagedCondition says whether gpuhealth manages the node.
	ManagedCondition = "Managed"

	// budgetRecheck is a safety net for nodes waiting for a budget: they are
	// woken when a node leaves Draining or Recertifying (budgetFreed), so
	// this only covers a missed wake-up. It is long because at 1,000 waiting
	// nodes a short recheck is a constant load on the operator.
	budgetRecheck = 5 * time.Minute
	// drainRecheck is how often a draining node looks again while pods remain;
	// pod deletions enqueue it sooner.
	drainRecheck = 5 * time.Second
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
)

// Reconciler drives one node, keyed by the node's name, through the state
// machine. It reads the world into a scope, decides, acts through the
// remediation packages and writes NodeHealth status once.
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
	storm      *stormGate
	fleetCache *fleetCache
}

// SetupWithManager registers the indexes and watches.
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
	if err := mgr.GetFieldIndexer().IndexField(ctx, &gpuhealthv1alpha1.NodeHealthEvent{}, EventNodeIndex, func(o client.Object) []string {
		return []string{o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("indexing events by node: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, PodNodeIndex, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing pods by node: %w", err)
	}
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
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToNode), builder.WithPredicates(podLeftOrFinished)).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(jobToNode)).
		// Only spec changes and annotations (the breaker reset) matter to
		// nodes; the policy's status changes with every count and would
		// otherwise re-enqueue every node on each of its writes.
		Watches(&gpuhealthv1alpha1.RemediationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.policyToNodes),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// nodeChanged lets through the node changes that matter: labels (policy
// selection), annotations (what we applied), cordon and taints. Heartbeats,
// which kubelets send every few seconds, do not.
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
			readyStatus(o) != readyStatus(n)
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
	return nh.Status.Phase.UsesBudget()
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
		if st := list.Items[i].Status; st.Phase == gpuhealthv1alpha1.PhaseQuarantined && st.Reason == ReasonWaitingForBudget {
			out = append(out, request(list.Items[i].Name)...)
		}
	}
	return out
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

// scope is everything one reconcile knows about a node.
type scope struct {
	// node is the Node; always set.
	node *corev1.Node
	// nh is the node's NodeHealth; always set (created on first sight).
	nh *gpuhealthv1alpha1.NodeHealth
	// policy is the RemediationPolicy that manages the node; always set.
	policy *gpuhealthv1alpha1.RemediationPolicy
	// machine is the FSM rebuilt from nh.status.phase.
	machine *fsm.Machine
	// judged are the node's findings as judged now, most severe first.
	judged []judgement
	// now is the reconcile's time.
	now metav1.Time
	// requeue is the earliest deadline a step waits for; zero when none.
	requeue time.Duration
	// fenceOnly is set when this pass only fenced the node; its status and
	// findings are written by the next pass.
	fenceOnly bool
	// hold is how long the bookkeeping after a fence waits for a storm of
	// fences to pass (with fenceOnly); zero: it follows at once.
	hold time.Duration
	// unwritten are transitions made in memory and not yet written; they are
	// counted in the metrics once the status write succeeds.
	unwritten []recordedTransition
	// cd is the node's ComputeDomain membership as observed now; set before
	// the findings are judged, never nil after that.
	cd *observedMembership
	// prevBlocking is status.blockingBudget as read, so a node that goes on
	// waiting for the same budget is not announced again.
	prevBlocking gpuhealthv1alpha1.BudgetName
	// attemptStarted is set when this reconcile started a recertification
	// attempt; its Jobs wait for the next one, after the attempt's start is
	// written down.
	attemptStarted bool
}

// recordedTransition is a transition for the metrics.
type recordedTransition struct {
	from, to gpuhealthv1alpha1.NodeHealthPhase
	reason   string
}

// written counts the transitions the last status write persisted.
func (s *scope) written() {
	for _, t := range s.unwritten {
		transitions.WithLabelValues(string(t.from), string(t.to), t.reason).Inc()
	}
	s.unwritten = nil
}

// counting returns the findings that count against the node now.
func (s *scope) counting() []judgement {
	var out []judgement
	for _, j := range s.judged {
		if j.counts {
			out = append(out, j)
		}
	}
	return out
}

// action is the most drastic action of the counting findings, Recertify when none.
func (s *scope) action() gpuhealthv1alpha1.Action {
	best := gpuhealthv1alpha1.ActionRecertify
	for _, j := range s.counting() {
		if actionRank[j.action] > actionRank[best] {
			best = j.action
		}
	}
	return best
}

func (s *scope) wait(d time.Duration) {
	if d <= 0 {
		d = time.Second
	}
	if s.requeue == 0 || d < s.requeue {
		s.requeue = d
	}
}

func (s *scope) dryRun() bool { return s.policy.Spec.DryRun }

// Reconcile moves one node forward as far as it can go now.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, reterr error) {
	logger := log.FromContext(ctx).WithValues("Node", klog.KRef("", req.Name))
	ctx = log.IntoContext(ctx, logger)

	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		if apierrors.IsNotFound(err) {
			forgetPhaseGauge(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	policy, err := r.policyFor(ctx, node)
	if err != nil {
		return ctrl.Result{}, err
	}
	if policy == nil {
		forgetPhaseGauge(node.Name) // no longer managed: no phase to alert on
		return ctrl.Result{}, nil
	}
	nh, err := r.ensureNodeHealth(ctx, node)
	if err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{node: node, nh: nh, policy: policy, now: metav1.NewTime(r.Clock.Now())}
	before := nh.DeepCopy()
	// The persisted phase, also when this pass writes nothing: a new leader
	// publishes every node's phase on its first pass (the alert rules bridge
	// the gap until then, config/prometheus/rules.yaml).
	phaseGauge(before)
	// Registered first so it runs last, after the status write below: with
	// an error the workqueue's backoff decides when to retry, not RequeueAfter.
	defer func() {
		if reterr != nil {
			result = ctrl.Result{}
		}
	}()
	defer func() {
		if s.fenceOnly && reterr == nil {
			result = ctrl.Result{RequeueAfter: max(s.hold, time.Millisecond), Priority: ptr.To(fencedPriority)}
			return
		}
		reterr = errors.Join(reterr, r.flushEvents(ctx, s))
		if equality.Semantic.DeepEqual(before.Status, s.nh.Status) {
			return
		}
		if reterr == nil {
			s.nh.Status.ObservedGeneration = s.nh.Generation
		}
		if err := r.Client.Status().Patch(ctx, s.nh, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) && reterr == nil {
				// Our cache was behind the object; the side effects are
				// idempotent, so decide again from the fresh copy.
				result = ctrl.Result{RequeueAfter: conflictRetry, Priority: ptr.To(normalPriority)}
				return
			}
			reterr = errors.Join(reterr, fmt.Errorf("patching status of nodehealth %s: %w", s.nh.Name, err))
			return
		}
		s.written()
		phaseGauge(s.nh)
	}()

	if err := r.reconcile(ctx, s, &before); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry, Priority: ptr.To(normalPriority)}, nil
		}
		return ctrl.Result{}, err
	}
	if s.fenceOnly {
		return ctrl.Result{}, nil // the deferred function sets the requeue
	}
	// An explicit priority: without one controller-runtime keeps the one the
	// item was taken off the queue with, and a node would go on waiting
	// below fresh work after its write-up pass at fencedPriority.
	return ctrl.Result{RequeueAfter: s.requeue, Priority: ptr.To(normalPriority)}, nil
}

func (r *Reconciler) reconcile(ctx context.Context, s *scope, before **gpuhealthv1alpha1.NodeHealth) error {
	if s.nh.Spec.Exclude {
		setCondition(s, ManagedCondition, false, ReasonExcluded, "spec.exclude is true: gpuhealth does not touch this node")
		return nil
	}
	setCondition(s, ManagedCondition, true, ReasonManaged, "managed by RemediationPolicy "+s.policy.Name)

	var err error
	if s.machine, err = fsm.New(s.nh.Status.Phase); err != nil {
		return reconcile.TerminalError(fmt.Errorf("nodehealth %s: %w", s.nh.Name, err))
	}
	if s.nh.Status.Phase == "" {
		fsm.Record(&s.nh.Status, "", gpuhealthv1alpha1.PhaseHealthy, ReasonManaged, "managed by RemediationPolicy "+s.policy.Name, "", s.now)
	}
	if err := r.observeComputeDomain(ctx, s); err != nil {
		return err
	}
	if err := r.judgeEvents(ctx, s); err != nil {
		return err
	}
	if err := r.handleRequest(ctx, s); err != nil {
		return err
	}
	if s.machine.Phase() != gpuhealthv1alpha1.PhaseHealthy && !s.dryRun() && nodepkg.HumanUncordoned(s.node) {
		return r.cancel(ctx, s)
	}

	s.prevBlocking, s.nh.Status.BlockingBudget = s.nh.Status.BlockingBudget, ""
	r.ensureMembershipStatus(s)
	if err := r.runPhases(ctx, s, before); err != nil || s.fenceOnly {
		return err
	}
	// Housekeeping after the phase's step, in the phase it ended in.
	r.ensureMembershipStatus(s)
	if s.machine.Phase() != gpuhealthv1alpha1.PhaseDraining &&
		meta.IsStatusConditionTrue(s.nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition) {
		// A human released or cancelled the drain: nothing waits to leave.
		setCondition(s, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, false, ReasonNotDraining,
			"the node is no longer draining ("+string(s.machine.Phase())+")")
	}
	if s.machine.Phase() != gpuhealthv1alpha1.PhaseHealthy {
		return r.ensureDeadMemberReleased(ctx, s)
	}
	return nil
}

// runPhases runs the phase steps. Each may fire a transition and hand on
// to the next phase's step in the same reconcile, so a node goes from a
// finding to cordoned in one pass.
func (r *Reconciler) runPhases(ctx context.Context, s *scope, before **gpuhealthv1alpha1.NodeHealth) error {
	for range 5 {
		phase := s.machine.Phase()
		var err error
		switch phase {
		case gpuhealthv1alpha1.PhaseHealthy:
			err = r.reconcileHealthy(ctx, s)
		case gpuhealthv1alpha1.PhaseQuarantined:
			err = r.reconcileQuarantined(ctx, s, before)
		case gpuhealthv1alpha1.PhaseDraining:
			err = r.reconcileDraining(ctx, s)
		case gpuhealthv1alpha1.PhaseRecertifying:
			err = r.reconcileRecertifying(ctx, s)
		case gpuhealthv1alpha1.PhaseFailed:
			err = r.ensureQuarantined(ctx, s)
		}
		if err != nil || s.machine.Phase() == phase {
			return err
		}
	}
	return nil
}

// policyFor returns the RemediationPolicy that manages the node (see
// gpuhealthv1alpha1.ManagingPolicy), nil when none does.
func (r *Reconciler) policyFor(ctx context.Context, node *corev1.Node) (*gpuhealthv1alpha1.RemediationPolicy, error) {
	list := &gpuhealthv1alpha1.RemediationPolicyList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing remediation policies: %w", err)
	}
	return gpuhealthv1alpha1.ManagingPolicy(list.Items, node.Labels), nil
}

// ensureNodeHealth returns the node's NodeHealth, creating it owned by the
// Node so that deleting the Node deletes it.
func (r *Reconciler) ensureNodeHealth(ctx context.Context, node *corev1.Node) (*gpuhealthv1alpha1.NodeHealth, error) {
	nh := &gpuhealthv1alpha1.NodeHealth{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(node), nh)
	if err == nil {
		return nh, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("getting nodehealth %s: %w", node.Name, err)
	}
	nh = &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}
	if err := controllerutil.SetOwnerReference(node, nh, r.Client.Scheme()); err != nil {
		return nil, fmt.Errorf("owning nodehealth %s: %w", node.Name, err)
	}
	if err := r.Client.Create(ctx, nh); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Our cache was behind: it exists, read it.
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(node), nh); err != nil {
				return nil, fmt.Errorf("getting nodehealth %s: %w", node.Name, err)
			}
			return nh, nil
		}
		return nil, fmt.Errorf("creating nodehealth %s: %w", node.Name, err)
	}
	return nh, nil
}

// judgeEvents judges the node's findings. The judgement goes into each
// finding's status in memory; flushEvents writes it, together with anything
// else this reconcile records on the finding, in one patch per finding.
func (r *Reconciler) judgeEvents(ctx context.Context, s *scope) error {
	list := &gpuhealthv1alpha1.NodeHealthEventList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{EventNodeIndex: s.node.Name}); err != nil {
		return fmt.Errorf("listing events of node %s: %w", s.node.Name, err)
	}
	s.judged = s.judged[:0]
	for i := range list.Items {
		ev := &list.Items[i]
		j := judge(ev, s.policy.Spec.Rules, s.now.Time)
		ignoreNonMemberIMEX(s, &j)
		if !j.recheckAt.IsZero() {
			s.wait(j.recheckAt.Sub(s.now.Time))
		}
		j.orig = ev.DeepCopy()
		ev.Status.Phase, ev.Status.Classification = j.phase, j.classification(s.policy.Name)
		s.judged = append(s.judged, j)
	}
	sort.SliceStable(s.judged, func(a, b int) bool {
		ja, jb := s.judged[a], s.judged[b]
		if ja.counts != jb.counts {
			return ja.counts
		}
		if sa, sb := severityRank[ja.event.Spec.Severity], severityRank[jb.event.Spec.Severity]; sa != sb {
			return sa > sb
		}
		return ja.event.Name < jb.event.Name
	})
	s.nh.Status.ActiveEvents = nil
	for _, j := range s.judged {
		if j.phase != gpuhealthv1alpha1.EventActive || len(s.nh.Status.ActiveEvents) == 32 {
			continue
		}
		s.nh.Status.ActiveEvents = append(s.nh.Status.ActiveEvents, gpuhealthv1alpha1.FindingRef{
			Name: j.event.Name, Check: j.event.Spec.Check, Code: j.event.Spec.Code, Severity: j.event.Spec.Severity,
			Verdict: j.verdict, RecommendedAction: j.action,
		})
	}
	return nil
}

// flushEvents writes what this reconcile recorded on the node's findings:
// one status patch per finding that changed, none for the rest.
func (r *Reconciler) flushEvents(ctx context.Context, s *scope) error {
	var errs []error
	for _, j := range s.judged {
		if j.orig == nil || equality.Semantic.DeepEqual(j.orig.Status, j.event.Status) {
			continue
		}
		if err := r.Client.Status().Patch(ctx, j.event, client.MergeFrom(j.orig)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("recording judgement of event %s: %w", j.event.Name, err))
		}
	}
	return errors.Join(errs...)
}

var severityRank = map[gpuhealthv1alpha1.Severity]int{
	gpuhealthv1alpha1.SeverityInfo: 0, gpuhealthv1alpha1.SeverityDegraded: 1, gpuhealthv1alpha1.SeverityFatal: 2,
}

// transition fires an FSM event, records it in status and publishes an
// Event on the Node. An illegal transition is counted and returned, never written.
func (r *Reconciler) transition(ctx context.Context, s *scope, e fsm.Event, reason, message, by string) error {
	from, to, err := s.machine.Fire(ctx, e)
	if err != nil {
		illegalTransitions.WithLabelValues(string(from), string(e)).Inc()
		return err
	}
	fsm.Record(&s.nh.Status, from, to, reason, truncate(message, 1024), by, s.now)
	s.unwritten = append(s.unwritten, recordedTransition{from: from, to: to, reason: reason}) // counted once written
	log.FromContext(ctx).Info("Transitioning node", "fromPhase", from, "toPhase", to, "reason", reason)
	eventType := corev1.EventTypeNormal
	if to != gpuhealthv1alpha1.PhaseHealthy {
		eventType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(s.node, s.nh, eventType, reason, string(e), "%s → %s: %s", from, to, message)
	if (to == gpuhealthv1alpha1.PhaseQuarantined || to == gpuhealthv1alpha1.PhaseFailed) && s.cd != nil && s.cd.member() {
		r.domainEvent(s, corev1.EventTypeWarning, ReasonMemberQuarantined, string(e),
			"member %s is out of service (%s → %s, %s): %s", s.node.Name, from, to, reason, message)
	}
	return nil
}

// setStatusReason records what the node waits for without a transition.
func setStatusReason(s *scope, reason, message string) {
	s.nh.Status.Reason = reason
	s.nh.Status.Message = truncate(message, 1024)
}

func setCondition(s *scope, t string, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&s.nh.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: truncate(message, 1024), ObservedGeneration: s.nh.Generation, LastTransitionTime: s.now,
	})
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
