package nodehealth

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	"github.com/gpuhealth/gpuhealth/remediation/member"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// Policy defaults for fields an older stored object may lack (the CRD
// schema defaults them for new objects).
const (
	defaultJobTimeout  = 30 * time.Minute
	defaultBackoff     = 5 * time.Minute
	defaultSoak        = 10 * time.Minute
	defaultMaxAttempts = 3
)

// nodeIntent is what the plan wants done to the Node itself.
type nodeIntent int

const (
	// nodeUnchanged leaves the Node as it is (excluded, dry run).
	nodeUnchanged nodeIntent = iota
	// nodeFence cordons and taints a healthy node with a counting finding,
	// and nothing else: the bookkeeping follows in the next pass.
	nodeFence
	// nodeOutOfService keeps the node cordoned, tainted and labelled with
	// its phase, with GPUHealthy False.
	nodeOutOfService
	// nodeInService lifts what gpuhealth put on the node and sets
	// GPUHealthy True; after the status write when the node returns.
	nodeInService
	// nodeUncertified keeps a certifying node tainted uncertified (not
	// cordoned) and labelled with its phase, with GPUHealthy False.
	nodeUncertified
)

// plan is what decide wants: the status to write, what to do to the node,
// the Jobs, and what to announce once the status is written. apply carries
// it out and record writes it.
type plan struct {
	// status is the NodeHealth status to write.
	status gpuhealthv1alpha1.NodeHealthStatus
	// judged are the findings with the status each should get.
	judged []judgement
	// transitions are the state machine's moves, in order.
	transitions []transitionRecord
	// illegal are the events the machine refused (each a bug, counted).
	illegal []fsm.IllegalTransitionError
	// announce are the Events the status write makes true; published only
	// after it succeeded.
	announce []announcement
	// steps are the suite steps judged in this pass, counted after the write.
	steps []stepRecord
	// repairs are the fault outages that ended, faultGaps the times since
	// the previous fault of a class; counted after the write.
	repairs   []repairRecord
	faultGaps []faultGap
	// handOff is the hand-off to carry out before the write (idempotent),
	// handedOff the one the status records, counted after the write.
	handOff   *handOffTarget
	handedOff *gpuhealthv1alpha1.HandOffStatus
	// withdraw is a hand-off the plan ends, taken back before the write.
	withdraw *gpuhealthv1alpha1.HandOffStatus
	// node is what to do to the Node; nodeMessage explains GPUHealthy.
	node                    nodeIntent
	nodeReason, nodeMessage string
	// createJobs are the Jobs to create (idempotent: names are deterministic).
	createJobs []*batchv1.Job
	// deleteJobs deletes the node's unfinished Jobs (the workflow ended).
	deleteJobs bool
	// deleteDaemonPods are a dead member's stale ComputeDomain daemon pods.
	deleteDaemonPods []*corev1.Pod
	// removeDomainLabel removes a dead member's ComputeDomain node label
	// (the policy's releaseDeadMemberLabel).
	removeDomainLabel bool
	// reserveBreaker asks the circuit breaker for one more quarantine.
	reserveBreaker bool
	// confirmBudget says a drain was decided from a cache count: it is
	// confirmed from the apiserver before the status is written.
	confirmBudget bool
	// budgetBlocked names the budget the node started waiting for (counted).
	budgetBlocked gpuhealthv1alpha1.BudgetName
	// fenceOnly: the pass only fences; nothing is written to status.
	fenceOnly bool
	// requeue is the earliest deadline a step waits for; zero when none.
	requeue time.Duration
	// immediate asks for the next pass right after this one's write.
	immediate bool
	// err is a decision that cannot be made; terminal when retrying cannot
	// help (an unknown phase).
	err      error
	terminal bool
}

// transitionRecord is one move of the state machine, for the metrics.
type transitionRecord struct {
	from, to gpuhealthv1alpha1.NodeHealthPhase
	reason   string
	// spent is how long the node was in the phase it left.
	spent time.Duration
}

// decider carries one decision: the observation, the machine and the plan.
type decider struct {
	o       *observation
	machine *fsm.Machine
	p       *plan
	// attemptStarted: the pass started a recertification attempt, whose
	// Jobs wait for the next pass (after its start is written down).
	attemptStarted bool
	// first: gpuhealth manages the node from this pass on (no phase yet).
	first bool
}

