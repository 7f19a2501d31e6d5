package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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
)

// The operator creates a node's NodeHealth and then writes only its status;
// the spec (requests, hold, exclusion) is the users'. Status writes are
// patches.
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealths,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealths/status,verbs=patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents/status,verbs=patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies/status,verbs=patch
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
	// pendingRecheck is the wait for a suite Job whose pod has not run
	// yet: nothing enqueues the node when the scheduler or kubelet says
	// why, and the pod is gone once the Job's deadline ends the wait, so
	// why is read while it waits (one pod list per pass, for such Jobs only).
	pendingRecheck = 10 * time.Second
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
	// DriverNamespace is the namespace of NVIDIA's DRA driver: only a pod
	// there can be a ComputeDomain daemon pod (computedomain.IsDaemonPod).
	// The manager's cache must hold the pods of this namespace.
	DriverNamespace string
	// JobRules are the install's rules for the policy's Jobs: a node whose
	// policy breaks them is left as it is (no fence, drain or Job) and
	// says why. The zero value allows no image, so a policy with any Job
	// breaks it.
	JobRules job.Rules
	// Outputs reads what suite Jobs printed, for their parsers. Nil: a step
	// whose parser needs output fails for want of it.
	Outputs job.OutputReader
	// Waits says why a suite Job's pod does not run yet. Nil: a step that
	// never runs is reported without the scheduler's or kubelet's words.
	Waits job.WaitReader
	// HandOff reads and writes what the policy's hand-off touches (the
	// Cluster API Machine, the object a template describes), straight from
	// the apiserver, as the identity the install gives the hand-off: the
	// gpuhealth-handoff ServiceAccount, impersonated, which holds only the
	// install's hand-off rules. Its RESTMapper maps a template's kind to
	// its resource.
	HandOff client.Client
	// HandOffResources are the resources a Template hand-off may create
	// (the install's operator.handOff.rules); handoff.RefusedGroups and
	// Namespace are refused whatever it says. Nil: none.
	HandOffResources []schema.GroupResource
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
	// StormHoldMax bounds that hold per node. Zero means
	// defaultStormHoldMax.
	StormHoldMax time.Duration

	admission admission
	storm     *stormGate
	snapshots *snapshotCache
	// cache is the manager's, read in place where a List would copy the
	// fleet; nil in tests that build a Reconciler without a manager.
	cache  cache.Informers
	expect *expectations
}

// SetupWithManager registers the watches. The reconciler lists through the
// cache indexes named in gpuhealthv1alpha1, which the composition root
// registers (controllers/index).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Client == nil || r.APIReader == nil || r.HandOff == nil || r.Clock == nil || r.Recorder == nil || r.Drainer == nil || r.Breaker == nil || r.Namespace == "" || r.DriverNamespace == "" {
		return errors.New("nodehealth.Reconciler needs Client, APIReader, HandOff, Clock, Recorder, Drainer, Breaker, Namespace and DriverNamespace")
	}
	// Held write-ups are woken when a storm passes, at their own priority.
	stormPassed := make(chan event.GenericEvent, 1024)
	r.storm = &stormGate{quiet: r.StormQuiet, maxHold: r.StormHoldMax, wake: func(node string) {
		stormPassed <- event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}
	}}
	if r.storm.maxHold <= 0 {
		r.storm.maxHold = defaultStormHoldMax
	}
	r.cache = mgr.GetCache()
	r.snapshots = &snapshotCache{}
	if err := r.snapshots.watch(ctx, mgr); err != nil {
		return err
	}
	r.expect = newExpectations(r.Clock)
	// The Drainer's pod watches run on the elected leader, which drains.
	if err := mgr.Add(r.Drainer); err != nil {
		return fmt.Errorf("adding the drain's pod watches: %w", err)
	}
	gauges.serve(mgr.GetCache(), mgr.Elected())
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
		Watches(&gpuhealthv1alpha1.NodeHealthEvent{}, findingsFirst{handler.EnqueueRequestsFromMapFunc(eventToNode)}, builder.WithPredicates(eventChanged)).
		// Workload pods are not cached: each draining node's own pod watch
		// wakes it. The cached pods are ComputeDomain daemon pods.
		WatchesRawSource(source.Channel(r.Drainer.Wakeups(), handler.EnqueueRequestsFromMapFunc(nodeHealthToNode))).
		WatchesRawSource(source.Channel(stormPassed, atPriority(fencedPriority))).
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

// Reconcile moves one node forward as far as it can go now, in five steps:
// observe reads, decide plans, admit takes the shared resources the plan
// asks for, apply acts, record writes the status once and then announces.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("Node", klog.KRef("", req.Name)))
	o, err := r.observe(ctx, req.Name)
	if err != nil || o == nil {
		return r.unobserved(ctx, req.Name, err)
	}
	// The drain is the one act before deciding: the Eviction API answers
	// only by being tried.
	r.actBeforeDeciding(ctx, o)
	t, p := r.admit(ctx, o, decide(o))
	defer t.release()
	switch {
	case p == nil:
		return after(budgetLockRetry), nil
	case p.terminal:
		return ctrl.Result{}, reconcile.TerminalError(p.err)
	}
	if err := r.apply(ctx, o, p, t); err != nil || p.fenceOnly {
		return retryOn(result(p), err)
	}
	written, err := r.record(ctx, o, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !written {
		// Our cache was behind the object; the acts are idempotent, so
		// decide again from the fresh copy.
		return after(conflictRetry), nil
	}
	t.wrote(o.nh.Name, &p.status)
	if err := r.applyAfterWrite(ctx, o, p); err != nil {
		// A conflict: the node changed under us (a kubelet's status, say)
		// and the return to service is repeated from the fresh copy.
		return retryOn(ctrl.Result{}, err)
	}
	return retryOn(result(p), p.err)
}

// after is a requeue after d at the priority of fresh work.
func after(d time.Duration) ctrl.Result {
	return ctrl.Result{RequeueAfter: d, Priority: ptr.To(normalPriority)}
}

// retryOn is res when err is nil, a retry after conflictRetry when err
// says the cache was behind (an optimistic-lock conflict, or a NodeHealth
// that exists already), else err.
func retryOn(res ctrl.Result, err error) (ctrl.Result, error) {
	switch {
	case err == nil:
		return res, nil
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return after(conflictRetry), nil
	}
	return ctrl.Result{}, err
}
