package computedomain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents;nodehealths;remediationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// FabricReconciler taints every node of an NVLink clique while its members
// report a fabric-scoped fault, so the scheduler places no new
// ComputeDomain on the broken rack, and lifts exactly the taints it added
// when the faults resolve. It drains nothing: the healthy members keep
// their running jobs. Requests are keyed by clique ID.
//
// A node's clique comes from NVIDIA's DRA driver where a
// ComputeDomainClique lists the node, and otherwise from the node's
// nvidia.com/gpu.clique label. The label is the node's own word (its
// kubelet may set it to anything), so a clique known from labels alone is
// tainted only when two of its members report, unless a policy says one
// report suffices: one node cannot take a rack it names out of service.
type FabricReconciler struct {
	// Client reads from the manager's cache and writes to the apiserver.
	Client client.Client
	// Recorder publishes Events on the tainted nodes.
	Recorder events.EventRecorder
	// MaxConcurrentReconciles is how many cliques reconcile in parallel. Zero means 4.
	MaxConcurrentReconciles int
	// Clock is the time source; tests step a fake one. Nil means the real clock.
	Clock clock.PassiveClock
	// Namespace is where clique certification Jobs run. Empty: a policy's
	// cliqueCertification is not run and the taint goes with the fault.
	Namespace string
	// Outputs reads what a clique certification Job's index 0 printed.
	Outputs job.OutputReader
	// Cliques is the DRA driver's word on clique membership (the
	// ComputeDomain view). Nil: cliques come from node labels alone.
	Cliques CliqueDirectory
	// JobRules are the install's rules for the policy's Jobs: a
	// cliqueCertification of a policy that breaks them is not run, and the
	// clique's taint stays until the policy is fixed. The zero value allows
	// no image.
	JobRules job.Rules

	mu       sync.Mutex
	degraded map[string]bool
}

// SetupWithManager registers the indexes and watches.
func (r *FabricReconciler) SetupWithManager(_ context.Context, mgr ctrl.Manager) error {
	if r.Client == nil || r.Recorder == nil {
		return errors.New("computedomain.FabricReconciler needs Client and Recorder")
	}
	workers := r.MaxConcurrentReconciles
	if workers == 0 {
		workers = 4
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("computedomain_fabric").
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(jobToClique)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(nodeToCliques), builder.WithPredicates(nodeCliqueChanged)).
		Watches(&gpuhealthv1alpha1.NodeHealthEvent{}, handler.EnqueueRequestsFromMapFunc(r.eventToClique), builder.WithPredicates(fabricEvent)).
		// Exclude (spec) changes only; NodeHealth status is written often.
		Watches(&gpuhealthv1alpha1.NodeHealth{}, handler.EnqueueRequestsFromMapFunc(r.nodeHealthToClique), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&gpuhealthv1alpha1.RemediationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.allCliques), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// CliqueDirectory says which nodes NVIDIA's DRA driver lists in which
// NVLink clique (View implements it).
type CliqueDirectory interface {
	// Listed returns the membership entries that list node.
	Listed(node string) []Listing
	// CliqueMembers returns the nodes ComputeDomainCliques list in cliqueID.
	CliqueMembers(cliqueID string) []string
}

// driverCliques returns the NVLink cliques the driver's ComputeDomainCliques
// place node in; none when no clique object lists it (a driver without
// cliques, or a node in no ComputeDomain).
func (r *FabricReconciler) driverCliques(node string) []string {
	if r.Cliques == nil {
		return nil
	}
	var out []string
	for _, l := range r.Cliques.Listed(node) {
		if l.Trace == gpuhealthv1alpha1.TraceCliqueEntry && l.CliqueID != "" && !slices.Contains(out, l.CliqueID) {
			out = append(out, l.CliqueID)
		}
	}
	return out
}

// memberOf says whether a node belongs to clique: by the driver's cliques
// when any lists it, otherwise by its label.
func memberOf(label string, driver []string, clique string) bool {
	if len(driver) > 0 {
		return slices.Contains(driver, clique)
	}
	return label == clique
}

// NodeCliques is the clique label value and the clique in FabricAnnotation:
// what gpuhealthv1alpha1.NodeCliqueField indexes, so a clique's reconcile
// finds both its nodes and the nodes it tainted that have since moved.
func NodeCliques(o client.Object) []string {
	var out []string
	if v := o.GetLabels()[CliqueNodeLabel]; v != "" {
		out = append(out, v)
	}
	if v := o.GetAnnotations()[nodepkg.FabricAnnotation]; v != "" && !slices.Contains(out, v) {
		out = append(out, v)
	}
	return out
}

func cliqueRequests(cliques []string) []ctrl.Request {
	out := make([]ctrl.Request, 0, len(cliques))
	for _, c := range cliques {
		out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Name: c}})
	}
	return out
}

