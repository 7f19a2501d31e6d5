package nodehealth

import (
	"context"
	"fmt"
	"slices"
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
	// nodeHeld sets GPUHealthy Unknown, QuarantineHeld, and nothing else: a
	// finding counts but the quarantine is held back. Unknown, not False,
	// so that a tool that repairs or replaces nodes on GPUHealthy=False
	// (Karpenter's node repair, a hand-off on the condition) does not act
	// on a node gpuhealth deliberately left alone; not True, which would
	// tell a scheduler the GPUs are fine.
	nodeHeld
)

// plan is what decide wants, in five groups by who acts on it and when:
// what record writes, what apply does to the cluster, what the admission
// step is asked for, what record announces and counts once its write went
// through, and how the pass goes on.
type plan struct {
	planWrite
	planActs
	planAsks
	planAfter
	planNext
}

// planWrite is what record writes: the findings' statuses, then the
// NodeHealth status once.
type planWrite struct {
	// status is the NodeHealth status to write.
	status gpuhealthv1alpha1.NodeHealthStatus
	// judged are the findings with the status each should get.
	judged []judgement
}

// planActs is what apply does to the cluster. Every act is idempotent, so
// a pass that fails part-way is repeated safely.
type planActs struct {
	// createNodeHealth creates the node's NodeHealth, which a node gets
	// when a policy first manages it.
	createNodeHealth bool
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
	// deviceActs are the one-GPU workflow's rules, claim templates and
	// Jobs to make before the write.
	deviceActs []deviceAct
	// returnDevices are the GPUs back in service: their rules and claim
	// templates are deleted once the status no longer names them.
	returnDevices []gpuhealthv1alpha1.DeviceStatus
	// handOff is the hand-off to carry out before the write.
	handOff *handOffTarget
	// withdraw is a hand-off the plan ends, taken back before the write.
	withdraw *gpuhealthv1alpha1.HandOffStatus
}

// planAsks is what the admission step is asked for before anything is
// carried out: the shared, counted resources a decision takes.
type planAsks struct {
	// reserveBreaker asks the circuit breaker for one more quarantine.
	reserveBreaker bool
	// reserveNetwork asks the node's group's network breaker for one more
	// quarantine for NIC findings.
	reserveNetwork bool
	// reserveDevices asks the device breaker for this many more GPUs out.
	reserveDevices int
	// confirmBudget says a drain was decided from a cache count: it is
	// confirmed from the apiserver before the status is written.
	confirmBudget bool
}

// planAfter is what the status write makes true, announced and counted only
// once it succeeded.
type planAfter struct {
	// transitions are the state machine's moves, in order.
	transitions []transitionRecord
	// illegal are the events the machine refused (each a bug, counted).
	illegal []fsm.IllegalTransitionError
	// announce are the Events to publish.
	announce []announcement
	// steps are the suite steps judged in this pass.
	steps []stepRecord
	// repairs are the fault outages that ended, faultGaps the times since
	// the previous fault of a class.
	repairs   []repairRecord
	faultGaps []faultGap
	// handedOff is the hand-off the status records.
	handedOff *gpuhealthv1alpha1.HandOffStatus
	// deviceMoves are the GPUs' moves.
	deviceMoves []deviceStepRecord
	// gangWaves are the gang waves first sent or held in this pass.
	gangWaves []gangWaveRecord
	// budgetBlocked names the budget the node started waiting for.
	budgetBlocked gpuhealthv1alpha1.BudgetName
}

// planNext is how the pass goes on.
type planNext struct {
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
	// askedApproval: an act of this pass waits for, or got, approval.
	askedApproval bool
	// heldDevices say why GPUs a finding names stay in service.
	heldDevices []string
}

