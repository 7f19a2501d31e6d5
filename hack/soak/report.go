package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// report is what one run prints.
type report struct {
	Seed     uint64
	Command  string
	Date     time.Time
	Nodes    int
	Monitors int
	Chaos    time.Duration
	Total    time.Duration

	Counters counters
	Faults   map[string]int
	Codes    map[int]int

	Transitions, Jobs, Events int
	TransitionsWithoutEvent   int
	Findings                  int
	Occurrences               int64
	MaxOut                    int
	Settled                   bool
	SettledIn                 time.Duration
	Phases                    map[gpuhealthv1alpha1.NodeHealthPhase]int
	Checks                    map[string]int
	Breaches                  []breach
}

// invariantOrder is the order the report lists the invariants in.
var invariantOrder = []string{invBudgetGlobal, invBudgetClique, invPreexisting, invCounts, invJobs, invEvents, invHistory, invSettled}

// markdown renders the report as the table docs/performance.md shows.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Chaos soak, %s: `%s` (seed %d), %d kwok nodes (%d with a monitor process), two operator replicas; chaos %s, whole run %s.\n\n",
		r.Date.UTC().Format("2006-01-02 15:04 UTC"), strings.TrimSpace(r.Command), r.Seed, r.Nodes, r.Monitors,
		r.Chaos.Round(time.Second), r.Total.Round(time.Second))
	b.WriteString("| what | count |\n| --- | --- |\n")
	kinds := make([]string, 0, len(r.Faults))
	total := 0
	for k, n := range r.Faults {
		kinds = append(kinds, k)
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "| faults injected | %d |\n", total)
	for _, k := range kinds {
		fmt.Fprintf(&b, "| &nbsp;&nbsp;%s | %d |\n", k, r.Faults[k])
	}
	codes := make([]int, 0, len(r.Codes))
	for k := range r.Codes {
		codes = append(codes, k)
	}
	sort.Ints(codes)
	var byCode []string
	for _, k := range codes {
		byCode = append(byCode, fmt.Sprintf("%d×%d", k, r.Codes[k]))
	}
	fmt.Fprintf(&b, "| &nbsp;&nbsp;XID faults by code (code×faults) | %s |\n", strings.Join(byCode, ", "))
	c := r.Counters
	fmt.Fprintf(&b, "| findings injected (distinct) / occurrences | %d / %d |\n", r.Findings, r.Occurrences)
	fmt.Fprintf(&b, "| leader kills (SIGKILL) | %d |\n", c.leaderKills)
	fmt.Fprintf(&b, "| apiserver outages / seconds down | %d / %.0f |\n", c.outages, c.outageDown.Seconds())
	fmt.Fprintf(&b, "| monitor kills mid-burst (burst XIDs) | %d (%d) |\n", c.monitorKills, c.burstXIDs)
	fmt.Fprintf(&b, "| human uncordons | %d |\n", c.uncordons)
	fmt.Fprintf(&b, "| policy edits | %d |\n", c.policyEdits)
	fmt.Fprintf(&b, "| operator restarts (after a kill / after exiting by itself) | %d / %d |\n", c.operatorRestarts-c.operatorExits, c.operatorExits)
	fmt.Fprintf(&b, "| monitor restarts | %d |\n", c.monitorRestarts)
	fmt.Fprintf(&b, "| actions skipped (no target, or the apiserver down) | %d |\n", c.skipped)
	fmt.Fprintf(&b, "| transitions | %d |\n", r.Transitions)
	fmt.Fprintf(&b, "| Jobs | %d |\n", r.Jobs)
	fmt.Fprintf(&b, "| transition Events (series counts summed) / transitions with no Event seen | %d / %d |\n", r.Events, r.TransitionsWithoutEvent)
	fmt.Fprintf(&b, "| most nodes out at once (live) | %d |\n", r.MaxOut)
	if r.Settled {
		fmt.Fprintf(&b, "| settled after the last fault | %s |\n", r.SettledIn.Round(time.Second))
	} else {
		fmt.Fprintf(&b, "| settled after the last fault | not within %s |\n", r.SettledIn.Round(time.Second))
	}
	var ps []string
	for p, n := range r.Phases {
		ps = append(ps, fmt.Sprintf("%s %d", p, n))
	}
	sort.Strings(ps)
	fmt.Fprintf(&b, "| phases at the end | %s |\n", strings.Join(ps, ", "))
	checks := 0
	for _, inv := range invariantOrder {
		checks += r.Checks[inv]
	}
	byInv := map[string]int{}
	for _, br := range r.Breaches {
		byInv[br.Invariant]++
	}
	fmt.Fprintf(&b, "| invariant checks / breaches | %d / %d |\n", checks, len(r.Breaches))
	for _, inv := range invariantOrder {
		fmt.Fprintf(&b, "| &nbsp;&nbsp;%s | %d / %d |\n", inv, r.Checks[inv], byInv[inv])
	}
	for _, br := range r.Breaches {
		fmt.Fprintf(&b, "\n- %s", br)
	}
	if len(r.Breaches) > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
