package nodehealth

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
)

// breakerRecheck is how often a node held back by an open breaker looks
// again (a reset annotation enqueues it sooner).
const breakerRecheck = time.Minute

// peekBreaker says whether the policy's circuit breaker would let one more
// node into quarantine now, recording no quarantine (the first node turned
// away opens it): the quarantine is counted by reserveBreaker, and kept
// only once its fence (or, without one, its status) is written. A new reset token on the policy resets the breaker here, so
// the nodes it woke see it closed. The policy status controller mirrors the
// state into the policy's status.
func (r *Reconciler) peekBreaker(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy, now time.Time) (*breakerView, error) {
	if !breaker.Enabled(p.Spec.CircuitBreaker) {
		return &breakerView{allowed: true, message: "disabled"}, nil
	}
	settings, err := r.breakerSettings(ctx, p)
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
	if token := p.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]; token != "" && r.Breaker.Reset(p.Name, token, now) {
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonCircuitBreakerOpen, "Reset",
			"circuit breaker reset by annotation %s=%s", gpuhealthv1alpha1.ResetCircuitBreakerAnnotation, token)
	}
	allowed, st := r.Breaker.Check(p.Name, settings, now)
	return &breakerView{allowed: allowed, message: st.Message, settings: settings, enabled: true}, nil
}

// reserveBreaker counts one quarantine of the policy at now, with the
// settings the peek resolved. When the breaker refuses (another node took
// the last slot since the peek), the view says why.
func (r *Reconciler) reserveBreaker(p *gpuhealthv1alpha1.RemediationPolicy, peeked *breakerView, now time.Time) *breakerView {
	if peeked == nil || !peeked.enabled {
		return &breakerView{allowed: true, message: "disabled"}
	}
	ok, st := r.Breaker.Allow(p.Name, peeked.settings, now)
	return &breakerView{allowed: ok, message: st.Message, settings: peeked.settings, enabled: true}
}

// undoBreaker takes back a quarantine counted at now whose fence failed.
func (r *Reconciler) undoBreaker(p *gpuhealthv1alpha1.RemediationPolicy, now time.Time) {
	r.Breaker.Undo(p.Name, now)
}

func (r *Reconciler) breakerSettings(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (breaker.Settings, error) {
	managed, err := r.managedNodes(ctx, p)
	if err != nil {
		return breaker.Settings{}, err
	}
	return breaker.SettingsFor(p.Spec.CircuitBreaker, len(managed))
}
