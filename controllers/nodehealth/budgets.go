package nodehealth

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
		list := &gpuhealthv1alpha1.NodeHealthList{}
		if err := r.APIReader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			out.err = fmt.Errorf("listing nodehealths: %w", err)
			return out
		}
		nhs = list.Items
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
