package main

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

const (
	healthy      = gpuhealthv1alpha1.PhaseHealthy
	quarantined  = gpuhealthv1alpha1.PhaseQuarantined
	draining     = gpuhealthv1alpha1.PhaseDraining
	recertifying = gpuhealthv1alpha1.PhaseRecertifying
	failed       = gpuhealthv1alpha1.PhaseFailed
)

func tr(from, to gpuhealthv1alpha1.NodeHealthPhase, reason string, sec int) gpuhealthv1alpha1.Transition {
	return gpuhealthv1alpha1.Transition{From: from, To: to, Reason: reason, Time: metav1.NewTime(t0.Add(time.Duration(sec) * time.Second))}
}

// cycle is a node's full cycle starting at second s: out of service from
// s+1 (Draining) to s+1+out.
func cycle(s, out int) []gpuhealthv1alpha1.Transition {
	return []gpuhealthv1alpha1.Transition{
		tr(healthy, quarantined, "Fault", s),
		tr(quarantined, draining, "Draining", s+1),
		tr(draining, recertifying, "Recertifying", s+1+out/2),
		tr(recertifying, healthy, "Recertified", s+1+out),
	}
}

func invariants(bs []breach) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Invariant+" "+b.Node)
	}
	return out
}

func TestMergeHistoryAppendsOnlyNewEntries(t *testing.T) {
	first := cycle(0, 10)[:2]
	stored := mergeHistory(nil, first)
	stored = mergeHistory(stored, first) // the same status again
	if len(stored) != 2 {
		t.Fatalf("the same history twice: %d entries, want 2", len(stored))
	}
	stored = mergeHistory(stored, cycle(0, 10))
	if len(stored) != 4 {
		t.Fatalf("two more transitions: %d entries, want 4", len(stored))
	}
	// The status' history was trimmed to its newest entries: the overlap
	// is found, nothing is taken twice.
	more := append(append([]gpuhealthv1alpha1.Transition(nil), cycle(0, 10)[2:]...), cycle(20, 10)...)
	stored = mergeHistory(stored, more)
	if len(stored) != 8 {
		t.Fatalf("after a trimmed history: %d entries, want 8", len(stored))
	}
	// A transition written twice shows up twice.
	dup := append(append([]gpuhealthv1alpha1.Transition(nil), more...), more[len(more)-1])
	stored = mergeHistory(stored, dup)
	if len(stored) != 9 {
		t.Fatalf("a transition written twice: %d entries, want 9", len(stored))
	}
	if bs := checkChain("n", stored); len(bs) != 1 || bs[0].Invariant != invHistory {
		t.Fatalf("the duplicate breaks the chain once, got %v", bs)
	}
	if bs := checkChain("n", stored[:8]); len(bs) != 0 {
		t.Fatalf("a clean history is one chain, got %v", bs)
	}
}

func budgets(global, clique intstr.IntOrString) budgetCheck {
	return budgetCheck{
		Settings: []budgetSetting{{At: t0.Add(-time.Hour), MaxUnavailable: global, PerClique: clique}},
		Managed:  20, CliqueSize: map[string]int{"c0": 4, "c1": 4},
		Grace: 20 * time.Second, Slack: 2 * time.Second,
	}
}

func TestBudgetsCleanHistoryPasses(t *testing.T) {
	// Clique c0 drains one node at a time: each starts the second the last
	// one left (and one is stamped a second before, within the slack).
	// Clique c1 has one out at the same time: the fleet's 10% of 20 is 2.
	var ivs []interval
	ivs = append(ivs, outIntervals("a", "c0", cycle(0, 10))...)
	ivs = append(ivs, outIntervals("b", "c0", cycle(10, 10))...)
	ivs = append(ivs, outIntervals("c", "c0", cycle(19, 10))...)
	ivs = append(ivs, outIntervals("d", "c1", cycle(0, 30))...)
	if bs := checkBudgets(ivs, budgets(intstr.FromString("10%"), intstr.FromInt32(1))); len(bs) != 0 {
		t.Fatalf("clean history: %v", bs)
	}
}

func TestBudgetsBreachDetected(t *testing.T) {
	var ivs []interval
	ivs = append(ivs, outIntervals("a", "c0", cycle(0, 10))...)
	ivs = append(ivs, outIntervals("b", "c0", cycle(5, 10))...) // a is still out
	ivs = append(ivs, outIntervals("d", "c1", cycle(3, 30))...)
	bs := checkBudgets(ivs, budgets(intstr.FromString("10%"), intstr.FromInt32(1)))
	got := strings.Join(invariants(bs), "; ")
	want := invBudgetGlobal + " b; " + invBudgetClique + " b"
	if got != want {
		t.Fatalf("breaches %q, want %q (%v)", got, want, bs)
	}
	if !strings.Contains(bs[0].Evidence, "3 nodes") || !strings.Contains(bs[0].Evidence, "allowed 2") {
		t.Fatalf("the evidence names the count and the budget: %s", bs[0].Evidence)
	}
}

