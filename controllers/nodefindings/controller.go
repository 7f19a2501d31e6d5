package nodefindings

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
)

// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents/status,verbs=patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodeinventories,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=remediationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=list

// Timing of the passes.
const (
	// DefaultResync is the longest time between two passes, and how often
	// the DRA driver's ResourceSlices are read (from the apiserver, not a
	// cache: the operator caches no slices).
	DefaultResync = time.Minute
	// DefaultStaleAfter is how old a NodeInventory may be and still count:
	// six of the monitor's default report intervals. An older report is a
	// monitor that stopped; its node neither drifts nor sets a pool's
	// majority on what it said an hour ago.
	DefaultStaleAfter = time.Hour
	// minGap is the shortest time between two passes: 2,000 nodes'
	// heartbeats and reports would otherwise each start one.
	minGap = 2 * time.Second
)

// passKey is the one request every watch maps to: a pass looks at every
// node at once, since a node's drift depends on its pool.
var passKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "nodefindings"}}

// Reconciler derives findings from what the cluster shows about its nodes:
// Node conditions the policy lists (source nodeCondition), each node's
// NVIDIA stack against its pool's majority and its GPU count against the
// expected one (source operator). Each is a NodeHealthEvent like a
// monitor's, opened while the condition holds and resolved when it stops,
// so the node workflow judges it by the same rules, debounce and budgets.
//
// A pass reads (policies, nodes, inventories, the operator's findings,
// slices when due), plans (pure: plan, diff) and acts (creates, status
// patches); a write that fails is retried by the next pass, which starts
// from what it reads then, so a stale read only delays a write: creates
// meet AlreadyExists, patches carry the resourceVersion they were planned
// on.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the apiserver.
	Client client.Client
	// APIReader reads ResourceSlices from the apiserver; nil skips them.
	APIReader client.Reader
	// Driver is the DRA driver whose slices count GPUs
	// (devicetaint.DefaultDriver when empty).
	Driver string
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Resync is DefaultResync when zero.
	Resync time.Duration
	// StaleAfter is DefaultStaleAfter when zero.
	StaleAfter time.Duration

	lastPass   time.Time
	slices     map[string]int
	slicesRead time.Time
}

// Reconcile runs one pass over every node.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	now := r.clock().Now()
	if wait := minGap - now.Sub(r.lastPass); !r.lastPass.IsZero() && wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	r.lastPass = now
	in, existing, err := r.read(ctx, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	w := plan(in)
	changes := diff(w, existing, metav1.NewTime(now.Truncate(time.Second)))
	err = r.act(ctx, changes)
	observe(w)
	return reconcile.Result{RequeueAfter: r.resync()}, err
}

func (r *Reconciler) resync() time.Duration { return cmp.Or(r.Resync, DefaultResync) }

func (r *Reconciler) staleAfter() time.Duration { return cmp.Or(r.StaleAfter, DefaultStaleAfter) }

func (r *Reconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

// read gathers a pass's input.
func (r *Reconciler) read(ctx context.Context, now time.Time) ([]nodeInput, []gpuhealthv1alpha1.NodeHealthEvent, error) {
	var policies gpuhealthv1alpha1.RemediationPolicyList
	if err := r.Client.List(ctx, &policies); err != nil {
		return nil, nil, fmt.Errorf("listing RemediationPolicies: %w", err)
	}
	// The cache's objects, not deep copies (a pass reads the whole fleet,
	// at most every 2 s in a storm): read-only here, and apply copies a
	// finding before it changes it.
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing Nodes: %w", err)
	}
	var invs gpuhealthv1alpha1.NodeInventoryList
	if err := r.Client.List(ctx, &invs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing NodeInventories: %w", err)
	}
	var events gpuhealthv1alpha1.NodeHealthEventList
	if err := r.Client.List(ctx, &events, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing NodeHealthEvents: %w", err)
	}
	byNode := map[string]*gpuhealthv1alpha1.NodeInventory{}
	for i := range invs.Items {
		inv := &invs.Items[i]
		// Only the report about the node it is named after counts (the
		// schema holds the two equal; this does not depend on it).
		if inv.Spec.NodeName == inv.Name && now.Sub(inv.Spec.ObservedAt.Time) <= r.staleAfter() {
			byNode[inv.Name] = inv
		}
	}
	needSlices := false
	for i := range policies.Items {
		if policies.Items[i].Spec.GPUCount != nil {
			needSlices = true
		}
	}
	if needSlices {
		r.readSlices(ctx, now)
	}
	out := make([]nodeInput, 0, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		in := nodeInput{node: n, policy: gpuhealthv1alpha1.ManagingPolicy(policies.Items, n.Labels), inventory: byNode[n.Name]}
		if c, ok := r.slices[n.Name]; ok && needSlices {
			in.sliceGPUs = ptr.To(c)
		}
		out = append(out, in)
	}
	// diff looks only at the findings of the operator's own sources.
	return out, events.Items, nil
}

