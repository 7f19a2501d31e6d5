package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// admission serialises the decisions that take a shared, counted resource:
// one more quarantine from the circuit breaker, one more node out from the
// disruption budgets. observe counts both from the cache, cheaply and
// without taking anything; decide asks for what its plan needs
// (planAsks); admit takes it for real — the breaker counts the quarantine,
// and a drain is counted again from the apiserver under a lock held until
// the status is written — and decides again on what it found. A pass holds
// what it was granted in a ticket, which gives back what the pass did not
// keep when the pass ends.
type admission struct {
	// mu serialises budget decisions within this process (the operator is
	// leader-elected, so this process is the only one deciding).
	mu sync.Mutex
	// recent is the last count's list; guarded by mu.
	recent *recentList
}

// ticket is one pass's hold on what admit granted.
type ticket struct {
	r      *Reconciler
	policy string
	at     time.Time
	// reserved: the breaker counted a quarantine of this pass at at.
	reserved bool
	// locked: the pass holds admission.mu.
	locked bool
	// kept: the quarantine became real (its fence or its status was
	// written), so release does not take it back.
	kept bool
	// devices are the GPUs the device breaker (deviceKey) counted at at.
	devices   int
	deviceKey string
	// networkKey is the network breaker that counted this pass's
	// quarantine at at; "" when none did.
	networkKey string
}

// admit grants what the plan asks for and returns the plan to carry out,
// decided again where the grant changed what was observed. A nil plan means
// another node's pass holds the budget lock: this pass hands its worker back
// and comes again shortly (budgetLockRetry), so that twenty nodes admitted
// one after another do not hold every worker while other nodes' drains wait
// for one. The caller releases the ticket in every case.
func (r *Reconciler) admit(ctx context.Context, o *observation, p *plan) (*ticket, *plan) {
	t := &ticket{r: r, policy: o.policy.Name, at: o.now.Time}
	if p.reserveNetwork && o.network != nil {
		// Counted in the node's group first, given back by release when
		// the quarantine does not become real (also when the policy's
		// breaker then refuses it).
		ok, st := r.Breaker.Allow(o.network.key, o.network.settings, o.now.Time)
		if ok {
			t.networkKey = o.network.key
		} else {
			o.network.allowed, o.network.message = false, st.Message
			p = decide(o)
		}
	}
	if p.reserveBreaker {
		// Counted now, given back by release when the quarantine does not
		// become real; a refusal (another node took the last slot since
		// the peek) is decided anew.
		view := r.reserveBreaker(o.policy, o.breaker, o.now.Time)
		t.reserved = view.allowed && view.enabled
		o.breaker = view
		if !view.allowed {
			// No quarantine this pass: the group's slot goes back now
			// (the pass still writes the node's status, which keeps
			// what the ticket holds).
			if t.networkKey != "" {
				r.Breaker.Undo(t.networkKey, t.at)
				t.networkKey = ""
			}
			p = decide(o)
		}
	}
	if p.reserveDevices > 0 && o.devices != nil {
		// GPUs taken out alone are counted again from the apiserver, and
		// written, inside the lock, as a drain is: two nodes never take the
		// last GPU of maxUnavailableDevices together.
		if !r.admission.mu.TryLock() {
			return t, nil
		}
		t.locked = true
		o.devices.budget = r.liveDeviceBudget(ctx, o)
		p = decide(o)
	}
	if p.reserveDevices > 0 && o.devices != nil && o.devices.breaker != nil && o.devices.breaker.enabled {
		// The device breaker counts GPUs, each one taken back by release
		// unless the status that takes it out is written.
		key := deviceBreakerKey(o.policy)
		for range p.reserveDevices {
			ok, st := r.Breaker.Allow(key, o.devices.breaker.settings, o.now.Time)
			if !ok {
				o.devices.breaker.allowed, o.devices.breaker.message = false, st.Message
				break
			}
			t.devices++
		}
		if t.devices < p.reserveDevices {
			for range t.devices {
				r.Breaker.Undo(key, o.now.Time)
			}
			t.devices = 0
			p = decide(o)
		}
		t.deviceKey = key
	}
	if !p.confirmBudget {
		return t, p
	}
	// A drain decided from the cache's count is counted again from the
	// apiserver, and written, inside one lock, so two nodes never take the
	// last slot together.
	if !t.locked {
		if !r.admission.mu.TryLock() {
			return t, nil
		}
		t.locked = true
	}
	o.budgets = r.countBudgets(ctx, o, true)
	if o.budgets.fromRecentList && (o.budgets.err != nil || len(o.budgets.blocked) > 0) {
		// A refusal is decided on a fresh list only.
		r.admission.recent = nil
		o.budgets = r.countBudgets(ctx, o, true)
	}
	return t, decide(o)
}

// keep says the pass's quarantine became real: its fence went through.
func (t *ticket) keep() { t.kept = true }