// jobToClique maps a clique certification Job to its clique.
func jobToClique(_ context.Context, o client.Object) []ctrl.Request {
	if o.GetLabels()[job.KindLabel] != string(job.CliqueCertification) {
		return nil
	}
	return cliqueRequests([]string{o.GetLabels()[job.CliqueLabel]})
}

func nodeToCliques(_ context.Context, o client.Object) []ctrl.Request {
	return cliqueRequests(NodeCliques(o))
}

// nodeCliqueChanged lets through what moves a node between cliques or
// touches the fabric taint, not heartbeats.
var nodeCliqueChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			o.Annotations[nodepkg.FabricAnnotation] != n.Annotations[nodepkg.FabricAnnotation] ||
			!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints)
	},
}

// fabricEvent lets through fabric-scoped findings only.
var fabricEvent = predicate.NewPredicateFuncs(func(o client.Object) bool {
	ev, ok := o.(*gpuhealthv1alpha1.NodeHealthEvent)
	return ok && ev.Spec.IsCliqueFault()
})

func (r *FabricReconciler) nodeCliqueOf(ctx context.Context, name string) []ctrl.Request {
	n := &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
		return nil
	}
	cliques := NodeCliques(n)
	for _, c := range r.driverCliques(name) {
		if !slices.Contains(cliques, c) {
			cliques = append(cliques, c)
		}
	}
	return cliqueRequests(cliques)
}

func (r *FabricReconciler) eventToClique(ctx context.Context, o client.Object) []ctrl.Request {
	return r.nodeCliqueOf(ctx, o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName)
}

func (r *FabricReconciler) nodeHealthToClique(ctx context.Context, o client.Object) []ctrl.Request {
	return r.nodeCliqueOf(ctx, o.GetName())
}

func (r *FabricReconciler) allCliques(ctx context.Context, _ client.Object) []ctrl.Request {
	list := &corev1.NodeList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodes for a policy change")
		return nil
	}
	seen := map[string]bool{}
	for i := range list.Items {
		for _, c := range NodeCliques(&list.Items[i]) {
			seen[c] = true
		}
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	return cliqueRequests(out)
}

// IsFabricFault says whether a finding is a fabric-scoped fault that is
// still open: not resolved, and not ignored, resolved or superseded by the
// operator's judgement (which ignores, for example, IMEX findings of a node
// that is no ComputeDomain member).
func IsFabricFault(ev *gpuhealthv1alpha1.NodeHealthEvent) bool {
	if !ev.Spec.IsCliqueFault() || ev.Status.Resolved {
		return false
	}
	switch ev.Status.Phase {
	case gpuhealthv1alpha1.EventIgnored, gpuhealthv1alpha1.EventResolved, gpuhealthv1alpha1.EventSuperseded:
		return false
	}
	return true
}

