package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// operatorComponent is the reporting controller of the operator's Events
// (controllers/nodehealth.FieldManager).
const operatorComponent = "gpuhealth-operator"

// observer watches NodeHealths, Nodes, gpuhealth's Jobs and the operator's
// Events for the whole run (informers: they list again and watch on after
// an apiserver outage) and keeps what the invariants are checked on: every
// transition seen, every Job and Event ever seen, the phases now, and the
// live breaches (a pre-existing cordon or taint lifted; more nodes out than
// the budgets allow for longer than a moment).
type observer struct {
	mu sync.Mutex
	// clique of each managed node.
	clique map[string]string
	// transitions seen per node, in order (mergeHistory).
	transitions map[string][]gpuhealthv1alpha1.Transition
	phase       map[string]gpuhealthv1alpha1.NodeHealthPhase
	reason      map[string]string
	// unschedulable, applied: each Node's cordon and whether gpuhealth's
	// applied annotation says the cordon is its own.
	unschedulable map[string]bool
	applied       map[string]bool
	jobs          map[string]jobRecord
	events        map[string]eventRecord
	pre           map[string]preexisting
	settings      []budgetSetting
	managed       int
	cliqueSize    map[string]int

	live     []breach
	liveSeen map[string]bool
	// overSince is when the live count of nodes out first exceeded the
	// budget, zero while it does not; maxOut the most out at once.
	overSince time.Time
	maxOut    int
	// checks counts the invariant checks performed, by invariant.
	checks map[string]int
}

func newObserver(clique map[string]string, pre map[string]preexisting) *observer {
	o := &observer{
		clique: clique, transitions: map[string][]gpuhealthv1alpha1.Transition{},
		phase: map[string]gpuhealthv1alpha1.NodeHealthPhase{}, reason: map[string]string{},
		unschedulable: map[string]bool{}, applied: map[string]bool{},
		jobs: map[string]jobRecord{}, events: map[string]eventRecord{}, pre: pre,
		liveSeen: map[string]bool{}, checks: map[string]int{}, cliqueSize: map[string]int{},
		managed: len(clique),
	}
	for _, c := range clique {
		o.cliqueSize[c]++
	}
	return o
}

// start runs the informers until ctx ends and waits for their first lists.
func (o *observer) start(ctx context.Context, c *framework.Cluster) error {
	ca, err := cache.New(c.Config, cache.Options{Scheme: c.Scheme})
	if err != nil {
		return fmt.Errorf("creating the soak's cache: %w", err)
	}
	handle := func(obj client.Object, f func(any)) error {
		inf, err := ca.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    f,
			UpdateFunc: func(_, n any) { f(n) },
		})
		return err
	}
	if err := handle(&gpuhealthv1alpha1.NodeHealth{}, o.onNodeHealth); err != nil {
		return err
	}
	if err := handle(&corev1.Node{}, o.onNode); err != nil {
		return err
	}
	if err := handle(&batchv1.Job{}, o.onJob); err != nil {
		return err
	}
	if err := handle(&eventsv1.Event{}, o.onEvent); err != nil {
		return err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return fmt.Errorf("the soak's watches did not sync")
	}
	go o.sampleBudgets(ctx)
	return nil
}

// catchUp lays the NodeHealths and Events the apiserver holds now over
// what the informers saw. After an apiserver outage a reflector lists
// again only when its backoff lets it, which can be most of a minute
// later; the end checks must judge the state the apiserver holds, not an
// informer's lagging view of it. Both handlers merge, so what was seen
// before is kept.
func (o *observer) catchUp(ctx context.Context, c client.Reader) error {
	var nhs gpuhealthv1alpha1.NodeHealthList
	if err := c.List(ctx, &nhs); err != nil {
		return fmt.Errorf("listing NodeHealths: %w", err)
	}
	var events eventsv1.EventList
	if err := c.List(ctx, &events); err != nil {
		return fmt.Errorf("listing Events: %w", err)
	}
	for i := range nhs.Items {
		o.onNodeHealth(&nhs.Items[i])
	}
	for i := range events.Items {
		o.onEvent(&events.Items[i])
	}
	return nil
}