// wrote says the pass wrote the node's status: the quarantine is kept,
// and a write under the budget lock goes into the recent list with what
// the counts read from it (the phase and the ComputeDomain membership).
func (t *ticket) wrote(node string, status *gpuhealthv1alpha1.NodeHealthStatus) {
	t.kept = true
	if l := t.r.admission.recent; t.locked && l != nil {
		l.wrote[node] = counted{phase: status.Phase, computeDomain: status.ComputeDomain.DeepCopy(), devices: slices.Clone(status.Devices)}
	}
}

// release gives back the quarantine the pass did not keep and the budget
// lock.
func (t *ticket) release() {
	if t.reserved && !t.kept {
		t.r.Breaker.Undo(t.policy, t.at)
	}
	if t.networkKey != "" && !t.kept {
		t.r.Breaker.Undo(t.networkKey, t.at)
	}
	if !t.kept {
		for range t.devices {
			t.r.Breaker.Undo(t.deviceKey, t.at)
		}
	}
	if t.locked {
		t.r.admission.mu.Unlock()
	}
}

// recentListTTL is how long a list of the NodeHealths from the apiserver
// serves the budget counts made under admission.mu after it, at least.
// A list that took longer serves longer (recentListServes): in a fleet of
// thousands a list takes seconds, and with a fixed 2 s every admission of
// a wave listed again — 0.5 s a node at 1,000 nodes, 2 s at 5,000, so a
// 100-node wave waited 200 s for its drains to start one by one.
const recentListTTL = 2 * time.Second

// recentListMaxTTL bounds how long any list serves.
const recentListMaxTTL = 30 * time.Second

// recentListServes is how long a list that took took to read serves:
// recentListTTL plus four times its cost, so that at most about a fifth of
// the lock's time goes to listing whatever the fleet's size, bounded by
// recentListMaxTTL.
func recentListServes(took time.Duration) time.Duration {
	return min(recentListTTL+4*max(took, 0), recentListMaxTTL)
}

// recentList is the NodeHealths as a count under admission.mu last listed them
// from the apiserver, with what this process wrote since under the lock.
// Within recentListServes of the list a count that would start a drain
// reuses it instead of listing every NodeHealth again, so that twenty nodes
// admitted one after another cost one list, not twenty. It can only over-count: the one
// way into Draining is a write under the lock, which it records with
// everything a count reads (the phase, and the ComputeDomain membership: a
// node whose membership was first written by that same write would
// otherwise count against no domain's budget); a node that left a
// budget-consuming phase since still counts. A refusal is never decided on
// it (Reconcile lists again), and a policy that counts certification
// against its budgets always lists, since a new node enters Certifying
// without the lock. Guarded by admission.mu.
type recentList struct {
	at time.Time
	// serves is how long after at it serves (recentListServes).
	serves time.Duration
	items  []gpuhealthv1alpha1.NodeHealth
	wrote  map[string]counted
}

// counted is what the budget counts read from a NodeHealth's status.
type counted struct {
	phase         gpuhealthv1alpha1.NodeHealthPhase
	computeDomain *gpuhealthv1alpha1.ComputeDomainMembership
	// devices are its GPUs out alone (maxUnavailableDevices counts them).
	devices []gpuhealthv1alpha1.DeviceStatus
}

func (c counted) layOver(st *gpuhealthv1alpha1.NodeHealthStatus) {
	st.Phase, st.ComputeDomain, st.Devices = c.phase, c.computeDomain, c.devices
}

// liveNodeHealths returns the NodeHealths for a count under admission.mu: the
// recent list with this process's writes laid over it where it may serve,
// else a fresh list from the apiserver (which becomes the recent list). It
// says which.
func (r *Reconciler) liveNodeHealths(ctx context.Context, o *observation) ([]gpuhealthv1alpha1.NodeHealth, bool, error) {
	if l := r.admission.recent; l != nil && !o.policy.Spec.Certification.CountAgainstBudget &&
		!o.now.Time.Before(l.at) && o.now.Sub(l.at) < l.serves {
		seen := make(map[string]bool, len(l.wrote))
		for i := range l.items {
			if c, ok := l.wrote[l.items[i].Name]; ok {
				c.layOver(&l.items[i].Status)
				seen[l.items[i].Name] = true
			}
		}
		for name, c := range l.wrote {
			if !seen[name] {
				nh := gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
				c.layOver(&nh.Status)
				l.items = append(l.items, nh)
			}
		}
		return l.items, true, nil
	}
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.APIReader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		r.admission.recent = nil
		return nil, false, fmt.Errorf("listing nodehealths: %w", err)
	}
	// The pass's clock started before it observed; what it took to reach
	// here is the list's cost, and some more.
	took := r.Clock.Now().Sub(o.now.Time)
	r.admission.recent = &recentList{at: o.now.Time, serves: recentListServes(took), items: list.Items, wrote: map[string]counted{}}
	return list.Items, false, nil
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