func TestBudgetsFollowPolicyEdits(t *testing.T) {
	b := budgets(intstr.FromInt32(2), intstr.FromInt32(2))
	b.Settings = append(b.Settings, budgetSetting{At: t0.Add(100 * time.Second), MaxUnavailable: intstr.FromInt32(1), PerClique: intstr.FromInt32(1)})
	var ivs []interval
	// Two out under the old budget, staying out past the edit: fine.
	ivs = append(ivs, outIntervals("a", "c0", cycle(90, 100))...)
	ivs = append(ivs, outIntervals("b", "c1", cycle(95, 100))...)
	if bs := checkBudgets(append([]interval(nil), ivs...), b); len(bs) != 0 {
		t.Fatalf("nodes admitted before a budget shrank stay out legitimately: %v", bs)
	}
	// Admitted within the grace after the edit (the operator's cache may
	// not have it yet): judged by the old budget too, which three out
	// exceeds (two in clique c1 it allows).
	withC := append(append([]interval(nil), ivs...), outIntervals("c", "c1", cycle(110, 100))...)
	if got := strings.Join(invariants(checkBudgets(withC, b)), "; "); got != invBudgetGlobal+" c" {
		t.Fatalf("c makes three out: breaches %q, want the global budget on c", got)
	}
	// Admitted well after the edit while one is out: a breach of the new budget.
	ivs = append(ivs[:1], outIntervals("d", "c1", cycle(150, 10))...)
	bs := checkBudgets(ivs, b)
	if got := strings.Join(invariants(bs), "; "); got != invBudgetGlobal+" d" {
		t.Fatalf("breaches %q, want the global budget on d (%v)", got, bs)
	}
}

func TestBudgetsRaisedAMomentBeforeTheStamp(t *testing.T) {
	// The budget is raised from 1 to 2 at 10:00:05.8 (when the soak's
	// write returned); the operator, which saw it first, admits a second
	// node in clique c0, stamped 10:00:05 (whole seconds): no breach. The
	// same admission two seconds earlier is one.
	b := budgets(intstr.FromInt32(1), intstr.FromInt32(1))
	b.Settings = append(b.Settings, budgetSetting{At: t0.Add(5800 * time.Millisecond), MaxUnavailable: intstr.FromInt32(2), PerClique: intstr.FromInt32(2)})
	ivs := append(outIntervals("a", "c0", cycle(0, 30)), outIntervals("b", "c0", cycle(4, 10))...)
	if bs := checkBudgets(append([]interval(nil), ivs...), b); len(bs) != 0 {
		t.Fatalf("admitted under the raised budget: %v", bs)
	}
	ivs = append(outIntervals("a", "c0", cycle(0, 30)), outIntervals("b", "c0", cycle(2, 10))...)
	if got := strings.Join(invariants(checkBudgets(ivs, b)), "; "); got != invBudgetGlobal+" b; "+invBudgetClique+" b" {
		t.Fatalf("admitted at 10:00:03, before the raise: breaches %q, want both budgets on b", got)
	}
}

func TestLimitRoundsPercentagesUp(t *testing.T) {
	for _, c := range []struct {
		v     intstr.IntOrString
		total int
		want  int
	}{
		{intstr.FromString("10%"), 200, 20},
		{intstr.FromString("5%"), 201, 11},
		{intstr.FromString("50%"), 3, 2},
		{intstr.FromInt32(4), 200, 4},
		{intstr.FromString("7"), 200, 7},
	} {
		if got, err := limit(c.v, c.total); err != nil || got != c.want {
			t.Errorf("limit(%s, %d) = %d, %v; want %d", c.v.String(), c.total, got, err, c.want)
		}
	}
	if _, err := limit(intstr.FromString("ten"), 10); err == nil {
		t.Error("a budget that is no number is an error")
	}
}

func TestJobsOnePerNodeStepAttemptOfACycle(t *testing.T) {
	ts := append(cycle(0, 10), cycle(60, 10)...)
	cycles := map[string][]time.Time{"a": cycleStarts(ts)}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	clean := []jobRecord{
		{UID: "1", Name: "gpuhealth-reboot-a-1-x", Node: "a", Kind: "reboot", Attempt: "1", Created: at(2)},
		{UID: "2", Name: "gpuhealth-recert-recertify-a-1-x", Node: "a", Kind: "recert", Step: "recertify", Attempt: "1", Created: at(4)},
		// The next cycle counts attempts from 1 again.
		{UID: "3", Name: "gpuhealth-reboot-a-1-y", Node: "a", Kind: "reboot", Attempt: "1", Created: at(62)},
	}
	if bs := checkJobs(clean, cycles, time.Second); len(bs) != 0 {
		t.Fatalf("one Job per step and attempt of each cycle: %v", bs)
	}
	dup := append(append([]jobRecord(nil), clean...), jobRecord{UID: "4", Name: "gpuhealth-reboot-a-1-z", Node: "a", Kind: "reboot", Attempt: "1", Created: at(5)})
	bs := checkJobs(dup, cycles, time.Second)
	if len(bs) != 1 || bs[0].Node != "a" || !strings.Contains(bs[0].Evidence, "gpuhealth-reboot-a-1-x, gpuhealth-reboot-a-1-z") {
		t.Fatalf("a second reboot Job of attempt 1 in the first cycle: %v", bs)
	}
}

