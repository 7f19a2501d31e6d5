package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies/status,verbs=patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealths,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Reconciler writes each policy's status: its managed nodes by phase, the
// maxUnavailable budget, its conditions and the circuit breaker's state,
// which it mirrors from the Breaker whenever the breaker changes. It is the
// one writer of RemediationPolicy status.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the apiserver.
	Client client.Client
	// Cache is the manager's cache: the counts read its Node and
	// NodeHealth stores in place (index.EachCached), without the copy of
	// the fleet a List makes. Nil: they list through Client.
	Cache cache.Informers
	// Clock stamps conditions and spaces the counts (a fake clock that never
	// moves would hold every count after the first).
	Clock clock.PassiveClock
	// Recorder publishes the budget's and the breaker's Events on the policy.
	Recorder events.EventRecorder
	// Breaker is the nodehealth reconciler's circuit breaker; its state is
	// mirrored into status.circuitBreaker. Nil: the breaker's status is
	// left as it is.
	Breaker *breaker.Breaker
	// MinInterval is the least time between two counts of one
	// policy: in a storm every transition would otherwise re-count every
	// node, and the changes in between fold into the next count. Zero means
	// one second.
	MinInterval time.Duration
	// JobRules are the install's rules for the policy's Jobs; a policy that
	// breaks them is Ready=False with the breaches (and no controller acts
	// on it). The zero value allows no image.
	JobRules job.Rules

	mu      sync.Mutex
	counted map[string]time.Time
}

// throttle returns how long the count of a policy waits; zero when it may
// go ahead now, which it records.
func (r *Reconciler) throttle(name string) time.Duration {
	interval := r.MinInterval
	if interval <= 0 {
		interval = time.Second
	}
	now := r.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if wait := interval - now.Sub(r.counted[name]); wait > 0 {
		return wait
	}
	if r.counted == nil {
		r.counted = map[string]time.Time{}
	}
	r.counted[name] = now
	return 0
}

// SetupWithManager registers the watches. A NodeHealth phase change or a
// node label change re-counts every policy; there are few policies, and the
// workqueue and MinInterval fold a storm of changes into one count per
// policy a second.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.Clock == nil || r.Recorder == nil {
		return errors.New("policy.Reconciler needs Client, Clock and Recorder")
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Breaker != nil {
		// The breaker says when it changes (a count, an opening, a reset);
		// a full channel drops the signal, and the pending one covers it.
		changes := make(chan event.GenericEvent, 64)
		r.Breaker.Notify(func(policy string) {
			select {
			case changes <- event.GenericEvent{Object: &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: policy}}}:
			default:
			}
		})
		b = b.WatchesRawSource(source.Channel(changes, &handler.EnqueueRequestForObject{}))
	}
	return b.
		Named("remediationpolicy_status").
		For(&gpuhealthv1alpha1.RemediationPolicy{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, breakerChanged))).
		Watches(&gpuhealthv1alpha1.NodeHealth{}, handler.EnqueueRequestsFromMapFunc(r.allPolicies), builder.WithPredicates(phaseChanged)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allPolicies), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// One worker: counts are cheap and a single writer per policy status avoids conflicts.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// phaseChanged passes the NodeHealth changes the counts see: its phase, or
// the budget it waits for.
var phaseChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*gpuhealthv1alpha1.NodeHealth), e.ObjectNew.(*gpuhealthv1alpha1.NodeHealth)
		return o.Status.Phase != n.Status.Phase || o.Status.BlockingBudget != n.Status.BlockingBudget
	},
}

// breakerChanged passes the nodehealth reconciler's writes of the breaker's
// state and a reset request, which the breaker metric follows.
var breakerChanged = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	DeleteFunc: func(event.DeleteEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*gpuhealthv1alpha1.RemediationPolicy), e.ObjectNew.(*gpuhealthv1alpha1.RemediationPolicy)
		return breakerState(o) != breakerState(n) ||
			o.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation] != n.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func breakerState(p *gpuhealthv1alpha1.RemediationPolicy) gpuhealthv1alpha1.BreakerState {
	if p.Status.CircuitBreaker == nil {
		return ""
	}
	return p.Status.CircuitBreaker.State
}

func (r *Reconciler) allPolicies(ctx context.Context, _ client.Object) []ctrl.Request {
	list := &gpuhealthv1alpha1.RemediationPolicyList{}
	if err := r.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "Listing remediation policies")
		return nil
	}
	out := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return out
}

