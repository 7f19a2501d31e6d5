package main

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
)

// The invariant checker's pure logic: everything here works on records the
// watches collected (observe.go) and on the soak's own tallies, with no
// client and no clock, so that unit tests can feed it histories.

// Invariant names, as the report and the breach messages print them.
const (
	invBudgetGlobal = "budget maxUnavailable"
	invBudgetClique = "budget maxUnavailablePerClique"
	invPreexisting  = "pre-existing cordon/taint kept"
	invCounts       = "exact finding counts"
	invJobs         = "one Job per (node, step, attempt)"
	invEvents       = "one Event per transition"
	invHistory      = "history is one chain"
	invSettled      = "settled Healthy or Failed with a reason"
)

// breach is one invariant violated: which, on which node, and the evidence.
type breach struct {
	Invariant string
	Node      string
	Evidence  string
}

func (b breach) String() string {
	return fmt.Sprintf("INVARIANT BREACH [%s] node %s: %s", b.Invariant, b.Node, b.Evidence)
}

// outPhase says whether a node in phase p counts against the drain budgets
// (the phases the API's NodeHealthPhase.UsesBudget names; Certifying does
// not count under the soak's policy).
func outPhase(p gpuhealthv1alpha1.NodeHealthPhase) bool {
	return p == gpuhealthv1alpha1.PhaseDraining || p == gpuhealthv1alpha1.PhaseRecertifying || p == gpuhealthv1alpha1.PhaseMaintenance
}

// mergeHistory appends to stored (one node's transitions seen so far, in
// order) the entries of a newer status history that it does not hold yet.
// A history only grows at its end and loses its oldest entries past 32, so
// the entries after the last stored one are new; when the last stored entry
// is no longer in it (more than 32 transitions between two observations),
// the entries later than it are.
func mergeHistory(stored, history []gpuhealthv1alpha1.Transition) []gpuhealthv1alpha1.Transition {
	if len(history) == 0 {
		return stored
	}
	if len(stored) == 0 {
		return append(stored, history...)
	}
	last := stored[len(stored)-1]
	for i := len(history) - 1; i >= 0; i-- {
		if sameTransition(history[i], last) {
			// The same entry may occur twice in a row only if it was
			// written twice; count how many of this run stored holds.
			run := 0
			for j := len(stored) - 1; j >= 0 && sameTransition(stored[j], last); j-- {
				run++
			}
			k := i
			for k-1 >= 0 && sameTransition(history[k-1], last) {
				k--
			}
			// history[k..i] is the run in history: copies beyond the
			// stored ones are new (written twice), the rest are stored.
			return append(stored, history[min(k+run, i+1):]...)
		}
	}
	for _, t := range history {
		if t.Time.After(last.Time.Time) {
			stored = append(stored, t)
		}
	}
	return stored
}

func sameTransition(a, b gpuhealthv1alpha1.Transition) bool {
	return a.From == b.From && a.To == b.To && a.Reason == b.Reason && a.Message == b.Message && a.By == b.By && a.Time.Equal(&b.Time)
}

// checkChain finds transitions that do not start where the previous one
// ended: a transition written twice, or one lost.
func checkChain(node string, ts []gpuhealthv1alpha1.Transition) []breach {
	var out []breach
	for i := 1; i < len(ts); i++ {
		if ts[i].From != ts[i-1].To {
			out = append(out, breach{invHistory, node, fmt.Sprintf("transition %d (%s → %s, %s, at %s) follows %s → %s (%s, at %s)",
				i, ts[i].From, ts[i].To, ts[i].Reason, ts[i].Time.UTC().Format(time.RFC3339),
				ts[i-1].From, ts[i-1].To, ts[i-1].Reason, ts[i-1].Time.UTC().Format(time.RFC3339))})
		}
	}
	return out
}

// interval is a stretch a node spent counting against the budgets.
type interval struct {
	Node, Clique string
	Start        time.Time
	// End is zero while the node is still out.
	End time.Time
}