// decide is the state machine: from what was observed, what to do. It is a
// pure function of the observation (no client, no clock, no globals), so
// every branch is a row of decide_test.go.
func decide(o *observation) *plan {
	d := &decider{o: o, p: &plan{status: *o.nh.Status.DeepCopy()}}
	st := &d.p.status
	if o.nh.Spec.Exclude {
		d.condition(gpuhealthv1alpha1.NodeHealthManagedCondition, false, gpuhealthv1alpha1.ReasonExcluded,
			"spec.exclude is true: gpuhealth does not touch this node")
		return d.p
	}
	d.condition(gpuhealthv1alpha1.NodeHealthManagedCondition, true, gpuhealthv1alpha1.ReasonManaged, "managed by RemediationPolicy "+o.policy.Name)
	var err error
	if d.machine, err = fsm.New(st.Phase); err != nil {
		d.p.err, d.p.terminal = fmt.Errorf("nodehealth %s: %w", o.nh.Name, err), true
		return d.p
	}
	if st.Phase == "" {
		d.first = true
		fsm.Record(st, "", gpuhealthv1alpha1.PhaseHealthy, gpuhealthv1alpha1.ReasonManaged, "managed by RemediationPolicy "+o.policy.Name, "", o.now)
	}
	d.p.judged = judgeAll(o)
	for _, j := range d.p.judged {
		if !j.recheckAt.IsZero() {
			d.wait(j.recheckAt.Sub(o.now.Time))
		}
	}
	d.activeEvents()
	d.request()
	if d.machine.Phase() != gpuhealthv1alpha1.PhaseHealthy && !d.dryRun() && o.uncordonedBy != "" {
		d.closeFindings(fsm.Cancel, gpuhealthv1alpha1.ReasonHumanUncordon,
			"uncordoned by "+o.uncordonedBy+"; the workflow for the node's current findings is cancelled", o.uncordonedBy)
		d.housekeeping()
		return d.p
	}
	prevBlocking := st.BlockingBudget
	st.BlockingBudget = ""
	d.membership()
	d.phases()
	if d.p.fenceOnly {
		return d.p
	}
	if st.BlockingBudget != "" && st.BlockingBudget != prevBlocking {
		d.p.budgetBlocked = st.BlockingBudget
		d.domainEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonMemberWaitingForBudget, "Drain",
			"member %s is quarantined and waits for budget %s: %s", o.node.Name, st.BlockingBudget, budgetCounts(o.budgets))
	}
	d.housekeeping()
	return d.p
}

// housekeeping follows the phase's step, in the phase it ended in.
func (d *decider) housekeeping() {
	st := &d.p.status
	d.membership()
	phase := d.machine.Phase()
	if phase != gpuhealthv1alpha1.PhaseDraining {
		// A human released or cancelled the drain: nothing waits to leave.
		msg := "the node is no longer draining (" + string(phase) + ")"
		d.clearCondition(gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, gpuhealthv1alpha1.ReasonNotDraining, msg)
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition, gpuhealthv1alpha1.ReasonNotDraining, msg)
	}
	if phase != gpuhealthv1alpha1.PhaseHealthy {
		d.deadMember()
	} else {
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition, gpuhealthv1alpha1.ReasonNotDeadMember, "the node is back in service")
	}
	if d.p.node == nodeOutOfService || d.p.node == nodeUncertified {
		d.p.nodeReason, d.p.nodeMessage = d.nodeCondition()
	}
	d.certifiedCondition()
	st.ObservedGeneration = d.o.nh.Generation
}

// phases runs the phase steps. Each may fire a transition and hand on to
// the next phase's step in the same pass, so a node goes from a finding to
// draining in two passes (the fence, then the write-up).
func (d *decider) phases() {
	for range 5 {
		phase := d.machine.Phase()
		switch phase {
		case gpuhealthv1alpha1.PhaseHealthy:
			d.healthy()
		case gpuhealthv1alpha1.PhaseCertifying:
			d.certifying()
		case gpuhealthv1alpha1.PhaseQuarantined:
			d.quarantined()
		case gpuhealthv1alpha1.PhaseDraining:
			d.draining()
		case gpuhealthv1alpha1.PhaseRecertifying:
			d.recertifying()
		case gpuhealthv1alpha1.PhaseMaintenance:
			d.outOfService()
		case gpuhealthv1alpha1.PhaseFailed:
			d.outOfService()
			d.handOffFailed()
		}
		if d.p.fenceOnly || d.p.immediate || d.machine.Phase() == phase {
			return
		}
	}
	// Five moves in one pass means the table loops: say so, and look again.
	d.p.err = fmt.Errorf("nodehealth %s: the state machine did not settle within five moves (now %s)", d.o.nh.Name, d.machine.Phase())
}

