package breaker

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
)

// DefaultCoolDown is how long an open breaker stays open when the policy
// does not say.
const DefaultCoolDown = 30 * time.Minute

// Settings are one policy's breaker settings, resolved to numbers.
type Settings struct {
	// Limit is how many quarantines the window may hold; the next one opens
	// the breaker. At least 1.
	Limit int
	// Window is the sliding window quarantines are counted in.
	Window time.Duration
	// CoolDown is how long the breaker stays open before it closes by itself.
	CoolDown time.Duration
}

// State is a breaker's state at a time, for status and metrics.
type State struct {
	// Open is true while new quarantines are refused.
	Open bool
	// Since is when the breaker entered its state.
	Since time.Time
	// InWindow is how many quarantines the window holds.
	InWindow int
	// Message explains the state with its numbers.
	Message string
}

// Breaker tracks quarantines per policy. It lives in the leader's memory (one
// process decides at a time) and is seeded from the NodeHealth histories
// when the leader starts, so a restart neither forgets a storm nor needs an
// apiserver list per decision.
type Breaker struct {
	mu       sync.Mutex
	policies map[string]*policyState
	notify   []func(policy string)
}

type policyState struct {
	seeded    bool
	times     []time.Time
	open      bool
	since     time.Time
	lastReset string
}

// New returns an empty Breaker.
func New() *Breaker { return &Breaker{policies: map[string]*policyState{}} }

func (b *Breaker) get(policy string) *policyState {
	p, ok := b.policies[policy]
	if !ok {
		p = &policyState{}
		b.policies[policy] = p
	}
	return p
}

// Notify registers fn to be called, outside the breaker's lock, with the
// policy's name whenever its breaker records, undoes, opens, closes or is
// reset. The policy status controller mirrors the state from it.
func (b *Breaker) Notify(fn func(policy string)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.notify = append(b.notify, fn)
}

func (b *Breaker) changed(policy string) {
	b.mu.Lock()
	fns := slices.Clone(b.notify)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(policy)
	}
}

// Seeded says whether the policy's history was loaded.
func (b *Breaker) Seeded(policy string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.get(policy).seeded
}

// Seed loads past quarantine times of a policy's nodes, the last reset
// token it honoured and, when the previous leader's breaker was open, since
// when (zero: closed), once. An open breaker stays open for the rest of its
// cool-down: a fail-over neither ends a storm's pause early nor restarts it.
func (b *Breaker) Seed(policy string, times []time.Time, lastReset string, openSince time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.get(policy)
	if p.seeded {
		return
	}
	p.seeded = true
	p.times = append(p.times, times...)
	p.lastReset = lastReset
	if !openSince.IsZero() {
		p.open, p.since = true, openSince
	}
}

// Reset closes the breaker on a human's request. A token identifies the
// request so that the same request is honoured once.
func (b *Breaker) Reset(policy, token string, now time.Time) bool {
	ok := b.reset(policy, token, now)
	if ok {
		b.changed(policy)
	}
	return ok
}

func (b *Breaker) reset(policy, token string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.get(policy)
	if token == "" || token == p.lastReset {
		return false
	}
	p.lastReset = token
	p.times = nil
	if p.open {
		p.open, p.since = false, now
	}
	return true
}

// Allow asks to quarantine one node at now. It records the quarantine and
// returns true, or refuses because the breaker is open (or opens now). A
// quarantine that then does not happen (its fence failed) is taken back
// with Undo, so each quarantine counts once, when it is real.
func (b *Breaker) Allow(policy string, s Settings, now time.Time) (bool, State) {
	ok, st, _ := b.allow(policy, s, now, true)
	b.changed(policy)
	return ok, st
}

// Check asks whether one more quarantine would be let through at now,
// without recording one. Like Allow it opens the breaker when the window
// is full, and closes it when its cool-down is over: the first node turned
// away starts the cool-down.
func (b *Breaker) Check(policy string, s Settings, now time.Time) (bool, State) {
	ok, st, changed := b.allow(policy, s, now, false)
	if changed {
		b.changed(policy)
	}
	return ok, st
}

// Undo takes back the quarantine Allow recorded at t.
func (b *Breaker) Undo(policy string, t time.Time) {
	b.mu.Lock()
	p := b.get(policy)
	if i := slices.IndexFunc(p.times, t.Equal); i >= 0 {
		p.times = slices.Delete(p.times, i, i+1)
	}
	b.mu.Unlock()
	b.changed(policy)
}

