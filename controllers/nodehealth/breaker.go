package nodehealth

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
)

const (
	defaultBreakerWindow = 10 * time.Minute
	// breakerRecheck is how often a node held back by an open breaker
	// looks again (a reset annotation enqueues it sooner).
	breakerRecheck = time.Minute
)

// allowQuarantine asks the circuit breaker whether this node may enter
// quarantine now. When it may not, the node's status says why and when it
// looks again. Only new quarantines pass through here; nothing that returns
// a node does.
func (r *Reconciler) allowQuarantine(ctx context.Context, s *scope) (bool, error) {
	cb := s.policy.Spec.CircuitBreaker
	if cb.Enabled != nil && !*cb.Enabled {
		return true, nil
	}
	managed, err := r.managedNodes(ctx, s.policy)
	if err != nil {
		return false, err
	}
	limit, err := budget.Limit(cb.Threshold, len(managed), intstr.FromString("10%"))
	if err != nil {
		return false, err
	}
	settings := breaker.Settings{Limit: limit, Window: cb.Window.Get(defaultBreakerWindow), CoolDown: cb.CoolDown.Get(breaker.DefaultCoolDown)}
	key := s.policy.Name
	if !r.Breaker.Seeded(key) {
		if err := r.seedBreaker(ctx, s, settings.Window); err != nil {
			return false, err
		}
	}
	if token := s.policy.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]; token != "" && r.Breaker.Reset(key, token, s.now.Time) {
		r.Recorder.Eventf(s.policy, nil, corev1.EventTypeNormal, ReasonCircuitBreakerOpen, "Reset", "circuit breaker reset by annotation %s=%s", gpuhealthv1alpha1.ResetCircuitBreakerAnnotation, token)
	}
	ok, st := r.Breaker.Allow(key, settings, s.now.Time)
	if err := r.mirrorBreaker(ctx, s.policy, st); err != nil {
		return false, err
	}
	if !ok {
		setStatusReason(s, ReasonCircuitBreakerOpen, "not quarantined: circuit breaker "+st.Message+"; findings: "+describe(s.counting()))
		s.wait(breakerRecheck)
	}
	return ok, nil
}

// seedBreaker loads the policy's recent quarantines from NodeHealth
// histories, and an open breaker from the policy's status, so a new leader
// remembers a storm its predecessor saw.
func (r *Reconciler) seedBreaker(ctx context.Context, s *scope, window time.Duration) error {
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing nodehealths: %w", err)
	}
	var times []time.Time
	for i := range list.Items {
		for _, t := range list.Items[i].Status.History {
			if t.To == gpuhealthv1alpha1.PhaseQuarantined && t.From == gpuhealthv1alpha1.PhaseHealthy &&
				t.Reason == ReasonFault && s.now.Sub(t.Time.Time) < window {
				times = append(times, t.Time.Time)
			}
		}
	}
	lastReset, openSince := "", time.Time{}
	if st := s.policy.Status.CircuitBreaker; st != nil {
		lastReset = st.LastReset
		if st.State == gpuhealthv1alpha1.BreakerOpen && st.Since != nil {
			openSince = st.Since.Time
		}
	}
	r.Breaker.Seed(s.policy.Name, times, lastReset, openSince)
	return nil
}

// mirrorBreaker writes the breaker's state to the policy's status when it
// changed, with an Event when it opens or closes.
func (r *Reconciler) mirrorBreaker(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy, st breaker.State) error {
	want := gpuhealthv1alpha1.BreakerClosed
	if st.Open {
		want = gpuhealthv1alpha1.BreakerOpen
	}
	lastReset := p.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]
	cur := p.Status.CircuitBreaker
	if cur != nil && cur.State == want && cur.LastReset == lastReset && (want == gpuhealthv1alpha1.BreakerClosed || cur.Since != nil && cur.Since.Time.Equal(st.Since)) {
		return nil
	}
	patch := client.MergeFrom(p.DeepCopy())
	since := metav1.NewTime(st.Since)
	if st.Since.IsZero() {
		since = metav1.NewTime(r.Clock.Now())
	}
	p.Status.CircuitBreaker = &gpuhealthv1alpha1.CircuitBreakerStatus{
		State: want, Since: &since, QuarantinesInWindow: int32(st.InWindow), Message: truncate(st.Message, 512), LastReset: lastReset,
	}
	if err := r.Client.Status().Patch(ctx, p, patch); err != nil {
		return fmt.Errorf("patching status of remediationpolicy %s: %w", p.Name, err)
	}
	if cur == nil || cur.State != want {
		eventType := corev1.EventTypeNormal
		if st.Open {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(p, nil, eventType, ReasonCircuitBreakerOpen, "CircuitBreaker", "circuit breaker %s", st.Message)
	}
	return nil
}
