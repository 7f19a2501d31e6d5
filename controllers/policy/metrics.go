package policy

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

var (
	budgetLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_policy_budget_limit_nodes",
		Help: "The policy's maxUnavailable resolved against its managed nodes.",
	}, []string{"policy"})
	budgetUnavailable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_policy_budget_unavailable_nodes",
		Help: "Managed nodes Draining or Recertifying, which use the policy's maxUnavailable budget.",
	}, []string{"policy"})
	budgetWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_policy_budget_waiting_nodes",
		Help: "Quarantined managed nodes waiting for the policy's maxUnavailable budget.",
	}, []string{"policy"})
)

func init() {
	metrics.Registry.MustRegister(budgetLimit, budgetUnavailable, budgetWaiting)
}

func setBudgetMetrics(p *gpuhealthv1alpha1.RemediationPolicy) {
	b := p.Status.Budget
	budgetLimit.WithLabelValues(p.Name).Set(float64(b.Limit))
	budgetUnavailable.WithLabelValues(p.Name).Set(float64(b.Unavailable))
	budgetWaiting.WithLabelValues(p.Name).Set(float64(b.Waiting))
}

func deleteBudgetMetrics(policy string) {
	budgetLimit.DeleteLabelValues(policy)
	budgetUnavailable.DeleteLabelValues(policy)
	budgetWaiting.DeleteLabelValues(policy)
}
