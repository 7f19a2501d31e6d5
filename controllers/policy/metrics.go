package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
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
		Help: "1 while the policy's circuit breaker is open and stops new quarantines: its status says Open and its cool-down is not over; 0 otherwise.",
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

// breakerOpenUntil says whether the policy's breaker stops quarantines at
// now, and until when. The nodehealth reconciler writes the breaker's
// status only when a node asks to be quarantined, so a status that says
// Open is stale once the cool-down is over, the breaker is disabled or a
// reset was asked for and no node asked since: the breaker lets the next
// quarantine through, and an alert on it must not go on firing.
func breakerOpenUntil(p *gpuhealthv1alpha1.RemediationPolicy, now time.Time) (bool, time.Time) {
	cb := p.Status.CircuitBreaker
	if cb == nil || cb.State != gpuhealthv1alpha1.BreakerOpen || cb.Since == nil {
		return false, time.Time{}
	}
	spec := p.Spec.CircuitBreaker
	if !breaker.Enabled(spec) {
		return false, time.Time{}
	}
	if token := p.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]; token != "" && token != cb.LastReset {
		return false, time.Time{}
	}
	until := cb.Since.Add(spec.CoolDown.Get(breaker.DefaultCoolDown))
	return now.Before(until), until
}

// setBreakerMetric publishes whether the breaker stops quarantines now and
// returns when to look again (zero: no need).
func setBreakerMetric(p *gpuhealthv1alpha1.RemediationPolicy, now time.Time) time.Duration {
	open, until := breakerOpenUntil(p, now)
	v := 0.0
	if open {
		v = 1
	}
	breakerOpen.WithLabelValues(p.Name).Set(v)
	if !open {
		return 0
	}
	return until.Sub(now)
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