// outIntervals turns a node's transitions into its stretches out of
// service under the budgets.
func outIntervals(node, clique string, ts []gpuhealthv1alpha1.Transition) []interval {
	var out []interval
	var cur *interval
	for _, t := range ts {
		in, was := outPhase(t.To), outPhase(t.From)
		switch {
		case in && !was && cur == nil:
			cur = &interval{Node: node, Clique: clique, Start: t.Time.Time}
		case !in && cur != nil:
			cur.End = t.Time.Time
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// budgetSetting is the policy's budgets from a time on.
type budgetSetting struct {
	At             time.Time
	MaxUnavailable intstr.IntOrString
	PerClique      intstr.IntOrString
}

// limit is a count-or-percent budget of total nodes, a percentage rounded
// up (as a PodDisruptionBudget's is).
func limit(v intstr.IntOrString, total int) (int, error) {
	if v.Type == intstr.Int {
		return int(v.IntVal), nil
	}
	s := strings.TrimSuffix(v.StrVal, "%")
	if s == v.StrVal {
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("budget %q is neither a count nor a percentage", v.StrVal)
		}
		return n, nil
	}
	p, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("budget %q is not a whole percentage", v.StrVal)
	}
	return int(math.Ceil(float64(p) * float64(total) / 100)), nil
}

// budgetCheck is what checkBudgets needs besides the intervals.
type budgetCheck struct {
	// Settings are the policy's budgets over time, oldest first; the first
	// is in force from the start.
	Settings []budgetSetting
	// Managed is the number of nodes the policy manages; CliqueSize the
	// number of them in each clique.
	Managed    int
	CliqueSize map[string]int
	// Grace is how long after an edit the old budget may still be in force
	// (until the operator's cache has the new policy).
	Grace time.Duration
	// Slack is how much earlier than recorded a node may have left: the
	// operator stamps a transition with its reconcile's start, so a node
	// admitted right after another left may be stamped a moment before.
	Slack time.Duration
}

// allowed returns the largest of the limits (global and for clique size n)
// in force at any time in [t-grace, t+slack]: transitions are stamped in
// whole seconds (and with the reconcile's start), edits when the soak's
// write returned, so an admission under a budget raised a moment before
// can carry a stamp a moment before the edit's.
func (b budgetCheck) allowed(t time.Time, cliqueSize int) (global, clique int) {
	global, clique = -1, -1
	from := t.Add(-b.Grace)
	for i, s := range b.Settings {
		until := time.Time{}
		if i+1 < len(b.Settings) {
			until = b.Settings[i+1].At
		}
		if i > 0 && s.At.After(t.Add(b.Slack)) {
			break
		}
		if !until.IsZero() && until.Before(from) {
			continue
		}
		if g, err := limit(s.MaxUnavailable, b.Managed); err == nil {
			global = max(global, g)
		}
		if c, err := limit(s.PerClique, cliqueSize); err == nil {
			clique = max(clique, c)
		}
	}
	return global, clique
}

// checkBudgets checks, at every moment a node started counting against the
// budgets, that no more nodes did (it included) than the budgets in force
// allowed, over the fleet and within its clique.
func checkBudgets(ivs []interval, b budgetCheck) []breach {
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].Start.Before(ivs[j].Start) })
	var out []breach
	for i, iv := range ivs {
		t := iv.Start
		var fleet, clique []string
		for j, o := range ivs {
			if o.Start.After(t) {
				break
			}
			if !o.End.IsZero() && !o.End.After(t.Add(b.Slack)) {
				continue
			}
			if j != i && o.Node == iv.Node {
				continue
			}
			fleet = append(fleet, o.Node)
			if o.Clique != "" && o.Clique == iv.Clique {
				clique = append(clique, o.Node)
			}
		}
		g, c := b.allowed(t, b.CliqueSize[iv.Clique])
		when := t.UTC().Format(time.RFC3339)
		if g >= 0 && len(fleet) > g {
			out = append(out, breach{invBudgetGlobal, iv.Node, fmt.Sprintf("at %s it made %d nodes Draining/Recertifying/Maintenance, the budget allowed %d: %s",
				when, len(fleet), g, strings.Join(fleet, ", "))})
		}
		if iv.Clique != "" && c >= 0 && len(clique) > c {
			out = append(out, breach{invBudgetClique, iv.Node, fmt.Sprintf("at %s it made %d nodes of clique %s out, the budget allowed %d: %s",
				when, len(clique), iv.Clique, c, strings.Join(clique, ", "))})
		}
	}
	return out
}