// Reconcile counts the policy's nodes and patches its status when the counts changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if wait := r.throttle(req.Name); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			deletePolicyMetrics(req.Name)
			r.mu.Lock()
			delete(r.counted, req.Name)
			r.mu.Unlock()
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	now := metav1.NewTime(r.Clock.Now())
	// Looked at again when an open breaker's cool-down ends, so the metric
	// drops then even when no node asks the breaker.
	breakerRecheck := setBreakerMetric(p, now.Time)
	before := p.DeepCopy()
	sel, err := p.Selector()
	if err != nil {
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
			Type: gpuhealthv1alpha1.PolicyReadyCondition, Status: metav1.ConditionFalse, Reason: gpuhealthv1alpha1.ReasonInvalidSelector,
			Message: fmt.Sprintf("nodeSelector does not parse: %v", err), ObservedGeneration: p.Generation, LastTransitionTime: now,
		})
		// It selects no node: no counts.
		p.Status.ManagedNodes, p.Status.Phases, p.Status.Budget = 0, nil, nil
		deleteBudgetMetrics(p.Name)
		return ctrl.Result{RequeueAfter: breakerRecheck}, r.patch(ctx, before, p)
	}
	c, err := r.count(ctx, p, sel)
	if err != nil {
		return ctrl.Result{}, err
	}
	p.Status.ManagedNodes = int32(len(c.managed))
	p.Status.Phases = c.phases
	r.mirrorBreaker(p, len(c.managed), now)
	limit, err := budget.Limit(p.Spec.Budgets.MaxUnavailable, len(c.managed), budget.DefaultMaxUnavailable)
	if err != nil {
		// The nodehealth controller fails closed on it and says so on each node.
		log.FromContext(ctx).Error(err, "Resolving maxUnavailable", "RemediationPolicy", klog.KObj(p))
	}
	p.Status.Budget = &gpuhealthv1alpha1.BudgetStatus{
		Limit:       int32(limit),
		Unavailable: c.unavailable,
		Waiting:     c.waiting,
	}
	setBudgetMetrics(p)
	p.Status.ObservedGeneration = p.Generation
	meta.SetStatusCondition(&p.Status.Conditions, readyCondition(p, len(c.managed), r.JobRules.Breaches(&p.Spec), now))
	if err := r.patch(ctx, before, p); err != nil {
		return ctrl.Result{}, err
	}
	r.budgetEvent(before, p)
	r.breakerEvent(before, p, c.held)
	return ctrl.Result{RequeueAfter: breakerRecheck}, nil
}

// counts are what a policy's status says of its nodes.
type counts struct {
	managed              map[string]bool
	phases               map[gpuhealthv1alpha1.NodeHealthPhase]int32
	unavailable, waiting int32
	// held are the nodes the open breaker keeps from quarantine, sorted.
	held []string
}

// count counts the nodes sel selects by their NodeHealths, reading the
// cached objects in place (see Cache).
func (r *Reconciler) count(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy, sel labels.Selector) (counts, error) {
	c := counts{managed: map[string]bool{}, phases: map[gpuhealthv1alpha1.NodeHealthPhase]int32{}}
	err := index.Each(ctx, r.Cache, r.Client, &corev1.Node{}, &corev1.NodeList{}, func(o client.Object) {
		if sel.Matches(labels.Set(o.GetLabels())) {
			c.managed[o.GetName()] = true
		}
	})
	if err != nil {
		return c, fmt.Errorf("listing nodes: %w", err)
	}
	err = index.Each(ctx, r.Cache, r.Client, &gpuhealthv1alpha1.NodeHealth{}, &gpuhealthv1alpha1.NodeHealthList{}, func(o client.Object) {
		nh := o.(*gpuhealthv1alpha1.NodeHealth)
		if !c.managed[nh.Name] {
			return
		}
		if ph := nh.Status.Phase; ph != "" {
			c.phases[ph]++
		}
		if p.Spec.ConsumesBudget(nh.Status.Phase) {
			c.unavailable++
		}
		if nh.Status.BlockingBudget == gpuhealthv1alpha1.BudgetMaxUnavailable {
			c.waiting++
		}
		if nh.Status.Reason == gpuhealthv1alpha1.ReasonCircuitBreakerOpen && nh.Status.Phase == gpuhealthv1alpha1.PhaseHealthy {
			c.held = append(c.held, nh.Name)
		}
	})
	if err != nil {
		return c, fmt.Errorf("listing nodehealths: %w", err)
	}
	sort.Strings(c.held)
	return c, nil
}