func (d *decider) dryRun() bool { return d.o.policy.Spec.DryRun }

// counting returns the findings that count against the node now.
func (d *decider) counting() []judgement { return countingOf(d.p.judged) }

// action is the most drastic action of the counting findings, Recertify when none.
func (d *decider) action() gpuhealthv1alpha1.Action {
	best := gpuhealthv1alpha1.ActionRecertify
	for _, j := range d.counting() {
		if actionRank[j.action] > actionRank[best] {
			best = j.action
		}
	}
	return best
}

// wait asks for a pass within dur.
func (d *decider) wait(dur time.Duration) {
	if dur <= 0 {
		dur = time.Second
	}
	if d.p.requeue == 0 || dur < d.p.requeue {
		d.p.requeue = dur
	}
}

// healthy keeps a healthy node in service and quarantines it when a finding
// counts against it.
func (d *decider) healthy() {
	o, counting := d.o, d.counting()
	if len(counting) == 0 {
		if reason, message, request, ok := d.certificationRequest(d.first); ok {
			d.startCertification(reason, message, request)
			return
		}
		// The reason of the transition into Healthy (Recertified,
		// ManualRelease, …) stays until the next one.
		if !d.dryRun() {
			d.inService()
		}
		return
	}
	reason, message := gpuhealthv1alpha1.ReasonFault, describe(counting)
	// A node gpuhealth already fenced (before, or before a crash) was let
	// through the breaker then; asking again would count it twice.
	fenced := nodepkg.AppliedOn(o.node).Any()
	if !fenced {
		if o.breaker == nil {
			d.p.err = fmt.Errorf("nodehealth %s: a quarantine was decided without the circuit breaker's state", o.nh.Name)
			return
		}
		if !o.breaker.allowed {
			d.statusReason(gpuhealthv1alpha1.ReasonCircuitBreakerOpen, "not quarantined: circuit breaker "+o.breaker.message+"; findings: "+message)
			d.wait(breakerRecheck)
			return
		}
		d.p.reserveBreaker = true
	}
	switch {
	case d.dryRun():
		reason, message = gpuhealthv1alpha1.ReasonDryRun, "dry run, would cordon and taint: "+message
	case !fenced && fences(o.policy):
		// Fence first: the first write after a quarantining finding is the
		// cordon and taint, nothing else, and the bookkeeping (the
		// transition, the node condition, the finding's status) follows in
		// the next pass at a lower priority. In a storm every sick node is
		// fenced before any is written up, so the apiserver's write budget
		// goes to stopping new work landing on bad GPUs first.
		d.p.node, d.p.fenceOnly = nodeFence, true
		return
	case fenced && o.stormHold > 0:
		// The bookkeeping after our fence waits while other nodes are
		// still being fenced (see stormGate).
		d.p.fenceOnly = true
		d.p.requeue = o.stormHold
		return
	}
	if d.transition(fsm.Quarantine, reason, message, "") {
		d.markObserved(counting)
	}
}

// inService lifts what gpuhealth put on a node that is healthy again.
func (d *decider) inService() {
	d.p.node, d.p.nodeReason, d.p.nodeMessage = nodeInService, gpuhealthv1alpha1.ReasonHealthy, "no finding counts against the node"
}

// outOfService keeps an out-of-service node cordoned, tainted and labelled,
// recording the first time what a human had set before.
func (d *decider) outOfService() {
	if d.dryRun() {
		return
	}
	// What gpuhealth did not add itself was there before (the applied
	// annotation lists what it added), so this holds even when the fence
	// and the status write happened in different passes.
	pre := nodepkg.PreexistingOn(d.o.node, nodepkg.Taint(d.o.policy.Spec.Quarantine.Taint))
	d.p.status.PreexistingCordon, d.p.status.PreexistingTaints = pre.Cordon, pre.Taints
	d.p.node = nodeOutOfService
}