func (o *observer) onNodeHealth(obj any) {
	nh, ok := obj.(*gpuhealthv1alpha1.NodeHealth)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.transitions[nh.Name] = mergeHistory(o.transitions[nh.Name], nh.Status.History)
	o.phase[nh.Name] = nh.Status.Phase
	o.reason[nh.Name] = nh.Status.Reason
	o.liveBudgetLocked(time.Now())
}

func (o *observer) onNode(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unschedulable[n.Name] = n.Spec.Unschedulable
	_, o.applied[n.Name] = n.Annotations["gpuhealth.dev/applied"]
	p, ok := o.pre[n.Name]
	if !ok {
		return
	}
	var taints []string
	for _, t := range n.Spec.Taints {
		taints = append(taints, taintString(t))
	}
	o.checks[invPreexisting]++
	for _, b := range checkPreexisting(n.Name, p, n.Spec.Unschedulable, taints) {
		o.addLiveLocked(b)
	}
}

func (o *observer) onJob(obj any) {
	j, ok := obj.(*batchv1.Job)
	if !ok || j.Labels[job.NodeLabel] == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.jobs[string(j.UID)] = jobRecord{
		UID: string(j.UID), Name: j.Name, Node: j.Labels[job.NodeLabel], Kind: j.Labels[job.KindLabel],
		Step: j.Labels[job.StepLabel], Attempt: j.Labels[job.AttemptLabel], Created: j.CreationTimestamp.Time,
	}
}

func (o *observer) onEvent(obj any) {
	e, ok := obj.(*eventsv1.Event)
	if !ok || e.ReportingController != operatorComponent || e.Regarding.Kind != "Node" {
		return
	}
	count := 1
	if e.Series != nil && e.Series.Count > 1 {
		count = int(e.Series.Count)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, ok := o.events[string(e.UID)]; ok && old.Count > count {
		count = old.Count // counts only grow; an older copy may come late
	}
	o.events[string(e.UID)] = eventRecord{UID: string(e.UID), Node: e.Regarding.Name, Reason: e.Reason, Action: e.Action, Note: e.Note, Count: count}
}

// addLiveLocked records a breach seen live, once per invariant and node.
func (o *observer) addLiveLocked(b breach) {
	k := b.Invariant + "/" + b.Node
	if o.liveSeen[k] {
		return
	}
	o.liveSeen[k] = true
	o.live = append(o.live, b)
	logf("%s", b)
}

// setBudgets records the policy's budgets from at on.
func (o *observer) setBudgets(s budgetSetting) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.settings = append(o.settings, s)
}

func (o *observer) budgetCheckLocked() budgetCheck {
	return budgetCheck{
		Settings: append([]budgetSetting(nil), o.settings...), Managed: o.managed, CliqueSize: o.cliqueSize,
		Grace: 20 * time.Second, Slack: 2 * time.Second,
	}
}

// liveBudgetLocked counts the nodes out now, from the watch, against the
// largest budgets of the last ten minutes (a budget made smaller does not
// send nodes back): a count over them for more than five seconds is a
// breach (a shorter one can be the watch listing again after an outage).
func (o *observer) liveBudgetLocked(now time.Time) {
	if len(o.settings) == 0 {
		return
	}
	b := o.budgetCheckLocked()
	b.Grace = 10 * time.Minute
	out := 0
	byClique := map[string]int{}
	for n, p := range o.phase {
		if outPhase(p) {
			out++
			byClique[o.clique[n]]++
		}
	}
	o.maxOut = max(o.maxOut, out)
	inv, what := "", ""
	o.checks[invBudgetGlobal]++
	if g, _ := b.allowed(now, 0); g >= 0 && out > g {
		inv, what = invBudgetGlobal, fmt.Sprintf("%d nodes out, the budget allows %d", out, g)
	}
	for c, n := range byClique {
		o.checks[invBudgetClique]++
		if _, l := b.allowed(now, o.cliqueSize[c]); c != "" && l >= 0 && n > l {
			inv, what = invBudgetClique, fmt.Sprintf("%d nodes of clique %s out, the budget allows %d", n, c, l)
		}
	}
	switch {
	case what == "":
		o.overSince = time.Time{}
	case o.overSince.IsZero():
		o.overSince = now
	case now.Sub(o.overSince) > 5*time.Second:
		o.addLiveLocked(breach{inv, "(fleet)", fmt.Sprintf("seen live in the watch since %s: %s", o.overSince.UTC().Format(time.RFC3339), what)})
	}
}