// allow is Allow (record) or Check; changed says whether the breaker
// opened or closed.
func (b *Breaker) allow(policy string, s Settings, now time.Time, record bool) (ok bool, st State, changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.get(policy)
	p.prune(now, s.Window)
	if p.open && !now.Before(p.since.Add(s.CoolDown)) {
		// Cool-down over: close, and count afresh from now.
		p.open, p.since, p.times = false, now, nil
		changed = true
	}
	if p.open {
		return false, p.state(s), changed
	}
	if len(p.times) >= max(s.Limit, 1) {
		p.open, p.since = true, now
		return false, p.state(s), true
	}
	if record {
		p.times = append(p.times, now)
	}
	return true, p.state(s), changed
}

// Peek returns the state without recording anything.
func (b *Breaker) Peek(policy string, s Settings, now time.Time) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.get(policy)
	p.prune(now, s.Window)
	return p.state(s)
}

func (p *policyState) prune(now time.Time, window time.Duration) {
	keep := p.times[:0]
	for _, t := range p.times {
		if now.Sub(t) < window {
			keep = append(keep, t)
		}
	}
	p.times = keep
}

func (p *policyState) state(s Settings) State {
	st := State{Open: p.open, Since: p.since, InWindow: len(p.times)}
	if p.open {
		st.Message = fmt.Sprintf("open: %d nodes entered quarantine within %s (limit %d); new quarantines stop until %s or a reset",
			len(p.times), s.Window, s.Limit, p.since.Add(s.CoolDown).UTC().Format(time.RFC3339))
	} else {
		st.Message = fmt.Sprintf("closed: %d of %d quarantines used in the last %s", len(p.times), s.Limit, s.Window)
	}
	return st
}

// defaultWindow and defaultThreshold are the schema defaults of the policy's
// circuitBreaker.window and threshold.
const defaultWindow = 10 * time.Minute

var defaultThreshold = intstr.FromString("10%")

// SettingsFor resolves a policy's breaker settings against the number of
// nodes it manages.
func SettingsFor(spec gpuhealthv1alpha1.CircuitBreakerSpec, managed int) (Settings, error) {
	limit, err := budget.Limit(spec.Threshold, managed, defaultThreshold)
	if err != nil {
		return Settings{}, err
	}
	return Settings{Limit: limit, Window: spec.Window.Get(defaultWindow), CoolDown: spec.CoolDown.Get(DefaultCoolDown)}, nil
}

// Enabled says whether the policy's breaker is on (the default).
func Enabled(spec gpuhealthv1alpha1.CircuitBreakerSpec) bool {
	return spec.Enabled == nil || *spec.Enabled
}

// QuarantineTimes are the times nodes entered quarantine for a fault within
// window before now, from their NodeHealth histories: what a new leader
// seeds its breaker with.
func QuarantineTimes(nhs []gpuhealthv1alpha1.NodeHealth, now time.Time, window time.Duration) []time.Time {
	var times []time.Time
	for i := range nhs {
		for _, t := range nhs[i].Status.History {
			if t.To == gpuhealthv1alpha1.PhaseQuarantined && t.From == gpuhealthv1alpha1.PhaseHealthy &&
				t.Reason == gpuhealthv1alpha1.ReasonFault && now.Sub(t.Time.Time) < window {
				times = append(times, t.Time.Time)
			}
		}
	}
	return times
}

// SeedFromStatus seeds the breaker of policy p from the NodeHealths and
// p's status (the last reset honoured, an open breaker's start), once.
func (b *Breaker) SeedFromStatus(p *gpuhealthv1alpha1.RemediationPolicy, nhs []gpuhealthv1alpha1.NodeHealth, now time.Time, window time.Duration) {
	lastReset, openSince := "", time.Time{}
	if st := p.Status.CircuitBreaker; st != nil {
		lastReset = st.LastReset
		if st.State == gpuhealthv1alpha1.BreakerOpen && st.Since != nil {
			openSince = st.Since.Time
		}
	}
	b.Seed(p.Name, QuarantineTimes(nhs, now, window), lastReset, openSince)
}

// LastReset is the reset token the policy's breaker last honoured.
func (b *Breaker) LastReset(policy string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.get(policy).lastReset
}

// defaultNetworkThreshold is the schema default of the policy's
// network.circuitBreaker.threshold.
var defaultNetworkThreshold = intstr.FromInt32(3)

// NetworkSettingsFor resolves a policy's network breaker settings against
// the number of managed nodes in one group.
func NetworkSettingsFor(spec gpuhealthv1alpha1.NetworkBreakerSpec, groupSize int) (Settings, error) {
	limit, err := budget.Limit(spec.Threshold, groupSize, defaultNetworkThreshold)
	if err != nil {
		return Settings{}, err
	}
	return Settings{Limit: limit, Window: spec.Window.Get(defaultWindow), CoolDown: spec.CoolDown.Get(DefaultCoolDown)}, nil
}

// NetworkEnabled says whether the policy's network breaker is on (the
// default).
func NetworkEnabled(spec gpuhealthv1alpha1.NetworkBreakerSpec) bool {
	return spec.Enabled == nil || *spec.Enabled
}