// nodeCondition is GPUHealthy for an out-of-service node: why it is out of
// service (the cause of its last transition), not what it waits for now, so
// it changes with the phase rather than with every budget recount.
func (d *decider) nodeCondition() (string, string) {
	st := &d.p.status
	if h := st.History; len(h) > 0 {
		last := h[len(h)-1]
		return last.Reason, fmt.Sprintf("%s: %s", last.To, last.Message)
	}
	return st.Reason, st.Message
}

// quarantined holds the node cordoned until the budgets let it drain.
func (d *decider) quarantined() {
	d.outOfService()
	o, st := d.o, &d.p.status
	if d.dryRun() {
		if len(d.counting()) == 0 {
			d.closeFindings(fsm.Cancel, gpuhealthv1alpha1.ReasonDryRun, "dry run: no finding counts against the node any more", "")
			return
		}
		d.statusReason(gpuhealthv1alpha1.ReasonDryRun, "dry run: would drain when the budgets allow")
		return
	}
	if d.held("the node stays quarantined") {
		return
	}
	if rc := st.Recertification; rc != nil && rc.Result == gpuhealthv1alpha1.JobFailed && rc.CompletedAt != nil {
		if until := rc.CompletedAt.Add(o.policy.Spec.Recertification.Backoff.Get(defaultBackoff)); o.now.Before(&metav1.Time{Time: until}) {
			d.statusReason(gpuhealthv1alpha1.ReasonBackoff, fmt.Sprintf("attempt %d failed; next attempt after %s", rc.Attempt, until.UTC().Format(time.RFC3339)))
			d.wait(until.Sub(o.now.Time))
			return
		}
	}
	b := o.budgets
	if b == nil {
		// Entered in this pass without a count: count in the next one.
		d.p.immediate = true
		return
	}
	if b.err != nil || len(b.blocked) > 0 {
		d.waitForBudget()
		return
	}
	msgs := make([]string, len(b.decisions))
	for i, dec := range b.decisions {
		msgs[i] = dec.Message()
	}
	if !d.transition(fsm.Drain, gpuhealthv1alpha1.ReasonDraining, "budgets allow: "+strings.Join(msgs, "; "), "") {
		return
	}
	st.Drain = &gpuhealthv1alpha1.DrainStatus{StartedAt: &o.now}
	// The drain itself starts in the next pass, once this one's write (the
	// budget's slot) is down.
	d.p.confirmBudget = !b.fromAPIServer
	d.p.immediate = true
}

// waitForBudget records that the node waits for a budget: status.reason
// WaitingForBudget, status.blockingBudget the first budget without room and
// the message every blocking budget by name, limit and scope. The live
// counts stay out of the status (they are in the policy's status), so a
// count that moves does not rewrite every waiting node.
func (d *decider) waitForBudget() {
	b, st := d.o.budgets, &d.p.status
	name := gpuhealthv1alpha1.BudgetMaxUnavailable
	msg := "waiting for budget: "
	if b.err != nil {
		msg += b.err.Error()
		if len(b.decisions) > 0 {
			name = gpuhealthv1alpha1.BudgetName(b.decisions[len(b.decisions)-1].Name)
		}
	} else {
		name = gpuhealthv1alpha1.BudgetName(b.decisions[b.blocked[0]].Name)
		full := make([]string, len(b.blocked))
		for i, k := range b.blocked {
			full[i] = b.decisions[k].Full()
		}
		msg += strings.Join(full, "; ")
	}
	d.statusReason(gpuhealthv1alpha1.ReasonWaitingForBudget, msg)
	st.BlockingBudget = name
	d.wait(budgetRecheck)
}

// budgetCounts is the blocking budgets' live counts, for the domain's Event.
func budgetCounts(b *budgetCount) string {
	if b == nil {
		return ""
	}
	if b.err != nil {
		return b.err.Error()
	}
	numbers := make([]string, len(b.blocked))
	for i, k := range b.blocked {
		numbers[i] = b.decisions[k].Message()
	}
	return strings.Join(numbers, "; ")
}