// readyCondition is the policy's Ready condition for a node selector that
// parses: False while a drain namespaceSelector does not parse (every
// drain of its nodes would fail on it), or while its Job templates break
// the install's rules, listing the breaches (the nodehealth and fabric
// controllers do not act on it meanwhile), else True. The counts stay:
// they show what the policy would manage.
func readyCondition(p *gpuhealthv1alpha1.RemediationPolicy, managed int, breaches []string, now metav1.Time) metav1.Condition {
	if err := p.Spec.Drain.NamespaceSelectorError(); err != nil {
		return metav1.Condition{
			Type: gpuhealthv1alpha1.PolicyReadyCondition, Status: metav1.ConditionFalse, Reason: gpuhealthv1alpha1.ReasonInvalidSelector,
			Message:            gpuhealthv1alpha1.Truncate(fmt.Sprintf("%v; drains of this policy's %d nodes fail until it is fixed", err, managed), 32768),
			ObservedGeneration: p.Generation, LastTransitionTime: now,
		}
	}
	if len(breaches) > 0 {
		return metav1.Condition{
			Type: gpuhealthv1alpha1.PolicyReadyCondition, Status: metav1.ConditionFalse, Reason: gpuhealthv1alpha1.ReasonJobRulesBreached,
			Message: gpuhealthv1alpha1.Truncate(fmt.Sprintf("%d breaches of the install's Job rules; gpuhealth does not act on this policy's %d nodes until they are fixed: %s",
				len(breaches), managed, strings.Join(breaches, "; ")), 32768),
			ObservedGeneration: p.Generation, LastTransitionTime: now,
		}
	}
	return metav1.Condition{
		Type: gpuhealthv1alpha1.PolicyReadyCondition, Status: metav1.ConditionTrue, Reason: gpuhealthv1alpha1.ReasonValid,
		Message: fmt.Sprintf("managing %d nodes", managed), ObservedGeneration: p.Generation, LastTransitionTime: now,
	}
}

// mirrorBreaker writes the breaker's state into the policy's status. A
// breaker this process has not loaded yet (no node asked it since the
// operator started) leaves the status as the previous leader wrote it.
func (r *Reconciler) mirrorBreaker(p *gpuhealthv1alpha1.RemediationPolicy, managed int, now metav1.Time) {
	if r.Breaker == nil || !r.Breaker.Seeded(p.Name) || !breaker.Enabled(p.Spec.CircuitBreaker) {
		return
	}
	settings, err := breaker.SettingsFor(p.Spec.CircuitBreaker, managed)
	if err != nil {
		return // the nodehealth reconciler fails closed on it and says so on each node
	}
	st := r.Breaker.Peek(p.Name, settings, now.Time)
	want := gpuhealthv1alpha1.BreakerClosed
	if st.Open {
		want = gpuhealthv1alpha1.BreakerOpen
	}
	cur := p.Status.CircuitBreaker
	since := metav1.NewTime(st.Since)
	switch {
	case !st.Since.IsZero():
	case cur != nil && cur.State == want && cur.Since != nil:
		since = *cur.Since
	default:
		since = now
	}
	p.Status.CircuitBreaker = &gpuhealthv1alpha1.CircuitBreakerStatus{
		State: want, Since: &since, QuarantinesInWindow: int32(st.InWindow), Message: gpuhealthv1alpha1.Truncate(st.Message, 512),
		LastReset: r.Breaker.LastReset(p.Name),
	}
}

// breakerEvent publishes an Event on the policy when its written breaker
// state changed: Warning when it opens, Normal when it closes, naming the
// nodes it holds back from quarantine (their findings count, their Nodes
// say GPUHealthy Unknown, QuarantineHeld).
func (r *Reconciler) breakerEvent(before, p *gpuhealthv1alpha1.RemediationPolicy, held []string) {
	cb := p.Status.CircuitBreaker
	if cb == nil || breakerState(before) == cb.State || breakerState(before) == "" && cb.State == gpuhealthv1alpha1.BreakerClosed {
		return
	}
	eventType := corev1.EventTypeNormal
	if cb.State == gpuhealthv1alpha1.BreakerOpen {
		eventType = corev1.EventTypeWarning
	}
	note := "circuit breaker " + cb.Message
	if len(held) > 0 {
		note += fmt.Sprintf("; holding %d nodes from quarantine: %s", len(held), gpuhealthv1alpha1.FirstN(held, 10, ", "))
	}
	r.Recorder.Eventf(p, nil, eventType, gpuhealthv1alpha1.ReasonCircuitBreakerOpen, "CircuitBreaker", "%s", note)
}

// budgetEvent publishes one Event on the policy when nodes start waiting
// for its maxUnavailable budget and one when none waits any more: a storm
// of blocked nodes is one Event, not one per node. The last status is the
// memory, so a restart does not repeat it.
func (r *Reconciler) budgetEvent(before, p *gpuhealthv1alpha1.RemediationPolicy) {
	var was int32
	if before.Status.Budget != nil {
		was = before.Status.Budget.Waiting
	}
	b := p.Status.Budget
	switch {
	case was == 0 && b.Waiting > 0:
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonBudgetExhausted, "Drain",
			"%d quarantined nodes wait for budget maxUnavailable: %d of %d managed nodes unavailable, limit %d", b.Waiting, b.Unavailable, p.Status.ManagedNodes, b.Limit)
	case was > 0 && b.Waiting == 0:
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonBudgetAvailable, "Drain",
			"no node waits for budget maxUnavailable any more: %d of %d managed nodes unavailable, limit %d", b.Unavailable, p.Status.ManagedNodes, b.Limit)
	}
}

func (r *Reconciler) patch(ctx context.Context, before, p *gpuhealthv1alpha1.RemediationPolicy) error {
	if equality.Semantic.DeepEqual(before.Status, p.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, p, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patching status of remediationpolicy %s: %w", p.Name, err)
	}
	return nil
}