// jobRecord is one Job gpuhealth created, as the Job watch saw it.
type jobRecord struct {
	UID, Name, Node, Kind, Step string
	Attempt                     string
	Created                     time.Time
}

// cycleStarts are the times a node's remediation cycles began: each entry
// into Quarantined from a phase in service (or from Failed, a retry). Attempts
// count from 1 again in each cycle.
func cycleStarts(ts []gpuhealthv1alpha1.Transition) []time.Time {
	var out []time.Time
	for _, t := range ts {
		if t.To == gpuhealthv1alpha1.PhaseQuarantined && t.From != gpuhealthv1alpha1.PhaseRecertifying {
			out = append(out, t.Time.Time)
		}
	}
	return out
}

// checkJobs finds more than one Job for the same node, step and attempt of
// one remediation cycle. A Job belongs to the last cycle of its node that
// started before it was created (within slack: stamps are whole seconds).
func checkJobs(jobs []jobRecord, cycles map[string][]time.Time, slack time.Duration) []breach {
	type key struct{ node, cycle, kind, step, attempt string }
	seen := map[key][]string{}
	var keys []key
	for _, j := range jobs {
		cycle := "before any recorded cycle"
		for _, c := range cycles[j.Node] {
			if !c.After(j.Created.Add(slack)) {
				cycle = c.UTC().Format(time.RFC3339)
			}
		}
		k := key{j.Node, cycle, j.Kind, j.Step, j.Attempt}
		if _, ok := seen[k]; !ok {
			keys = append(keys, k)
		}
		seen[k] = append(seen[k], j.Name)
	}
	var out []breach
	for _, k := range keys {
		if names := seen[k]; len(names) > 1 {
			out = append(out, breach{invJobs, k.node, fmt.Sprintf("%d Jobs for kind %s step %q attempt %s of the cycle that began %s: %s",
				len(names), k.kind, k.step, k.attempt, k.cycle, strings.Join(names, ", "))})
		}
	}
	return out
}

// eventRecord is one Event the operator published about a Node, as the
// Event watch last saw it.
type eventRecord struct {
	UID, Node, Reason, Action, Note string
	// Count is the Event's series count, 1 when it has no series.
	Count int
}

// transitionNote matches the note of a transition's Event: "From → To: …".
var transitionNote = regexp.MustCompile(`^(\w*) → (\w+): `)

// eventTargets maps each state-machine event to the phase it enters.
var eventTargets = func() map[string]gpuhealthv1alpha1.NodeHealthPhase {
	m := map[string]gpuhealthv1alpha1.NodeHealthPhase{}
	for _, t := range fsm.Transitions() {
		m[string(t.Event)] = t.To
	}
	return m
}()

// transitionCount is one (node, reason, phase entered) with the
// transitions the histories hold and the Events published for them.
type transitionCount struct {
	Node, Reason string
	To           gpuhealthv1alpha1.NodeHealthPhase
	Transitions  int
	Events       int
}