// draining follows the drain and moves on when no pod is left.
func (d *decider) draining() {
	d.outOfService()
	o, st := d.o, &d.p.status
	if d.held("the drain is paused") {
		return
	}
	if st.Drain == nil || st.Drain.StartedAt == nil {
		st.Drain = &gpuhealthv1alpha1.DrainStatus{StartedAt: &o.now}
	}
	ds := st.Drain
	if o.drain == nil {
		if !d.dryRun() {
			d.p.immediate = true // entered in this pass: drain in the next
		}
		return
	}
	if o.drain.err != nil {
		d.p.err = o.drain.err
	}
	res := o.drain.result
	ds.PodsRemaining = int32(res.Remaining)
	ds.PodsTotal = max(ds.PodsTotal, int32(res.Total))
	ds.PodsBlocked = int32(res.Blocked)
	ds.Blocked = res.BlockedPods
	d.drainTimeout()
	if !res.Done() || o.drain.err != nil {
		ds.CompletedAt = nil
		msg := fmt.Sprintf("%d of %d pods remaining", res.Remaining, ds.PodsTotal)
		reason := gpuhealthv1alpha1.ReasonDraining
		if res.Blocked > 0 {
			reason = gpuhealthv1alpha1.ReasonBlockedByPDB
			msg += fmt.Sprintf(", %d blocked by a PodDisruptionBudget", res.Blocked)
		}
		if res.Waiting > 0 {
			msg += fmt.Sprintf(", %d waiting for completion", res.Waiting)
		}
		if res.TimedOut > 0 {
			reason = gpuhealthv1alpha1.ReasonDrainTimedOut
			msg += fmt.Sprintf(", %d past the drain timeout", res.TimedOut)
		}
		d.statusReason(reason, msg)
		if res.Deferred > 0 {
			d.wait(drainDeferredRecheck)
		} else {
			d.wait(drainRecheck)
		}
		return
	}
	if ds.CompletedAt == nil {
		ds.CompletedAt = &o.now
	}
	if !d.leftComputeDomain() {
		return
	}
	if a := d.action(); needsHuman(a) {
		d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonNeedsHuman, fmt.Sprintf("drained; the findings recommend %s: %s", a, describe(d.counting())), "")
		return
	}
	if d.maintained() {
		return
	}
	attempt := int32(1)
	if rc := st.Recertification; rc != nil {
		attempt = rc.Attempt + 1
	}
	if !d.transition(fsm.Recertify, gpuhealthv1alpha1.ReasonRecertifying, fmt.Sprintf("drained; recertification attempt %d", attempt), "") {
		return
	}
	st.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: attempt, StartedAt: &o.now, Result: gpuhealthv1alpha1.JobPending}
	d.attemptStarted = true
}

// drainTimeout keeps the DrainTimedOut condition: True while pods that must
// leave outlived the drain timeout and the policy waits for them
// (drain.onTimeout Wait), with one Warning Event when it turns True.
func (d *decider) drainTimeout() {
	res, st := d.o.drain.result, &d.p.status
	if res.TimedOut == 0 {
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition, gpuhealthv1alpha1.ReasonDrainOnTime, "no pod is left past the drain timeout")
		return
	}
	names := make([]string, 0, len(res.TimedOutPods))
	for _, p := range res.TimedOutPods {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	msg := fmt.Sprintf("%d pods that must leave are still on the node past the drain timeout (drain.onTimeout Wait): %s",
		res.TimedOut, strings.Join(names, ", "))
	if !meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition) {
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonDrainTimedOut, "Drain", "%s", msg)
	}
	d.condition(gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition, true, gpuhealthv1alpha1.ReasonDrainTimedOut, msg)
}