// sampleBudgets re-evaluates the live count every second, so that a count
// over the budget is caught even when no further watch event comes.
func (o *observer) sampleBudgets(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.mu.Lock()
			o.liveBudgetLocked(now)
			o.mu.Unlock()
		}
	}
}

// phases counts the nodes by phase now.
func (o *observer) phases() map[gpuhealthv1alpha1.NodeHealthPhase]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[gpuhealthv1alpha1.NodeHealthPhase]int{}
	for _, p := range o.phase {
		out[p]++
	}
	return out
}

// outOfService lists the nodes whose workflow a human could end with an
// uncordon now: Quarantined, Draining, Recertifying or Failed, cordoned by
// gpuhealth (its applied annotation), and not one of the pre-marked nodes.
func (o *observer) outOfService() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for n, p := range o.phase {
		switch p {
		case gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying, gpuhealthv1alpha1.PhaseFailed:
		default:
			continue
		}
		if _, pre := o.pre[n]; pre || !o.unschedulable[n] || !o.applied[n] {
			continue
		}
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// final runs the checks on the whole run's records: budgets at every start
// of a stretch out, Jobs per cycle, Events per transition, each history one
// chain. It returns the breaches (the live ones first) and the transition
// counts.
func (o *observer) final() ([]breach, []transitionCount) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := append([]breach(nil), o.live...)
	var ivs []interval
	cycles := map[string][]time.Time{}
	nodes := make([]string, 0, len(o.transitions))
	for n := range o.transitions {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		ts := o.transitions[n]
		ivs = append(ivs, outIntervals(n, o.clique[n], ts)...)
		cycles[n] = cycleStarts(ts)
		o.checks[invHistory]++
		out = append(out, checkChain(n, ts)...)
	}
	o.checks[invBudgetGlobal] += len(ivs)
	o.checks[invBudgetClique] += len(ivs)
	out = append(out, checkBudgets(ivs, o.budgetCheckLocked())...)
	jobs := make([]jobRecord, 0, len(o.jobs))
	for _, j := range o.jobs {
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].Name < jobs[j].Name })
	o.checks[invJobs] += len(jobs)
	out = append(out, checkJobs(jobs, cycles, time.Second)...)
	events := make([]eventRecord, 0, len(o.events))
	for _, e := range o.events {
		events = append(events, e)
	}
	counts, eb := compareEvents(o.transitions, events)
	o.checks[invEvents] += len(counts)
	out = append(out, eb...)
	return out, counts
}

// tally is the run's totals the report prints, from the records.
func (o *observer) tally() (transitions, jobs, events int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ts := range o.transitions {
		for _, t := range ts {
			if t.From != "" {
				transitions++
			}
		}
	}
	for _, e := range o.events {
		if _, ok := eventTargets[e.Action]; ok && transitionNote.MatchString(e.Note) {
			events += e.Count
		}
	}
	return transitions, len(o.jobs), events
}

// eventsCount is the sum of the transition Events' counts seen so far.
func (o *observer) eventsCount() int {
	_, _, e := o.tally()
	return e
}

func (o *observer) countCheck(inv string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checks[inv] += n
}

func (o *observer) checksDone() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for k, v := range o.checks {
		out[k] = v
	}
	return out
}

func taintString(t corev1.Taint) string { return t.Key + ":" + string(t.Effect) }

// maxOutSeen is the most nodes the watch saw out at once.
func (o *observer) maxOutSeen() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.maxOut
}