// decide is the state machine: from what was observed, what to do. It is a
// pure function of the observation (no client, no clock, no globals), so
// every branch is a row of decide_test.go.
func decide(o *observation) *plan {
	d := &decider{o: o, p: &plan{planWrite: planWrite{status: *o.nh.Status.DeepCopy()}}}
	d.p.createNodeHealth = o.nhMissing
	st := &d.p.status
	if o.nh.Spec.Exclude {
		msg := "spec.exclude is true: gpuhealth does not touch this node"
		if running := d.runningJobs(); len(running) > 0 {
			// Held where it is, like a node no policy selects (unmanaged.go):
			// no privileged act goes on without a manager.
			d.p.deleteJobs = true
			msg += "; deleting its unfinished jobs " + strings.Join(running, ", ")
		}
		d.condition(gpuhealthv1alpha1.NodeHealthManagedCondition, false, gpuhealthv1alpha1.ReasonExcluded, msg)
		return d.p
	}
	if len(o.breaches) > 0 {
		// Whoever may edit a policy chooses its Jobs, which the operator
		// creates with its own rights: one the install's rules refuse is
		// never acted on, not even for the parts that would be harmless.
		d.condition(gpuhealthv1alpha1.NodeHealthManagedCondition, false, gpuhealthv1alpha1.ReasonJobRulesBreached,
			"RemediationPolicy "+o.policy.Name+" breaks the install's Job rules, so gpuhealth does nothing to this node until it is fixed: "+
				gpuhealthv1alpha1.FirstN(o.breaches, 3, "; "))
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
	if d.machine.Phase() != gpuhealthv1alpha1.PhaseHealthy && !d.dryRun() && humanUncordoned(o) {
		d.closeFindings(fsm.Cancel, gpuhealthv1alpha1.ReasonHumanUncordon,
			"uncordoned by "+o.uncordonedBy+"; the workflow for the node's current findings is cancelled", o.uncordonedBy)
		d.housekeeping()
		return d.p
	}
	prevBlocking := st.BlockingBudget
	st.BlockingBudget = ""
	d.membership()
	d.devices()
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

// inputs are the costly parts of an observation, which observe reads only
// when the decision needs them.
type inputs struct {
	// workloads: the pods a new node's certification would wait for.
	workloads bool
	// outputs: the finished suite Jobs' outputs that wait for a verdict.
	outputs bool
	// stormHold: how long the bookkeeping after our fence waits.
	stormHold bool
	// breaker: the circuit breaker's answer to one more quarantine.
	breaker bool
	// budgets: the budget counts from the cache.
	budgets bool
	// drain: a pass of the drain, before deciding.
	drain bool
	// devices: the one-GPU workflow's inputs (and its drain passes).
	devices bool
	// handOff: what a failed node's hand-off needs.
	handOff bool
	// network: the network breaker of the node's group (with breaker).
	network bool
}

// inputsFor says which costly inputs a decision on what observe has read so
// far needs: those of the node's phase.
func inputsFor(o *observation) inputs {
	var in inputs
	phase, policy := o.nh.Status.Phase, o.policy.Spec
	if o.nh.Spec.Exclude || len(o.breaches) > 0 || humanUncordoned(o) || newRequest(o.nh) {
		return in // decided without the phase's inputs
	}
	in.workloads = phase == "" && policy.Certification.NewNodes ||
		(phase == "" || phase == gpuhealthv1alpha1.PhaseHealthy) && certifyLabelRequest(o) != ""
	judged := judgeAll(o)
	in.devices = wantsDevices(o, judged)
	switch phase {
	case "", gpuhealthv1alpha1.PhaseHealthy, gpuhealthv1alpha1.PhaseCertifying:
		in.outputs = phase == gpuhealthv1alpha1.PhaseCertifying
		if len(judged) == 0 {
			break
		}
		fenced := nodepkg.AppliedOn(o.node).Any()
		in.stormHold, in.breaker = fenced, !fenced
		// The network breaker's group is read only for a quarantine it
		// could hold: every counting finding a NIC finding.
		in.network = !fenced && nicOnly(countingOf(judged))
		in.budgets = fenced || !policy.DryRun && !fences(o.policy)
	case gpuhealthv1alpha1.PhaseRecertifying:
		in.outputs = true
	case gpuhealthv1alpha1.PhaseQuarantined:
		in.budgets = true
	case gpuhealthv1alpha1.PhaseDraining:
		in.drain = !o.nh.Spec.Hold && !policy.DryRun
	case gpuhealthv1alpha1.PhaseFailed:
		in.handOff = policy.Remediation.HandOff != nil && !policy.DryRun
	}
	return in
}

// humanUncordoned says whether someone lifted the cordon gpuhealth put on a
// node it had taken out of service.
func humanUncordoned(o *observation) bool {
	phase := o.nh.Status.Phase
	return o.uncordonedBy != "" && phase != "" && phase != gpuhealthv1alpha1.PhaseHealthy
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
	if was := d.o.nh.Status.Phase; phase == gpuhealthv1alpha1.PhaseHealthy && was != "" && was != gpuhealthv1alpha1.PhaseHealthy && len(st.Devices) > 0 {
		d.releaseDevices("the node returned to service (" + st.Reason + "); its own workflow covered the GPU")
		d.devicesCondition()
	}
	if d.p.node == nodeInService && len(st.Devices) > 0 {
		// GPUHealthy stays True (the node is in service) and names the
		// GPUs out alone, for whoever reads only the Node.
		d.p.nodeMessage += "; " + devicesOut(st.Devices)
	}
	d.certifiedCondition()
	d.approvalUnasked()
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
		d.backInService()
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
			d.quarantineHeld("circuit breaker "+o.breaker.message, message)
			d.wait(breakerRecheck)
			return
		}
		if nicOnly(counting) && o.network == nil {
			d.p.err = fmt.Errorf("nodehealth %s: a quarantine for NIC findings was decided without the network breaker's state", o.nh.Name)
			return
		}
		if nw := o.network; nw != nil && nw.enabled && nicOnly(counting) {
			if !nw.allowed {
				msg := "network circuit breaker of " + nw.group + " " + nw.message
				d.statusReason(gpuhealthv1alpha1.ReasonCircuitBreakerOpen, "not quarantined: "+msg+"; NIC faults on many nodes behind one switch point at the switch; findings: "+message)
				d.quarantineHeld(msg, message)
				d.wait(breakerRecheck)
				return
			}
			d.p.reserveNetwork = true
		}
		d.p.reserveBreaker = true
	}
	switch {
	case d.dryRun():
		// A dry run touches no node, not even its condition: the NodeHealth
		// and the DryRun Event say what it would do.
		reason, message = gpuhealthv1alpha1.ReasonDryRun, "dry run, would cordon and taint: "+message
	case !fenced && fences(o.policy):
		// Fence first: the first write after a quarantining finding is the
		// cordon and taint, nothing else, and the bookkeeping (the
		// transition, the node condition, the finding's status) follows in
		// the next pass at a lower priority. In a storm every sick node is
		// fenced before any is written up, so the apiserver's write budget
		// goes to stopping new work landing on bad GPUs first.
		d.p.node, d.p.fenceOnly = nodeFence, true
		// At once, whatever else this pass waits for (a resolved finding's
		// clearAfter, say): the bookkeeping must not wait minutes behind it.
		d.p.requeue = 0
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

// quarantineHeld says on the Node that a finding counts against it but its
// quarantine is held back, and why: GPUHealthy Unknown, QuarantineHeld
// (see nodeHeld), with one Event on the node when it starts being held.
func (d *decider) quarantineHeld(why, findings string) {
	d.p.node, d.p.nodeReason = nodeHeld, gpuhealthv1alpha1.ReasonQuarantineHeld
	d.p.nodeMessage = "not quarantined, " + why + "; findings: " + findings
	if c := gpuHealthyCondition(d.o.node); c == nil || c.Reason != gpuhealthv1alpha1.ReasonQuarantineHeld {
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonQuarantineHeld, "Quarantine", "%s", d.p.nodeMessage)
	}
}

// gpuHealthyCondition is the Node's GPUHealthy condition, nil when unset.
func gpuHealthyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == gpuhealthv1alpha1.GPUHealthyNodeCondition {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// backInService lifts what gpuhealth put on a node that is healthy again;
// a dry run touches no node.
func (d *decider) backInService() {
	if !d.dryRun() {
		d.inService()
	}
}

// inService lifts what gpuhealth put on a node that is healthy again.
func (d *decider) inService() {
	d.p.node, d.p.nodeReason, d.p.nodeMessage = nodeInService, gpuhealthv1alpha1.ReasonHealthy, "no finding counts against the node"
	if !nodepkg.AppliedOn(d.o.node).Any() {
		// Released (or never fenced): nothing left to own. While the
		// release is still to come (a crash after the status write), the
		// list stays for it.
		d.p.status.OwnedTaints = nil
	}
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
	taint := nodepkg.Taint(d.o.policy.Spec.Quarantine.Taint)
	pre := nodepkg.PreexistingOn(d.o.node, taint)
	d.p.status.PreexistingCordon, d.p.status.PreexistingTaints = pre.Cordon, pre.Taints
	if taint != nil && len(pre.Taints) == 0 {
		d.p.status.OwnedTaints = ownTaint(d.p.status.OwnedTaints, *taint)
	}
	d.p.node = nodeOutOfService
}

// maxOwnedTaints bounds status.ownedTaints (its CRD MaxItems): a policy
// whose taint changed more often while one node was out keeps the latest.
const maxOwnedTaints = 8

// ownTaint adds taint, by key and effect, to the owned list, keeping the
// latest maxOwnedTaints.
func ownTaint(owned []corev1.Taint, taint corev1.Taint) []corev1.Taint {
	t := corev1.Taint{Key: taint.Key, Effect: taint.Effect}
	if slices.Contains(owned, t) {
		return owned
	}
	owned = append(slices.Clone(owned), t)
	return owned[max(0, len(owned)-maxOwnedTaints):]
}

// releasable is what Release may remove: the taints gpuhealth's status
// owns, and the policy's taint (a node fenced and healed before its first
// write-up was fenced with it), but never a preexisting one.
func releasable(st *gpuhealthv1alpha1.NodeHealthStatus, policy *corev1.Taint) []corev1.Taint {
	owned := slices.Clone(st.OwnedTaints)
	if policy != nil {
		owned = ownTaint(owned, *policy)
	}
	return slices.DeleteFunc(owned, func(t corev1.Taint) bool {
		return slices.ContainsFunc(st.PreexistingTaints, func(p corev1.Taint) bool { return p.Key == t.Key && p.Effect == t.Effect })
	})
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

// closeFindings returns the node to service: it closes the findings that
// led here (so they do not quarantine it again), ends the node's running
// Jobs, lifts what gpuhealth put on the node (after the status write) and
// fires the event.
func (d *decider) closeFindings(e fsm.Event, reason, message, by string) {
	message += d.cancelledAttempt()
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
	d.backInService()
}

// cancelledAttempt says which attempt a workflow that ends early cancels,
// with each step's outcome (an unfinished one Cancelled), for the
// transition's message and Event: the attempt's status goes with the
// workflow (the next outage counts attempts from 1). Empty when no attempt
// is under way.
func (d *decider) cancelledAttempt() string {
	st := &d.p.status
	which, _, rc := suiteAttempt(st)
	if rc == nil || rc.StartedAt == nil || rc.CompletedAt != nil || st.Phase != gpuhealthv1alpha1.PhaseRecertifying && st.Phase != gpuhealthv1alpha1.PhaseCertifying {
		return ""
	}
	steps := slices.Clone(rc.Steps)
	for i := range steps {
		if r := steps[i].Result; r == gpuhealthv1alpha1.JobPending || r == gpuhealthv1alpha1.JobRunning {
			steps[i].Result = gpuhealthv1alpha1.JobCancelled
		}
	}
	return fmt.Sprintf("; %s attempt %d %s (%s)", strings.ToLower(string(which)), rc.Attempt, strings.ToLower(string(gpuhealthv1alpha1.JobCancelled)), suiteSummary(steps))
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
	fsm.Record(&d.p.status, from, to, reason, gpuhealthv1alpha1.Truncate(message, 1024), gpuhealthv1alpha1.Truncate(by, 253), o.now)
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
	d.p.status.Reason, d.p.status.Message = reason, gpuhealthv1alpha1.Truncate(message, 1024)
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
		Type: t, Status: status, Reason: reason, Message: gpuhealthv1alpha1.Truncate(message, 1024), ObservedGeneration: d.o.nh.Generation, LastTransitionTime: d.o.now,
	})
}

// nodeEvent announces an Event on the Node, with its NodeHealth as the
// related object, once the status is written.
func (d *decider) nodeEvent(eventType, reason, action, note string, args ...any) {
	d.p.announce = append(d.p.announce, d.o.nodeAnnouncement(eventType, reason, action, fmt.Sprintf(note, args...)))
}

// describe summarises findings for a message: the first three, and how
// many more.
func describe(js []judgement) string {
	parts := make([]string, 0, min(len(js), 3))
	for _, j := range js[:min(len(js), 3)] {
		sp := j.event.Spec
		parts = append(parts, fmt.Sprintf("%s %s on %s (%s, %s)", sp.Check, sp.Code, componentName(sp.Component), sp.Source, j.action))
	}
	return gpuhealthv1alpha1.JoinMore(parts, len(js)-len(parts), "; ")
}

func componentName(c gpuhealthv1alpha1.Component) string {
	if c.ID == "" {
		return string(c.Kind)
	}
	return c.ID
}

// newRequest says whether spec.request holds a request not yet carried out.
func newRequest(nh *gpuhealthv1alpha1.NodeHealth) bool {
	req := nh.Spec.Request
	return req != nil && (nh.Status.LastRequest == nil || nh.Status.LastRequest.ID != req.ID)
}

// fences says whether the policy's quarantine cordons or taints.
func fences(p *gpuhealthv1alpha1.RemediationPolicy) bool {
	return policyCordons(p) || nodepkg.Taint(p.Spec.Quarantine.Taint) != nil
}

func policyCordons(p *gpuhealthv1alpha1.RemediationPolicy) bool {
	c := p.Spec.Quarantine.Cordon
	return c == nil || *c
}

// countingOf returns the judgements that count against the node.
func countingOf(js []judgement) []judgement {
	var out []judgement
	for _, j := range js {
		if j.counts {
			out = append(out, j)
		}
	}
	return out
}

// phaseLabel is the phase label value a policy wants, empty for none.
func phaseLabel(p *gpuhealthv1alpha1.RemediationPolicy, phase gpuhealthv1alpha1.NodeHealthPhase) string {
	if l := p.Spec.Quarantine.PhaseLabel; l != nil && !*l {
		return ""
	}
	return string(phase)
}