// Reconcile makes the clique's fabric taint match its faults, in the
// eventgc shape: read the clique, plan (a pure function), act.
func (r *FabricReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("clique", req.Name))
	c, err := r.readClique(ctx, req.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	p := planClique(c)
	r.setDegraded(c.name, p.degraded)
	// The certification step is a workflow of its own (cliquecert.go): it
	// says whether the taint must stay after the faults resolved.
	hold, requeue, err := r.certificationStep(ctx, c, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.changeTaints(ctx, c, planTaints(c, p.degraded, hold)); err != nil {
		if conflicts(err) {
			// A node changed under us; decide again from the fresh copy.
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, err
	}
	if p.unconfirmed && (requeue == 0 || requeue > unconfirmedRecheck) {
		log.FromContext(ctx).V(1).Info("A fabric fault waits for confirmation before the clique is tainted", "faults", describe(c.faults))
		requeue = unconfirmedRecheck
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// clique is what one reconcile reads of a clique.
type clique struct {
	name string
	// nodes are those the clique's index names (its members by label, and
	// the nodes it tainted that have since moved) and those the driver's
	// ComputeDomainCliques list in it.
	nodes []corev1.Node
	// faults are the open fabric faults of the managed members.
	faults []fabricFault
	// singleReport: an eligible member's policy lets one report taint a
	// clique known from labels alone.
	singleReport bool
	// eligible: a managed member whose policy lets the clique be tainted;
	// managed: a member some policy manages and that is not excluded.
	eligible, managed map[string]bool
	// certSpec is the clique certification an eligible member's policy asks
	// for, nil when none does. certPolicy is that policy: its Job runs only
	// on the members it manages (certNodes), as certEnv says, and not at
	// all while certBreaches lists what in it the install's Job rules
	// refuse.
	certSpec     *gpuhealthv1alpha1.CliqueCertificationSpec
	certPolicy   string
	certNodes    map[string]bool
	certEnv      job.Env
	certBreaches []string
	// now is the reconcile's time.
	now time.Time
}

// fabricFault is one open fabric-scoped finding of a member.
type fabricFault struct {
	node, what string
	// byDriver: the driver's ComputeDomainCliques place the node in this
	// clique; otherwise only its own label does.
	byDriver bool
}

func (f fabricFault) String() string { return f.what + " on " + f.node }

// describe lists the faults for an Event.
func describe(faults []fabricFault) []string {
	out := make([]string, 0, len(faults))
	for _, f := range faults {
		out = append(out, f.String())
	}
	return out
}

// readClique reads the clique's nodes, the policies that manage them and
// their open fabric findings.
func (r *FabricReconciler) readClique(ctx context.Context, name string) (*clique, error) {
	c := &clique{name: name, eligible: map[string]bool{}, managed: map[string]bool{}, certNodes: map[string]bool{}, now: r.Clock.Now()}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingFields{gpuhealthv1alpha1.NodeCliqueField: name}); err != nil {
		return nil, fmt.Errorf("listing nodes of clique %s: %w", name, err)
	}
	c.nodes = nodes.Items
	if r.Cliques != nil {
		for _, m := range r.Cliques.CliqueMembers(name) {
			if slices.ContainsFunc(c.nodes, func(n corev1.Node) bool { return n.Name == m }) {
				continue
			}
			n := &corev1.Node{}
			if err := r.Client.Get(ctx, types.NamespacedName{Name: m}, n); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("getting node %s of clique %s: %w", m, name, err)
			}
			c.nodes = append(c.nodes, *n)
		}
	}
	policies := &gpuhealthv1alpha1.RemediationPolicyList{}
	if err := r.Client.List(ctx, policies); err != nil {
		return nil, fmt.Errorf("listing remediation policies: %w", err)
	}
	managing := map[string]string{}
	for i := range c.nodes {
		n := &c.nodes[i]
		driver := r.driverCliques(n.Name)
		if !memberOf(n.Labels[CliqueNodeLabel], driver, name) {
			continue
		}
		p := gpuhealthv1alpha1.ManagingPolicy(policies.Items, n.Labels)
		if p == nil {
			continue // not managed: its findings are not judged, its taints not ours
		}
		excluded, err := r.excluded(ctx, n.Name)
		if err != nil {
			return nil, err
		}
		if excluded {
			continue
		}
		cd := p.Spec.ComputeDomain
		c.eligible[n.Name] = !p.Spec.DryRun && (cd.TaintDegradedCliques == nil || *cd.TaintDegradedCliques)
		c.managed[n.Name] = true
		if c.certSpec == nil && c.eligible[n.Name] && cd.CliqueCertification != nil {
			c.certSpec, c.certPolicy = cd.CliqueCertification, p.Name
			c.certEnv = job.Env{ServiceAccount: r.JobRules.ServiceAccount, Quarantine: p.Spec.Quarantine.Taint}
			c.certBreaches = r.JobRules.Breaches(&p.Spec)
		}
		c.singleReport = c.singleReport || (c.eligible[n.Name] && cd.SingleReportTaintsClique)
		managing[n.Name] = p.Name
		evs := &gpuhealthv1alpha1.NodeHealthEventList{}
		if err := r.Client.List(ctx, evs, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: n.Name}); err != nil {
			return nil, fmt.Errorf("listing events of node %s: %w", n.Name, err)
		}
		for j := range evs.Items {
			ev := &evs.Items[j]
			if ev.Spec.IsIMEX() && n.Labels[NodeLabel] == "" && ev.Status.Phase != gpuhealthv1alpha1.EventActive {
				// IMEX runs only on ComputeDomain members. Without the node
				// label, wait for the node controller's judgement (which
				// ignores a non-member's stale report) before tainting a rack.
				continue
			}
			if IsFabricFault(ev) {
				c.faults = append(c.faults, fabricFault{node: n.Name, what: fmt.Sprintf("%s %s", ev.Spec.Check, ev.Spec.Code), byDriver: len(driver) > 0})
			}
		}
	}
	sort.Slice(c.faults, func(i, j int) bool { return c.faults[i].String() < c.faults[j].String() })
	for n, p := range managing {
		c.certNodes[n] = c.certSpec != nil && p == c.certPolicy
	}
	return c, nil
}

// certAction is what the clique's certification step does.
type certAction int

const (
	// certNone: no certification to start or stop (no operator namespace
	// for Jobs, or no node carries the clique's taint).
	certNone certAction = iota
	// certStopAll: no policy asks for the test (any more), so none may
	// hold GPUs.
	certStopAll
	// certStopEpisode: a fault is open again; the episode's tests stop.
	certStopEpisode
	// certRun: the faults resolved; the test decides when the taint goes.
	certRun
)

// cliquePlan is what planClique decides for a clique.
type cliquePlan struct {
	degraded bool
	// unconfirmed: faults are open but too few to taint (one member's
	// label-only report); the clique is looked at again later, when the
	// driver may list the node or a second member may report.
	unconfirmed bool
	// tainted are the nodes that carry this clique's taint now.
	tainted []*corev1.Node
	cert    certAction
}

// planClique decides whether the clique is degraded and what its
// certification step does. Pure.
func planClique(c *clique) cliquePlan {
	p := cliquePlan{degraded: confirmed(c.faults, c.singleReport)}
	p.unconfirmed = len(c.faults) > 0 && !p.degraded
	for i := range c.nodes {
		if c.nodes[i].Annotations[nodepkg.FabricAnnotation] == c.name {
			p.tainted = append(p.tainted, &c.nodes[i])
		}
	}
	switch {
	case len(p.tainted) == 0:
		p.cert = certNone
	case c.certSpec == nil:
		p.cert = certStopAll
	case p.degraded:
		p.cert = certStopEpisode
	default:
		p.cert = certRun
	}
	return p
}

// confirmed says whether the faults taint the clique: one a member the
// driver lists in it reports, or reports from two members known by their
// labels alone (one, when singleReport).
func confirmed(faults []fabricFault, singleReport bool) bool {
	reporters := map[string]bool{}
	for _, f := range faults {
		if f.byDriver {
			return true
		}
		reporters[f.node] = true
	}
	need := 2
	if singleReport {
		need = 1
	}
	return len(reporters) >= need
}

// unconfirmedRecheck is how soon a clique with an unconfirmed report is
// read again (the driver's listing has no watch here).
const unconfirmedRecheck = 30 * time.Second

// taintChange is one node's fabric taint to add or lift.
type taintChange struct {
	node *corev1.Node
	add  bool
}

// planTaints says which nodes gain or lose the clique's taint: while the
// clique is degraded every eligible member carries it; otherwise the taint
// gpuhealth added is lifted unless the certification holds it. Pure.
func planTaints(c *clique, degraded, hold bool) []taintChange {
	var out []taintChange
	for i := range c.nodes {
		n := &c.nodes[i]
		switch {
		case degraded && c.eligible[n.Name]: // eligible members only
			out = append(out, taintChange{node: n, add: true})
		case n.Annotations[nodepkg.FabricAnnotation] == c.name && !hold:
			out = append(out, taintChange{node: n})
		}
	}
	return out
}

// certificationStep carries out the plan's certification action. It says
// whether the taint stays after the faults resolved and when to look again.
func (r *FabricReconciler) certificationStep(ctx context.Context, c *clique, p cliquePlan) (hold bool, requeue time.Duration, err error) {
	if r.Namespace == "" {
		return false, 0, nil
	}
	switch p.cert {
	case certStopAll:
		return false, 0, r.stopCliqueCerts(ctx, c.name, p.tainted, nil)
	case certStopEpisode:
		return false, 0, r.stopCliqueCerts(ctx, c.name, p.tainted, &c.now)
	case certRun:
		if len(c.certBreaches) > 0 {
			// The policy's author chose a Job the install does not allow:
			// none runs, and the taint stays until the policy is fixed
			// (its change wakes every clique).
			log.FromContext(ctx).V(1).Info("Not running clique certification: the policy breaks the install's Job rules",
				"RemediationPolicy", c.certPolicy, "breaches", gpuhealthv1alpha1.FirstN(c.certBreaches, 3, "; "))
			return true, 0, nil
		}
		// A policy's Job runs only on nodes that policy manages.
		healthy, err := r.healthyNodes(ctx, c.nodes, c.name, c.certNodes)
		if err != nil {
			return false, 0, err
		}
		lift, rq, err := r.certifyClique(ctx, c.name, c.certSpec, c.nodes, p.tainted, healthy, c.certEnv)
		return !lift, rq, err
	}
	return false, 0, nil
}

// changeTaints adds or lifts the planned taints (each idempotent) and
// announces each change once it went through.
func (r *FabricReconciler) changeTaints(ctx context.Context, c *clique, changes []taintChange) error {
	logger := log.FromContext(ctx)
	var errs []error
	for _, ch := range changes {
		n := ch.node
		var changed bool
		var err error
		if ch.add {
			logger.V(1).Info("Tainting node fabric-degraded", "Node", klog.KObj(n))
			if changed, err = nodepkg.TaintFabric(ctx, r.Client, n, c.name, c.now); changed {
				fabricTaintChanges.WithLabelValues(actionAdd).Inc()
				r.Recorder.Eventf(n, nil, corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonFabricDegraded, "Taint",
					"NVLink clique %s has a fabric fault (%s); no new ComputeDomain lands here until it resolves", c.name, gpuhealthv1alpha1.FirstN(describe(c.faults), 3, "; "))
			}
		} else if changed, err = nodepkg.UntaintFabric(ctx, r.Client, n); changed {
			fabricTaintChanges.WithLabelValues(actionRemove).Inc()
			r.Recorder.Eventf(n, nil, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonFabricRecovered, "Untaint",
				"NVLink clique %s: the fabric-degraded taint gpuhealth added is lifted", c.name)
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		if changed {
			logger.Info("Changed fabric-degraded taint", "Node", klog.KObj(n), "tainted", ch.add)
		}
	}
	return errors.Join(errs...)
}

func (r *FabricReconciler) excluded(ctx context.Context, node string) (bool, error) {
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: node}, nh); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("getting nodehealth %s: %w", node, err)
	}
	return nh.Spec.Exclude, nil
}

func (r *FabricReconciler) setDegraded(clique string, degraded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.degraded == nil {
		r.degraded = map[string]bool{}
	}
	if degraded {
		r.degraded[clique] = true
	} else {
		delete(r.degraded, clique)
	}
	degradedCliques.Set(float64(len(r.degraded)))
}

// conflicts says whether err is optimistic-lock conflicts only.
func conflicts(err error) bool {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return apierrors.IsConflict(err)
	}
	for _, e := range joined.Unwrap() {
		if !apierrors.IsConflict(e) {
			return false
		}
	}
	return true
}
