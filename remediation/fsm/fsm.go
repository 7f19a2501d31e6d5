package fsm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/looplab/fsm"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Event is something that moves a node from one phase to another.
type Event string

const (
	// Certify holds a new node (or one a human labelled) out of service until its certification passes.
	Certify Event = "Certify"
	// Certified returns a node that passed its certification.
	Certified Event = "Certified"
	// Quarantine takes a healthy or certifying node out of service after a quarantining finding.
	Quarantine Event = "Quarantine"
	// Drain starts emptying a quarantined node once the budgets allow it.
	Drain Event = "Drain"
	// Recertify starts remediation and recertification of a drained node
	// that has left its ComputeDomain, or of a node back from maintenance.
	Recertify Event = "Recertify"
	// Pass returns a recertified node to service.
	Pass Event = "Pass"
	// FailRecertification sends a node whose recertification failed back to quarantine for another attempt.
	FailRecertification Event = "FailRecertification"
	// Fail gives a node up to a human: attempts exhausted, or a finding that asks for support or replacement.
	Fail Event = "Fail"
	// Cancel returns a node a human uncordoned while it was out of service.
	Cancel Event = "Cancel"
	// Release returns a node to service without recertification on a human's request.
	Release Event = "Release"
	// Retry sends a failed node back to quarantine on a human's request to recertify it.
	Retry Event = "Retry"
	// Maintain holds a node drained for planned maintenance until a human returns it.
	Maintain Event = "Maintain"
)

type phase = gpuhealthv1alpha1.NodeHealthPhase

const (
	healthy      = gpuhealthv1alpha1.PhaseHealthy
	certifying   = gpuhealthv1alpha1.PhaseCertifying
	quarantined  = gpuhealthv1alpha1.PhaseQuarantined
	draining     = gpuhealthv1alpha1.PhaseDraining
	recertifying = gpuhealthv1alpha1.PhaseRecertifying
	maintenance  = gpuhealthv1alpha1.PhaseMaintenance
	failed       = gpuhealthv1alpha1.PhaseFailed
)

// Transition is one legal move of the machine.
type Transition struct {
	Event Event
	From  []phase
	To    phase
}

// transitions is the whole machine. Everything not listed is illegal.
var transitions = []Transition{
	{Certify, []phase{healthy}, certifying},
	{Certified, []phase{certifying}, healthy},
	{Quarantine, []phase{healthy, certifying}, quarantined},
	{Drain, []phase{quarantined}, draining},
	{Recertify, []phase{draining, maintenance}, recertifying},
	{Maintain, []phase{draining}, maintenance},
	{Pass, []phase{recertifying}, healthy},
	{FailRecertification, []phase{recertifying}, quarantined},
	{Fail, []phase{healthy, certifying, quarantined, draining, recertifying, maintenance}, failed},
	{Cancel, []phase{certifying, quarantined, draining, recertifying, maintenance, failed}, healthy},
	{Release, []phase{certifying, quarantined, draining, recertifying, maintenance, failed}, healthy},
	{Retry, []phase{failed}, quarantined},
}

// Transitions returns the legal transitions, for documentation and tests.
func Transitions() []Transition {
	out := make([]Transition, len(transitions))
	copy(out, transitions)
	return out
}

// Phases lists every phase.
func Phases() []phase {
	return []phase{healthy, certifying, quarantined, draining, recertifying, maintenance, failed}
}

// Events lists every event.
func Events() []Event {
	return []Event{Certify, Certified, Quarantine, Drain, Recertify, Maintain, Pass, FailRecertification, Fail, Cancel, Release, Retry}
}

// IllegalTransitionError is returned for an event the current phase does not allow.
type IllegalTransitionError struct {
	Phase phase
	Event Event
}

func (e *IllegalTransitionError) Error() string {
	return fmt.Sprintf("event %s is not allowed in phase %s", e.Event, e.Phase)
}