// recertifying runs the remediation step, the recertification Job and the
// soak window, then returns the node or counts a failed attempt.
func (d *decider) recertifying() {
	d.outOfService()
	o, st := d.o, &d.p.status
	if d.held("recertification is paused") {
		return
	}
	rc, wait := d.currentAttempt(&st.Recertification)
	if wait {
		return
	}
	if d.dryRun() {
		return
	}
	spec := o.policy.Spec
	if kind, step := remediationStep(d.action(), spec.Remediation); step != nil {
		if !d.remediated(kind, step, rc) {
			return
		}
	}
	steps := recertificationSteps(spec.Recertification)
	if rc.CompletedAt == nil {
		done, passed, why := d.runSuite(job.Recertification, gpuhealthv1alpha1.SuiteRecertification, steps, rc, gpuhealthv1alpha1.ReasonRecertifying)
		if !done {
			return
		}
		if !passed {
			d.failAttempt(why)
			return
		}
		rc.CompletedAt = &o.now
		rc.Result = gpuhealthv1alpha1.JobSucceeded
		if len(steps) == 0 {
			rc.Message = "no recertification suite configured; the soak window decides"
		}
	}
	for _, j := range d.counting() {
		if j.event.Status.LastSeen != nil && j.event.Status.LastSeen.After(rc.StartedAt.Time) {
			d.failAttempt("a new finding during recertification: " + describe([]judgement{j}))
			return
		}
	}
	soakEnd := rc.CompletedAt.Add(spec.Recertification.SoakWindow.Get(defaultSoak))
	if o.now.Before(&metav1.Time{Time: soakEnd}) {
		d.statusReason(gpuhealthv1alpha1.ReasonSoaking, fmt.Sprintf("recertification passed; soaking until %s", soakEnd.UTC().Format(time.RFC3339)))
		d.wait(soakEnd.Sub(o.now.Time))
		return
	}
	requireFabric := spec.Recertification.RequireFabricHealthy == nil || *spec.Recertification.RequireFabricHealthy
	var open []judgement
	for _, j := range d.p.judged {
		if j.phase != gpuhealthv1alpha1.EventActive || j.event.Spec.IsPoint() {
			continue
		}
		if j.counts || (requireFabric && j.event.Spec.IsFabric()) {
			open = append(open, j)
		}
	}
	if len(open) > 0 {
		d.statusReason(gpuhealthv1alpha1.ReasonWaitingForResolution, "recertification passed; waiting for findings to clear: "+describe(open))
		return
	}
	if len(steps) > 0 {
		d.certify(gpuhealthv1alpha1.SuiteRecertification, rc)
	}
	d.closeFindings(fsm.Pass, gpuhealthv1alpha1.ReasonRecertified, fmt.Sprintf("recertification attempt %d passed (%s) and the soak window was clean", rc.Attempt, suiteSummary(rc.Steps)), "")
}

// currentAttempt is the attempt *slot holds, starting attempt 1 when it
// holds none. wait says the attempt started in this pass: it is written
// down before any Job exists (Job names carry the attempt's start, and a
// restart must find the same start to find the same Jobs).
func (d *decider) currentAttempt(slot **gpuhealthv1alpha1.RecertificationStatus) (rc *gpuhealthv1alpha1.RecertificationStatus, wait bool) {
	if *slot == nil || (*slot).StartedAt == nil {
		*slot = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &d.o.now, Result: gpuhealthv1alpha1.JobPending}
		d.attemptStarted = true
	}
	if d.attemptStarted {
		d.p.immediate = true
	}
	return *slot, d.attemptStarted
}

// remediationStep picks the reset or reboot step the action asks for, when
// the policy configures one.
func remediationStep(a gpuhealthv1alpha1.Action, spec gpuhealthv1alpha1.RemediationSpec) (job.Kind, *gpuhealthv1alpha1.RemediationStep) {
	switch a {
	case gpuhealthv1alpha1.ActionResetGPU:
		return job.ResetGPU, spec.ResetGPU
	case gpuhealthv1alpha1.ActionRebootNode:
		return job.RebootNode, spec.RebootNode
	}
	return "", nil
}