func TestEventsNoMoreThanTransitions(t *testing.T) {
	transitions := map[string][]gpuhealthv1alpha1.Transition{"a": append([]gpuhealthv1alpha1.Transition{
		{To: healthy, Reason: "Managed", Time: metav1.NewTime(t0)},
	}, append(cycle(0, 10), cycle(60, 10)...)...)}
	events := []eventRecord{
		// Two Fault transitions: one Event with a series of two.
		{UID: "1", Node: "a", Reason: "Fault", Action: "Quarantine", Note: "Healthy → Quarantined: XID 79", Count: 2},
		{UID: "2", Node: "a", Reason: "Draining", Action: "Drain", Note: "Quarantined → Draining: budget has room"},
		// Not a transition's Event.
		{UID: "3", Node: "a", Reason: "DrainTimedOut", Action: "Drain", Note: "pods outlived the drain timeout"},
	}
	counts, bs := compareEvents(transitions, events)
	if len(bs) != 0 {
		t.Fatalf("fewer Events than transitions is no breach: %v", bs)
	}
	for _, c := range counts {
		if c.Reason == "Fault" && (c.Transitions != 2 || c.Events != 2) {
			t.Fatalf("Fault: %d transitions, %d Events; want 2 and 2", c.Transitions, c.Events)
		}
	}
	events = append(events, eventRecord{UID: "4", Node: "a", Reason: "Recertified", Action: "Pass", Note: "Recertifying → Healthy: passed", Count: 3})
	_, bs = compareEvents(transitions, events)
	if len(bs) != 1 || bs[0].Invariant != invEvents || !strings.Contains(bs[0].Evidence, "3 Events") {
		t.Fatalf("three Recertified Events for two transitions: %v", bs)
	}
}

func TestCountsExact(t *testing.T) {
	k := findingKey{"gpu-node-3", gpuhealthv1alpha1.CheckXID, framework.GPUUUID(3, 7), "31"}
	l := findingKey{"gpu-node-9", gpuhealthv1alpha1.CheckFabric, framework.GPUUUID(9, 0), "UNHEALTHY"}
	want := map[findingKey]int64{k: 1234, l: 2}
	if bs := checkCounts(want, map[findingKey]int64{k: 1234, l: 2}); len(bs) != 0 {
		t.Fatalf("exact counts: %v", bs)
	}
	bs := checkCounts(want, map[findingKey]int64{k: 1235})
	if len(bs) != 2 || !strings.Contains(bs[0].Evidence, "injected 1234 times has count 1235") || !strings.Contains(bs[1].Evidence, "is not in the apiserver") {
		t.Fatalf("a count off by one and a finding missing: %v", bs)
	}
	if got := normalizeComponent("gpu-node-3", framework.PCIBusID(7)+".0"); got != framework.GPUUUID(3, 7) {
		t.Fatalf("the kernel log's bus id maps to the GPU's UUID, got %s", got)
	}
}

func TestSettledAndPreexisting(t *testing.T) {
	nhs := []gpuhealthv1alpha1.NodeHealth{{}, {}, {}}
	nhs[0].Name, nhs[0].Status.Phase = "a", healthy
	nhs[1].Name, nhs[1].Status.Phase, nhs[1].Status.Reason = "b", failed, "NeedsHuman"
	nhs[2].Name, nhs[2].Status.Phase = "c", failed
	if bs := checkSettled(nhs[:2]); len(bs) != 0 {
		t.Fatalf("Healthy, and Failed with a reason, are settled: %v", bs)
	}
	nhs = append(nhs, gpuhealthv1alpha1.NodeHealth{})
	nhs[3].Name, nhs[3].Status.Phase = "d", draining
	if got := strings.Join(invariants(checkSettled(nhs)), "; "); got != invSettled+" c; "+invSettled+" d" {
		t.Fatalf("Failed without a reason and Draining are not settled: %s", got)
	}

	p := preexisting{Cordon: true, Taints: []string{"example.com/reserved:NoSchedule"}}
	if bs := checkPreexisting("e", p, true, []string{"example.com/reserved:NoSchedule", "gpuhealth.dev/quarantined:NoSchedule"}); len(bs) != 0 {
		t.Fatalf("kept: %v", bs)
	}
	if bs := checkPreexisting("e", p, false, nil); len(bs) != 2 {
		t.Fatalf("the cordon and the taint lifted: %v", bs)
	}
}
