package nodehealth

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
)

// domainBudgets returns the per-ComputeDomain and per-clique decisions for
// the node. nhs are all NodeHealths (read by the caller through the reader
// the decision needs); nodes are the managed nodes' labels from the cache.
func (r *Reconciler) domainBudgets(o *observation, nhs []gpuhealthv1alpha1.NodeHealth, nodes map[string]map[string]string) ([]budget.Decision, error) {
	var out []budget.Decision
	var errs []error
	// The domain's budget applies while the node is a member: a node whose
	// job ended while it was quarantined holds no domain up.
	if uid := o.cd.uid; uid != "" && o.cd.member() {
		members := map[string]bool{o.node.Name: true}
		for name, lbls := range nodes {
			if lbls[computedomain.NodeLabel] == string(uid) {
				members[name] = true
			}
		}
		if r.ComputeDomains != nil {
			for _, n := range r.ComputeDomains.Members(uid) {
				members[n] = true
			}
		}
		consuming := 0
		for i := range nhs {
			nh := &nhs[i]
			if nh.Name == o.nh.Name || nh.Status.ComputeDomain == nil || nh.Status.ComputeDomain.UID != string(uid) {
				continue
			}
			if o.policy.Spec.ConsumesBudget(nh.Status.Phase) {
				members[nh.Name] = true
				consuming++
			}
		}
		limit, err := budget.Limit(o.policy.Spec.Budgets.MaxUnavailablePerComputeDomain, len(members), intstr.FromInt32(1))
		errs = append(errs, err)
		out = append(out, budget.Decision{Name: string(gpuhealthv1alpha1.BudgetPerComputeDomain), Limit: limit,
			Consuming: consuming, Total: len(members), Scope: "ComputeDomain " + domainName(o.cd, o.nh.Status.ComputeDomain, uid)})
	}
	if clique := cliqueOf(o.node.Labels, o.nh.Status.ComputeDomain); clique != "" {
		total, consuming := 0, 0
		for name, lbls := range nodes {
			if lbls[computedomain.CliqueNodeLabel] == clique || name == o.node.Name {
				total++
			}
		}
		for i := range nhs {
			nh := &nhs[i]
			lbls, managed := nodes[nh.Name]
			if nh.Name == o.nh.Name || !managed || !o.policy.Spec.ConsumesBudget(nh.Status.Phase) {
				continue
			}
			if cliqueOf(lbls, nh.Status.ComputeDomain) == clique {
				consuming++
			}
		}
		limit, err := budget.Limit(o.policy.Spec.Budgets.MaxUnavailablePerClique, total, intstr.FromInt32(1))
		errs = append(errs, err)
		out = append(out, budget.Decision{Name: string(gpuhealthv1alpha1.BudgetPerClique), Limit: limit,
			Consuming: consuming, Total: total, Scope: "clique " + clique})
	}
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// cliqueOf is the node's NVLink clique: its GPU Feature Discovery label,
// else the clique its ComputeDomain membership names.
func cliqueOf(lbls map[string]string, cd *gpuhealthv1alpha1.ComputeDomainMembership) string {
	if c := lbls[computedomain.CliqueNodeLabel]; c != "" {
		return c
	}
	if cd != nil {
		return cd.CliqueID
	}
	return ""
}

// countBudgets counts the nodes draining or recertifying against every
// budget that applies to the node: maxUnavailable over the policy's managed
// nodes, maxUnavailablePerComputeDomain over its domain's members and
// maxUnavailablePerClique over its NVLink clique. The NodeHealths are read
// from the cache's budget snapshot, or from the apiserver when fromAPIServer.
// A first count from the cache turns most waiting nodes away cheaply (a
// cache that lags only over-counts nodes that have just returned, so a "no
// room" from it is safe); a drain is started only on a count from the
// apiserver, made under the admission lock (see admit).
func (r *Reconciler) countBudgets(ctx context.Context, o *observation, fromAPIServer bool) *budgetCount {
	out := &budgetCount{fromAPIServer: fromAPIServer}
	managed, nhs, err := r.snapshot(ctx, o.policy)
	if err != nil {
		out.err = err
		return out
	}
	if fromAPIServer {
		nhs, out.fromRecentList, err = r.liveNodeHealths(ctx, o)
		if err != nil {
			out.err = err
			return out
		}
	}
	consuming := 0
	for i := range nhs {
		nh := &nhs[i]
		if _, ok := managed[nh.Name]; ok && nh.Name != o.nh.Name && o.policy.Spec.ConsumesBudget(nh.Status.Phase) {
			consuming++
		}
	}
	limit, err := budget.Limit(o.policy.Spec.Budgets.MaxUnavailable, len(managed), budget.DefaultMaxUnavailable)
	out.decisions = []budget.Decision{{Name: string(gpuhealthv1alpha1.BudgetMaxUnavailable), Limit: limit, Consuming: consuming, Total: len(managed)}}
	if err != nil {
		out.err = err
		return out
	}
	domain, err := r.domainBudgets(o, nhs, managed)
	out.decisions = append(out.decisions, domain...)
	if err != nil {
		out.err = err
		return out
	}
	for i, d := range out.decisions {
		if d.Allowed() == 0 {
			out.blocked = append(out.blocked, i)
		}
	}
	return out
}

// managedNodes returns the labels of the nodes the policy selects, by
// name, read from the cache's store in place (read-only), or through a
// List where the reconciler has no cache (tests).
func (r *Reconciler) managedNodes(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (map[string]map[string]string, error) {
	sel, err := p.Selector()
	if err != nil {
		// A selector that does not compile selects no node (see Selects).
		// Not labels.Nothing(): a client that is not the cache sends it
		// as the empty selector, which selects every node.
		return map[string]map[string]string{}, nil //nolint:nilerr // a bad selector selects nothing, by design
	}
	managed := map[string]map[string]string{}
	// In place in the cache's store: a List copies every Node.
	err = index.Each(ctx, r.cache, r.Client, &corev1.Node{}, &corev1.NodeList{}, func(o client.Object) {
		if sel.Matches(labels.Set(o.GetLabels())) {
			managed[o.GetName()] = o.GetLabels()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return managed, nil
}

// breakerRecheck is how often a node held back by an open breaker looks
// again (a reset annotation enqueues it sooner).
const breakerRecheck = time.Minute

// peekBreaker says whether the policy's circuit breaker would let one more
// node into quarantine now, recording no quarantine (the first node turned
// away opens it): the quarantine is counted by reserveBreaker, and kept
// only once its fence (or, without one, its status) is written (see
// admission). A reset token on the policy that the breaker has not honoured
// yet is carried in the view: the pass resets the breaker with it before
// deciding (actBeforeDeciding), so the nodes it woke see it closed. The
// policy status controller mirrors the state into the policy's status.
func (r *Reconciler) peekBreaker(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy, managed map[string]map[string]string, now time.Time) (*breakerView, error) {
	if !breaker.Enabled(p.Spec.CircuitBreaker) {
		return &breakerView{allowed: true, message: "disabled"}, nil
	}
	settings, err := breaker.SettingsFor(p.Spec.CircuitBreaker, len(managed))
	if err != nil {
		return nil, err
	}
	if !r.Breaker.Seeded(p.Name) {
		list := &gpuhealthv1alpha1.NodeHealthList{}
		if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing nodehealths: %w", err)
		}
		r.Breaker.SeedFromStatus(p, list.Items, now, settings.Window)
	}
	reset := p.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]
	if reset == r.Breaker.LastReset(p.Name) {
		reset = ""
	}
	allowed, st := r.Breaker.Check(p.Name, settings, now)
	return &breakerView{allowed: allowed, message: st.Message, settings: settings, enabled: true, reset: reset}, nil
}
