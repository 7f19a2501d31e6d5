package nodehealth

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
)

// countBudgets counts the nodes draining or recertifying against every
// budget that applies to the node: maxUnavailable over the policy's managed
// nodes, maxUnavailablePerComputeDomain over its domain's members and
// maxUnavailablePerClique over its NVLink clique. The NodeHealths are read
// from the cache's fleet snapshot, or from the apiserver when fromAPIServer.
// A first count from the cache turns most waiting nodes away cheaply (a
// cache that lags only over-counts nodes that have just returned, so a "no
// room" from it is safe); a drain is started only on a count from the
// apiserver, made under budgetMu (see Reconcile).
func (r *Reconciler) countBudgets(ctx context.Context, o *observation, fromAPIServer bool) *budgetCount {
	out := &budgetCount{fromAPIServer: fromAPIServer}
	managed, nhs, err := r.fleet(ctx, o.policy)
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

// recentListTTL is how long a list of the NodeHealths from the apiserver
// serves the budget counts made under budgetMu after it.
const recentListTTL = 2 * time.Second

// recentList is the NodeHealths as a count under budgetMu last listed them
// from the apiserver, with the phases this process wrote since under the
// lock. Within recentListTTL a count that would start a drain reuses it
// instead of listing every NodeHealth again, so that twenty nodes admitted
// one after another cost one list, not twenty. It can only over-count:
// the one way into Draining is a write under the lock (which it records),
// and a node that left a budget-consuming phase since still counts. A
// refusal is never decided on it (Reconcile lists again), and a policy
// that counts certification against its budgets always lists, since a new
// node enters Certifying without the lock. Guarded by budgetMu.
type recentList struct {
	at    time.Time
	items []gpuhealthv1alpha1.NodeHealth
	wrote map[string]gpuhealthv1alpha1.NodeHealthPhase
}

// liveNodeHealths returns the NodeHealths for a count under budgetMu: the
// recent list with this process's writes laid over it where it may serve,
// else a fresh list from the apiserver (which becomes the recent list). It
// says which.
func (r *Reconciler) liveNodeHealths(ctx context.Context, o *observation) ([]gpuhealthv1alpha1.NodeHealth, bool, error) {
	if l := r.recent; l != nil && !o.policy.Spec.Certification.CountAgainstBudget &&
		!o.now.Time.Before(l.at) && o.now.Sub(l.at) < recentListTTL {
		seen := make(map[string]bool, len(l.wrote))
		for i := range l.items {
			if ph, ok := l.wrote[l.items[i].Name]; ok {
				l.items[i].Status.Phase = ph
				seen[l.items[i].Name] = true
			}
		}
		for name, ph := range l.wrote {
			if !seen[name] {
				l.items = append(l.items, gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: gpuhealthv1alpha1.NodeHealthStatus{Phase: ph}})
			}
		}
		return l.items, true, nil
	}
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.APIReader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		r.recent = nil
		return nil, false, fmt.Errorf("listing nodehealths: %w", err)
	}
	r.recent = &recentList{at: o.now.Time, items: list.Items, wrote: map[string]gpuhealthv1alpha1.NodeHealthPhase{}}
	return list.Items, false, nil
}

// wroteUnderBudgetLock records in the recent list the phase a pass holding
// budgetMu wrote.
func (r *Reconciler) wroteUnderBudgetLock(node string, phase gpuhealthv1alpha1.NodeHealthPhase) {
	if r.recent != nil {
		r.recent.wrote[node] = phase
	}
}

// managedNodes returns the labels of the nodes the policy selects, by
// name, read from the cache without copies (read-only).
func (r *Reconciler) managedNodes(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (map[string]map[string]string, error) {
	// The selector is compiled once and applied by the cache, so only the
	// selected nodes are copied into the list.
	sel, err := p.Selector()
	if err != nil {
		return map[string]map[string]string{}, nil // selects no node (see Selects)
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	managed := make(map[string]map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		managed[nodes.Items[i].Name] = nodes.Items[i].Labels
	}
	return managed, nil
}