// remediated runs the reset or reboot step and says whether it is done. A
// GPU reset is done when its Job succeeded (the recertification that
// follows proves it). A reboot is done when the node reports a boot ID other
// than the one it had when the step started and is Ready again, within the
// step's timeout: a real reboot kills the Job's own pod, so the Job's
// failure or disappearance is expected, not a verdict. A node that reports
// no boot ID (some simulated nodes) falls back to the Job's result.
func (d *decider) remediated(kind job.Kind, step *gpuhealthv1alpha1.RemediationStep, rc *gpuhealthv1alpha1.RecertificationStatus) bool {
	o := d.o
	timeout := step.Timeout.Get(defaultJobTimeout)
	want := job.Build(kind, o.node.Name, o.namespace, rc.Attempt, rc.StartedAt.Time, step.Job, timeout)
	if kind != job.RebootNode {
		rc.RemediationJob = want.Name
		return d.jobSucceeded(want, gpuhealthv1alpha1.ReasonRemediating)
	}
	boot := o.node.Status.NodeInfo.BootID
	if rc.RemediationStartedAt == nil {
		// Write down the boot ID before the Job exists, so the reboot is
		// measured against the boot it ends.
		rc.RemediationStartedAt, rc.BootID = &o.now, boot
		d.p.immediate = true
		return false
	}
	if rc.BootID == "" {
		rc.RemediationJob = want.Name
		return d.jobSucceeded(want, gpuhealthv1alpha1.ReasonRemediating)
	}
	if boot != rc.BootID && (member.Ready(o.node) || rc.JobName != "" || rc.CompletedAt != nil) {
		// Back with a new boot; once past this step (its recertification
		// planned or done), a later NotReady is no reboot still under way.
		return true
	}
	deadline := rc.RemediationStartedAt.Add(timeout)
	if !o.now.Before(&metav1.Time{Time: deadline}) {
		what := "did not report a new boot ID"
		if boot != rc.BootID {
			what = "rebooted but is not Ready"
		}
		d.failAttempt(fmt.Sprintf("reboot: node %s %s within %s (boot ID %s)", o.node.Name, what, timeout, rc.BootID))
		return false
	}
	live := o.jobs[want.Name]
	if rc.RemediationJob != want.Name {
		// Created once: a Job that vanishes with its pod in the reboot is
		// not made again (that would reboot the node a second time).
		rc.RemediationJob = want.Name
		if live == nil {
			d.p.createJobs = append(d.p.createJobs, want)
		}
	}
	state := "job " + want.Namespace + "/" + want.Name + " gone"
	if live != nil {
		_, state = job.Result(live)
		state = "job " + want.Namespace + "/" + want.Name + ": " + state
	}
	d.statusReason(gpuhealthv1alpha1.ReasonRemediating, fmt.Sprintf("attempt %d: rebooting (%s); waiting for a boot ID other than %s until %s",
		rc.Attempt, state, rc.BootID, deadline.UTC().Format(time.RFC3339)))
	d.wait(min(jobRecheck, deadline.Sub(o.now.Time)))
	return false
}

// jobSucceeded makes sure the Job exists and says whether it succeeded; a
// failed Job fails the attempt.
func (d *decider) jobSucceeded(want *batchv1.Job, waitingReason string) bool {
	rc := d.p.status.Recertification
	live := d.o.jobs[want.Name]
	if live == nil {
		d.p.createJobs = append(d.p.createJobs, want)
		live = want
	}
	result, msg := job.Result(live)
	switch result {
	case gpuhealthv1alpha1.JobSucceeded:
		return true
	case gpuhealthv1alpha1.JobFailed:
		d.failAttempt(fmt.Sprintf("job %s/%s: %s", live.Namespace, live.Name, msg))
		return false
	default:
		rc.Result = result
		d.statusReason(waitingReason, fmt.Sprintf("attempt %d: job %s/%s %s", rc.Attempt, live.Namespace, live.Name, msg))
		d.wait(jobRecheck)
		return false
	}
}

// failAttempt records a failed recertification attempt: back to quarantine
// for another, or Failed when the attempts are used up.
func (d *decider) failAttempt(why string) {
	rc := d.p.status.Recertification
	rc.Result, rc.CompletedAt, rc.Message = gpuhealthv1alpha1.JobFailed, &d.o.now, truncate(why, 1024)
	maxAttempts := d.o.policy.Spec.Recertification.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = defaultMaxAttempts
	}
	msg := fmt.Sprintf("recertification attempt %d of %d failed: %s", rc.Attempt, maxAttempts, why)
	if rc.Attempt >= maxAttempts {
		d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonRecertificationExhausted, msg, "")
		return
	}
	d.transition(fsm.FailRecertification, gpuhealthv1alpha1.ReasonRecertificationFailed, msg, "")
}

// closeFindings returns the node to service: it closes the findings that
// led here (so they do not quarantine it again), ends the node's running
// Jobs, lifts what gpuhealth put on the node (after the status write) and
// fires the event.
func (d *decider) closeFindings(e fsm.Event, reason, message, by string) {
	running := d.runningJobs()
	if len(running) > 0 && !d.dryRun() {
		message += "; deleting unfinished jobs " + strings.Join(running, ", ")
		d.p.deleteJobs = true
	}
	if !d.transition(e, reason, message, by) {
		return
	}
	d.supersede()
	st := &d.p.status
	st.Drain, st.Recertification, st.Certification, st.ActiveEvents = nil, nil, nil, nil
	for i := range d.p.judged {
		d.p.judged[i].counts = false
	}
	if !d.dryRun() {
		d.inService()
	}
}