// Machine is the state machine of one node, rebuilt from its persisted phase
// at every reconcile.
type Machine struct {
	f *fsm.FSM
}

// New rebuilds the machine at a persisted phase; an empty phase is a node
// gpuhealth has not judged yet and starts Healthy.
func New(current phase) (*Machine, error) {
	if current == "" {
		current = healthy
	}
	known := false
	for _, p := range Phases() {
		known = known || p == current
	}
	if !known {
		return nil, fmt.Errorf("unknown phase %q", current)
	}
	return &Machine{f: fsm.NewFSM(string(current), eventsOf(len(transitions), func(i int) (Event, []phase, phase) {
		return transitions[i].Event, transitions[i].From, transitions[i].To
	}), nil)}, nil
}

// eventsOf is a table of n transitions, the i-th given by at, as
// looplab/fsm's events.
func eventsOf[E, P ~string](n int, at func(i int) (E, []P, P)) fsm.Events {
	events := make(fsm.Events, 0, n)
	for i := range n {
		e, from, to := at(i)
		src := make([]string, len(from))
		for j, p := range from {
			src[j] = string(p)
		}
		events = append(events, fsm.EventDesc{Name: string(e), Src: src, Dst: string(to)})
	}
	return events
}

// Phase is the machine's current phase.
func (m *Machine) Phase() phase { return phase(m.f.Current()) }

// Can says whether the event is legal in the current phase.
func (m *Machine) Can(e Event) bool { return m.f.Can(string(e)) }

// Fire moves the machine. An event the current phase does not allow returns
// an *IllegalTransitionError and leaves the machine where it was.
func (m *Machine) Fire(ctx context.Context, e Event) (from, to phase, err error) {
	from = m.Phase()
	if err := m.f.Event(ctx, string(e)); err != nil {
		var invalid fsm.InvalidEventError
		var unknown fsm.UnknownEventError
		if errors.As(err, &invalid) || errors.As(err, &unknown) {
			return from, from, &IllegalTransitionError{Phase: from, Event: e}
		}
		return from, from, fmt.Errorf("firing %s in phase %s: %w", e, from, err)
	}
	return from, m.Phase(), nil
}

// MaxHistory bounds NodeHealth.status.history; older entries are dropped first.
const MaxHistory = 32

// Record writes a transition into the status: phase, reason, message, since
// and a history entry. It does not check legality; Fire does.
func Record(status *gpuhealthv1alpha1.NodeHealthStatus, from, to phase, reason, message, by string, now metav1.Time) {
	status.Phase = to
	status.Reason = reason
	status.Message = message
	status.Since = &now
	appendHistory(status, gpuhealthv1alpha1.Transition{From: from, To: to, Reason: reason, Message: message, By: by, Time: now})
}

// Note adds a history entry that changes no phase (a hand-off, say),
// bounded like transitions.
func Note(status *gpuhealthv1alpha1.NodeHealthStatus, reason, message string, now metav1.Time) {
	appendHistory(status, gpuhealthv1alpha1.Transition{From: status.Phase, To: status.Phase, Reason: reason, Message: message, Time: now})
}

func appendHistory(status *gpuhealthv1alpha1.NodeHealthStatus, t gpuhealthv1alpha1.Transition) {
	status.History = append(status.History, t)
	if n := len(status.History); n > MaxHistory {
		status.History = append([]gpuhealthv1alpha1.Transition(nil), status.History[n-MaxHistory:]...)
	}
}

// Mermaid renders the machine as a Mermaid state diagram, one line per
// legal (phase, event) pair, in table order. docs/architecture.md embeds it
// and a test keeps the two equal.
func Mermaid() string {
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	b.WriteString("    [*] --> Healthy\n")
	for _, t := range transitions {
		for _, f := range t.From {
			fmt.Fprintf(&b, "    %s --> %s: %s\n", f, t.To, t.Event)
		}
	}
	return b.String()
}
