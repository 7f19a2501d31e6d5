package nodehealth

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
)

// networkView is the network circuit breaker of one node's group: the
// breaker's answer to one more quarantine for NIC findings there, and a
// reset token it has not honoured (actBeforeDeciding resets it).
type networkView struct {
	breakerView
	// key is the group's breaker in the shared Breaker; group names the
	// group for messages ("leaf=l12", or "the policy's nodes").
	key, group string
}

// networkKeyPrefix is the start of every network breaker name of a policy.
func networkKeyPrefix(p *gpuhealthv1alpha1.RemediationPolicy) string { return p.Name + "/network/" }

// networkGroup is the group a node is counted in: the first of the policy's
// topology labels it carries, as "label=value"; "" when it carries none.
func networkGroup(spec *gpuhealthv1alpha1.NetworkSpec, labels map[string]string) string {
	for _, k := range spec.TopologyLabels {
		if v, ok := labels[k]; ok {
			return k + "=" + v
		}
	}
	return ""
}

// peekNetworkBreaker says whether the network breaker of the node's group
// would let one more node into quarantine for NIC findings, recording
// nothing (reserveNetwork counts it, as reserveBreaker does the policy's).
// A new leader seeds a group's breaker from the NodeHealths: the nodes of
// the group that entered quarantine for a fault within the window and whose
// active quarantining findings are all NIC findings.
func (r *Reconciler) peekNetworkBreaker(ctx context.Context, o *observation, managed map[string]map[string]string) (*networkView, error) {
	spec := &o.policy.Spec.Network
	if !breaker.NetworkEnabled(spec.CircuitBreaker) {
		return &networkView{breakerView: breakerView{allowed: true, message: "disabled"}}, nil
	}
	group := networkGroup(spec, o.node.Labels)
	members := map[string]bool{}
	for name, labels := range managed {
		if networkGroup(spec, labels) == group {
			members[name] = true
		}
	}
	settings, err := breaker.NetworkSettingsFor(spec.CircuitBreaker, len(members))
	if err != nil {
		return nil, err
	}
	key := networkKeyPrefix(o.policy) + group
	// The policy's reset annotation resets each group's breaker once; a
	// group seeded while a token is there takes it as honoured (it was
	// not open when the human asked).
	reset := o.policy.Annotations[gpuhealthv1alpha1.ResetCircuitBreakerAnnotation]
	if !r.Breaker.Seeded(key) {
		list := &gpuhealthv1alpha1.NodeHealthList{}
		if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing nodehealths: %w", err)
		}
		r.Breaker.Seed(key, nicQuarantineTimes(list.Items, members, o.now.Time, settings.Window), reset, time.Time{})
	}
	if reset == r.Breaker.LastReset(key) {
		reset = ""
	}
	allowed, st := r.Breaker.Check(key, settings, o.now.Time)
	name := "the policy's nodes without a topology label"
	if group != "" {
		name = group
	}
	return &networkView{
		breakerView: breakerView{allowed: allowed, message: st.Message, settings: settings, enabled: true, reset: reset},
		key:         key, group: name,
	}, nil
}

// nicQuarantineTimes are when the members entered quarantine for a fault
// within window, for those whose quarantining findings are all NIC
// findings.
func nicQuarantineTimes(nhs []gpuhealthv1alpha1.NodeHealth, members map[string]bool, now time.Time, window time.Duration) []time.Time {
	var times []time.Time
	for i := range nhs {
		nh := &nhs[i]
		if !members[nh.Name] || !nicOnlyRefs(nh.Status.ActiveEvents) {
			continue
		}
		times = append(times, breaker.QuarantineTimes(nhs[i:i+1], now, window)...)
	}
	return times
}

// nicOnlyRefs says whether the quarantining findings among refs are all
// NIC findings (and there is one).
func nicOnlyRefs(refs []gpuhealthv1alpha1.FindingRef) bool {
	n := 0
	for _, f := range refs {
		if f.Verdict != gpuhealthv1alpha1.VerdictQuarantine {
			continue
		}
		if f.Check != gpuhealthv1alpha1.CheckNIC {
			return false
		}
		n++
	}
	return n > 0
}

// nicOnly says whether every finding that counts against the node is a NIC
// finding: the quarantines the network breaker holds.
func nicOnly(counting []judgement) bool {
	for _, j := range counting {
		if j.event.Spec.Check != gpuhealthv1alpha1.CheckNIC {
			return false
		}
	}
	return len(counting) > 0
}