// runningJobs names the node's Jobs that have not finished.
func (d *decider) runningJobs() []string {
	var out []string
	for name, j := range d.o.jobs {
		if r, _ := job.Result(j); r != gpuhealthv1alpha1.JobSucceeded && r != gpuhealthv1alpha1.JobFailed && j.DeletionTimestamp == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// supersede closes the node's active findings seen up to now.
func (d *decider) supersede() {
	now := d.o.now
	for _, j := range d.p.judged {
		if j.phase != gpuhealthv1alpha1.EventActive {
			continue
		}
		st := &j.event.Status
		st.SupersededAt, st.Phase = &now, gpuhealthv1alpha1.EventSuperseded
		// A debounce counts from here: what led here does not count again.
		st.SupersededCount = st.Count
		st.Occurrences = []gpuhealthv1alpha1.OccurrenceSample{{Time: now, Count: st.Count}}
	}
}

// markObserved records on each finding the transition it caused.
func (d *decider) markObserved(js []judgement) {
	last := d.p.status.History[len(d.p.status.History)-1]
	for _, j := range js {
		j.event.Status.ObservedBy = &gpuhealthv1alpha1.TransitionRef{From: last.From, To: last.To, Time: last.Time}
	}
}

// activeEvents summarises the active findings in status, most severe first.
func (d *decider) activeEvents() {
	st := &d.p.status
	st.ActiveEvents = nil
	for _, j := range d.p.judged {
		if j.phase != gpuhealthv1alpha1.EventActive || len(st.ActiveEvents) == 32 {
			continue
		}
		st.ActiveEvents = append(st.ActiveEvents, gpuhealthv1alpha1.FindingRef{
			Name: j.event.Name, Check: j.event.Spec.Check, Code: j.event.Spec.Code, Severity: j.event.Spec.Severity,
			Verdict: j.verdict, RecommendedAction: j.action,
		})
	}
}

// transition fires an event of the machine and records it in status, with
// its Event to publish once written. An illegal event is counted, never
// written; it returns false.
func (d *decider) transition(e fsm.Event, reason, message, by string) bool {
	from, to, err := d.machine.Fire(context.Background(), e)
	if err != nil {
		d.p.illegal = append(d.p.illegal, fsm.IllegalTransitionError{Phase: from, Event: e})
		return false
	}
	o := d.o
	var spent time.Duration
	if since := d.p.status.Since; since != nil {
		spent = o.now.Sub(since.Time)
	}
	fsm.Record(&d.p.status, from, to, reason, truncate(message, 1024), truncate(by, 253), o.now)
	d.p.transitions = append(d.p.transitions, transitionRecord{from: from, to: to, reason: reason, spent: spent})
	d.outage(from, to, reason)
	eventType := corev1.EventTypeNormal
	if to != gpuhealthv1alpha1.PhaseHealthy {
		eventType = corev1.EventTypeWarning
	}
	d.nodeEvent(eventType, reason, string(e), "%s → %s: %s", from, to, message)
	if (to == gpuhealthv1alpha1.PhaseQuarantined || to == gpuhealthv1alpha1.PhaseFailed) && o.cd.member() {
		d.domainEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonMemberQuarantined, string(e),
			"member %s is out of service (%s → %s, %s): %s", o.node.Name, from, to, reason, message)
	}
	return true
}

// held records that spec.hold stops the phase's step and says whether it does.
func (d *decider) held(what string) bool {
	if !d.o.nh.Spec.Hold {
		return false
	}
	d.statusReason(gpuhealthv1alpha1.ReasonHeld, "spec.hold is true: "+what)
	return true
}

// statusReason records what the node waits for without a transition.
func (d *decider) statusReason(reason, message string) {
	d.p.status.Reason, d.p.status.Message = reason, truncate(message, 1024)
}

// clearCondition sets condition t False, when it is True now.
func (d *decider) clearCondition(t, reason, message string) {
	if meta.IsStatusConditionTrue(d.p.status.Conditions, t) {
		d.condition(t, false, reason, message)
	}
}

func (d *decider) condition(t string, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&d.p.status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: truncate(message, 1024), ObservedGeneration: d.o.nh.Generation, LastTransitionTime: d.o.now,
	})
}