// readSlices counts each node's GPUs in the DRA driver's slices, at most
// once a resync; a failed read keeps the last counts.
func (r *Reconciler) readSlices(ctx context.Context, now time.Time) {
	if r.APIReader == nil || (!r.slicesRead.IsZero() && now.Sub(r.slicesRead) < r.resync()) {
		return
	}
	driver := cmp.Or(r.Driver, devicetaint.DefaultDriver)
	var list resourcev1.ResourceSliceList
	if err := r.APIReader.List(ctx, &list, client.MatchingFields{"spec.driver": driver}); err != nil {
		log.FromContext(ctx).Info("Cannot read the DRA driver's ResourceSlices; GPU counts keep the last read", "err", err.Error())
		return
	}
	nodes := map[string]bool{}
	for i := range list.Items {
		if n := ptr.Deref(list.Items[i].Spec.NodeName, ""); n != "" {
			nodes[n] = true
		}
	}
	counts := map[string]int{}
	for n := range nodes {
		counts[n] = sliceGPUCount(devicetaint.Current(list.Items, driver, n))
	}
	r.slices, r.slicesRead = counts, now
}

// act makes the writes; it goes on past a failed one and returns them
// all joined.
func (r *Reconciler) act(ctx context.Context, changes []change) error {
	var errs []error
	for _, c := range changes {
		if err := r.apply(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		count(c)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) apply(ctx context.Context, c change) error {
	ev := c.patch
	if ev != nil {
		ev = ev.DeepCopy() // the cache's own object (see read)
	}
	if c.create != nil {
		if err := r.Client.Create(ctx, c.create); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Another writer (a previous pass whose read was stale)
				// made it; the next pass sees it.
				return nil
			}
			return fmt.Errorf("creating finding %s: %w", c.create.Name, err)
		}
		ev = c.create
	}
	// A finding just created gets its first status whatever the node
	// workflow wrote meanwhile (its judgement: other fields); one read
	// earlier is patched only as read, so a stale read never counts an
	// occurrence twice (a conflict waits for the next pass).
	patch := client.MergeFromWithOptions(ev.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if c.create != nil {
		patch = client.MergeFrom(ev.DeepCopy())
	}
	ev.Status.Count, ev.Status.FirstSeen, ev.Status.LastSeen = c.status.Count, c.status.FirstSeen, c.status.LastSeen
	ev.Status.Resolved, ev.Status.ResolvedAt = c.status.Resolved, c.status.ResolvedAt
	if err := r.Client.Status().Patch(ctx, ev, patch); err != nil {
		return fmt.Errorf("writing the status of finding %s: %w", ev.Name, err)
	}
	log.FromContext(ctx).V(1).Info("Derived finding written", "finding", ev.Name, "opened", c.opened, "resolved", c.resolved)
	return nil
}

// SetupWithManager watches what a pass reads; every event maps to the one
// pass.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toPass := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{passKey}
	})
	oursOnly := predicate.NewPredicateFuncs(func(o client.Object) bool {
		ev, ok := o.(*gpuhealthv1alpha1.NodeHealthEvent)
		return ok && ours(ev.Spec.Source)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodefindings").
		Watches(&corev1.Node{}, toPass, builder.WithPredicates(nodeChanged())).
		Watches(&gpuhealthv1alpha1.NodeInventory{}, toPass).
		Watches(&gpuhealthv1alpha1.RemediationPolicy{}, toPass, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&gpuhealthv1alpha1.NodeHealthEvent{}, toPass, builder.WithPredicates(oursOnly)).
		Complete(r)
}

// nodeChanged passes a Node event on when what a pass reads of it changed:
// labels, conditions (not their heartbeat times), capacity, allocatable.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		a, okA := e.ObjectOld.(*corev1.Node)
		b, okB := e.ObjectNew.(*corev1.Node)
		if !okA || !okB {
			return true
		}
		return !maps.Equal(a.Labels, b.Labels) || !conditionsEqual(a.Status.Conditions, b.Status.Conditions) ||
			!equality.Semantic.DeepEqual(a.Status.Allocatable, b.Status.Allocatable) ||
			!equality.Semantic.DeepEqual(a.Status.Capacity, b.Status.Capacity)
	}}
}

func conditionsEqual(a, b []corev1.NodeCondition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message {
			return false
		}
	}
	return true
}