// compareEvents pairs the transitions with the operator's transition
// Events by node, reason and the phase entered (an Event's action names the
// state-machine event, which enters one phase). Events that repeat within
// minutes are one object with a series count; a series' count above 2 is
// written only when the series ends (minutes later), and a killed leader
// takes its unwritten counts with it, so fewer Events than transitions is
// expected. More Events than transitions is a breach.
func compareEvents(transitions map[string][]gpuhealthv1alpha1.Transition, events []eventRecord) (counts []transitionCount, breaches []breach) {
	type key struct {
		node, reason string
		to           gpuhealthv1alpha1.NodeHealthPhase
	}
	idx := map[key]*transitionCount{}
	get := func(k key) *transitionCount {
		c, ok := idx[k]
		if !ok {
			c = &transitionCount{Node: k.node, Reason: k.reason, To: k.to}
			idx[k] = c
		}
		return c
	}
	for node, ts := range transitions {
		for _, t := range ts {
			if t.From == "" {
				continue // the first entry of a new NodeHealth
			}
			get(key{node, t.Reason, t.To}).Transitions++
		}
	}
	for _, e := range events {
		to, ok := eventTargets[e.Action]
		m := transitionNote.FindStringSubmatch(e.Note)
		if !ok || m == nil || gpuhealthv1alpha1.NodeHealthPhase(m[2]) != to {
			continue // not a transition's Event
		}
		get(key{e.Node, e.Reason, to}).Events += max(e.Count, 1)
	}
	for _, c := range idx {
		counts = append(counts, *c)
	}
	sort.Slice(counts, func(i, j int) bool {
		a, b := counts[i], counts[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Reason != b.Reason {
			return a.Reason < b.Reason
		}
		return a.To < b.To
	})
	for _, c := range counts {
		if c.Events > c.Transitions {
			breaches = append(breaches, breach{invEvents, c.Node, fmt.Sprintf("%d Events (series counts summed) with reason %s entering %s for %d transitions in its history",
				c.Events, c.Reason, c.To, c.Transitions)})
		}
	}
	return counts, breaches
}

// findingKey identifies a finding regardless of the source that saw it
// (nvml or kmsg) and of whether the kernel log's copy named the GPU by its
// bus id or its UUID.
type findingKey struct {
	Node      string
	Check     gpuhealthv1alpha1.Check
	Component string
	Code      string
}

func (k findingKey) String() string {
	return fmt.Sprintf("%s %s %s code %s", k.Node, k.Check, k.Component, k.Code)
}

// checkCounts compares the soak's own tally of each finding it injected
// with the counts the apiserver holds.
func checkCounts(want, got map[findingKey]int64) []breach {
	keys := make([]findingKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	var out []breach
	for _, k := range keys {
		g, ok := got[k]
		switch {
		case !ok:
			out = append(out, breach{invCounts, k.Node, fmt.Sprintf("finding %s injected %d times is not in the apiserver", k, want[k])})
		case g != want[k]:
			out = append(out, breach{invCounts, k.Node, fmt.Sprintf("finding %s injected %d times has count %d", k, want[k], g)})
		}
	}
	return out
}

// checkSettled finds nodes neither Healthy nor Failed with a reason.
func checkSettled(nhs []gpuhealthv1alpha1.NodeHealth) []breach {
	var out []breach
	for i := range nhs {
		st := &nhs[i].Status
		switch {
		case st.Phase == gpuhealthv1alpha1.PhaseHealthy:
		case st.Phase == gpuhealthv1alpha1.PhaseFailed && st.Reason != "":
		default:
			out = append(out, breach{invSettled, nhs[i].Name, fmt.Sprintf("phase %q reason %q: %s", st.Phase, st.Reason, st.Message)})
		}
	}
	return out
}

// preexisting is what "a human" put on a node before the soak: a cordon,
// taints, or both.
type preexisting struct {
	Cordon bool
	Taints []string // key:effect
}

// checkPreexisting finds what a human put on a node before the soak and
// that is gone now; nobody but gpuhealth touches those nodes' cordons and
// taints during the run.
func checkPreexisting(node string, p preexisting, unschedulable bool, taints []string) []breach {
	var out []breach
	if p.Cordon && !unschedulable {
		out = append(out, breach{invPreexisting, node, "the cordon a human set before the run is gone"})
	}
	have := map[string]bool{}
	for _, t := range taints {
		have[t] = true
	}
	for _, t := range p.Taints {
		if !have[t] {
			out = append(out, breach{invPreexisting, node, fmt.Sprintf("the taint %s a human set before the run is gone (taints now: %s)", t, strings.Join(taints, ", "))})
		}
	}
	return out
}
