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
	breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_policy_circuit_breaker_open",
		Help: "1 while the policy's circuit breaker is open and stops new quarantines, as its status says; 0 while closed.",
	}, []string{"policy"})
)

func init() {
	metrics.Registry.MustRegister(budgetLimit, budgetUnavailable, budgetWaiting, breakerOpen)
}

func setBudgetMetrics(p *gpuhealthv1alpha1.RemediationPolicy) {
	b := p.Status.Budget
	budgetLimit.WithLabelValues(p.Name).Set(float64(b.Limit))
	budgetUnavailable.WithLabelValues(p.Name).Set(float64(b.Unavailable))
	budgetWaiting.WithLabelValues(p.Name).Set(float64(b.Waiting))
}

// setBreakerMetric mirrors the breaker state the nodehealth reconciler
// wrote to the policy's status (no status yet: closed).
func setBreakerMetric(p *gpuhealthv1alpha1.RemediationPolicy) {
	v := 0.0
	if cb := p.Status.CircuitBreaker; cb != nil && cb.State == gpuhealthv1alpha1.BreakerOpen {
		v = 1
	}
	breakerOpen.WithLabelValues(p.Name).Set(v)
}

func deletePolicyMetrics(policy string) {
	breakerOpen.DeleteLabelValues(policy)
	deleteBudgetMetrics(policy)
}

func deleteBudgetMetrics(policy string) {
	budgetLimit.DeleteLabelValues(policy)
	budgetUnavailable.DeleteLabelValues(policy)
	budgetWaiting.DeleteLabelValues(policy)
}
