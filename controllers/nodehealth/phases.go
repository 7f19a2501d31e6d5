package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
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

func (s *scope) cordon() bool {
	c := s.policy.Spec.Quarantine.Cordon
	return c == nil || *c
}

func (s *scope) taint() *corev1.Taint { return nodepkg.Taint(s.policy.Spec.Quarantine.Taint) }

func (s *scope) phaseLabel(phase gpuhealthv1alpha1.NodeHealthPhase) string {
	if l := s.policy.Spec.Quarantine.PhaseLabel; l != nil && !*l {
		return ""
	}
	return string(phase)
}

// reconcileHealthy keeps a healthy node released and quarantines it when a
// finding counts against it.
func (r *Reconciler) reconcileHealthy(ctx context.Context, s *scope) error {
	counting := s.counting()
	if len(counting) == 0 {
		// The reason of the transition into Healthy (Recertified,
		// ManualRelease, …) stays until the next one.
		if s.dryRun() {
			return nil
		}
		return r.ensureReleased(ctx, s)
	}
	reason := ReasonFault
	message := describe(counting)
	// A node gpuhealth already fenced (below, or before a crash) was let
	// through the breaker then; asking again would count it twice.
	fenced := nodepkg.AppliedOn(s.node).Any()
	if !fenced {
		allowed, err := r.allowQuarantine(ctx, s)
		if err != nil || !allowed {
			return err
		}
	}
	if s.dryRun() {
		reason, message = ReasonDryRun, "dry run, would cordon and taint: "+message
	} else if !fenced && (s.cordon() || s.taint() != nil) {
		// Fence first: the first write after a quarantining finding is the
		// cordon and taint, nothing else, and the bookkeeping (the
		// transition, the node condition, the finding's status) follows in
		// the next pass at a lower priority. In a storm every sick node is
		// fenced before any is written up, so the apiserver's write budget
		// goes to stopping new work landing on bad GPUs first. The applied
		// annotation written with the cordon marks the fence as ours.
		if err := nodepkg.Quarantine(ctx, r.Client, s.node, s.cordon(), s.taint(), s.phaseLabel(gpuhealthv1alpha1.PhaseQuarantined)); err != nil {
			return err
		}
		log.FromContext(ctx).Info("Fenced node", "reason", reason, "findings", message)
		r.storm.fenced(s.node.Name)
		s.fenceOnly = true
		return nil
	}
	if fenced {
		// The bookkeeping pass after our fence: while other nodes are still
		// being fenced, it waits (see stormGate).
		if d := r.storm.hold(s.node.Name); d > 0 {
			s.fenceOnly, s.hold = true, d
			return nil
		}
	}
	if err := r.transition(ctx, s, fsm.Quarantine, reason, message, ""); err != nil {
		return err
	}
	markObserved(s, counting)
	return nil
}

// ensureReleased lifts what gpuhealth put on a node that is healthy again.
func (r *Reconciler) ensureReleased(ctx context.Context, s *scope) error {
	if err := nodepkg.Release(ctx, r.Client, s.node, s.taint()); err != nil {
		return err
	}
	return nodepkg.SetGPUHealthy(ctx, r.Client, s.node, true, ReasonHealthy, "no finding counts against the node", s.now)
}

// ensureQuarantined keeps an out-of-service node cordoned, tainted and
// labelled, recording the first time what a human had set before.
func (r *Reconciler) ensureQuarantined(ctx context.Context, s *scope) error {
	if s.dryRun() {
		return nil
	}
	if err := nodepkg.Quarantine(ctx, r.Client, s.node, s.cordon(), s.taint(), s.phaseLabel(s.machine.Phase())); err != nil {
		return err
	}
	// What gpuhealth did not add itself was there before (the applied
	// annotation lists what it added), so this holds even when the fence
	// and the status write happened in different passes.
	pre := nodepkg.PreexistingOn(s.node, s.taint())
	s.nh.Status.PreexistingCordon = pre.Cordon
	s.nh.Status.PreexistingTaints = pre.Taints
	// The condition names why the node is out of service (the cause of its
	// last transition), not what it waits for now, so it changes with the
	// phase rather than with every budget recount.
	reason, message := s.nh.Status.Reason, s.nh.Status.Message
	if h := s.nh.Status.History; len(h) > 0 {
		last := h[len(h)-1]
		reason, message = last.Reason, fmt.Sprintf("%s: %s", last.To, last.Message)
	}
	return nodepkg.SetGPUHealthy(ctx, r.Client, s.node, false, reason, message, s.now)
}

// reconcileQuarantined holds the node cordoned until the budgets let it drain.
func (r *Reconciler) reconcileQuarantined(ctx context.Context, s *scope, before **gpuhealthv1alpha1.NodeHealth) error {
	if err := r.ensureQuarantined(ctx, s); err != nil {
		return err
	}
	if s.dryRun() {
		if len(s.counting()) == 0 {
			return r.closeFindings(ctx, s, fsm.Cancel, ReasonDryRun, "dry run: no finding counts against the node any more", "")
		}
		setStatusReason(s, ReasonDryRun, "dry run: would drain when the budgets allow")
		return nil
	}
	if s.nh.Spec.Hold {
		setStatusReason(s, ReasonHeld, "spec.hold is true: the node stays quarantined")
		return nil
	}
	if rc := s.nh.Status.Recertification; rc != nil && rc.Result == gpuhealthv1alpha1.JobFailed && rc.CompletedAt != nil {
		if until := rc.CompletedAt.Add(s.policy.Spec.Recertification.Backoff.Get(defaultBackoff)); s.now.Before(&metav1.Time{Time: until}) {
			setStatusReason(s, ReasonBackoff, fmt.Sprintf("attempt %d failed; next attempt after %s", rc.Attempt, until.UTC().Format(time.RFC3339)))
			s.wait(until.Sub(s.now.Time))
			return nil
		}
	}
	return r.startDrain(ctx, s, before)
}

// startDrain moves the node to Draining when every budget has room. A
// first count from the cache turns most waiting nodes away cheaply (a cache
// that lags only over-counts nodes that have just returned, so a "no room"
// from it is safe). When the cache sees room, the count is repeated from the
// apiserver and the status written inside one lock, so two nodes never take
// the last slot together.
func (r *Reconciler) startDrain(ctx context.Context, s *scope, before **gpuhealthv1alpha1.NodeHealth) error {
	if ds, blocked, err := r.budgets(ctx, s, false); err != nil || len(blocked) > 0 {
		r.waitForBudget(s, ds, blocked, err)
		return nil
	}
	r.budgetMu.Lock()
	defer r.budgetMu.Unlock()
	ds, blocked, err := r.budgets(ctx, s, true)
	if err != nil || len(blocked) > 0 {
		r.waitForBudget(s, ds, blocked, err)
		return nil
	}
	msgs := make([]string, len(ds))
	for i, d := range ds {
		msgs[i] = d.Message()
	}
	if err := r.transition(ctx, s, fsm.Drain, ReasonDraining, "budgets allow: "+strings.Join(msgs, "; "), ""); err != nil {
		return err
	}
	s.nh.Status.Drain = &gpuhealthv1alpha1.DrainStatus{StartedAt: &s.now}
	r.ensureMembershipStatus(s)
	// Write now, inside the lock, so the next budget count sees this node.
	if err := r.Client.Status().Patch(ctx, s.nh, client.MergeFromWithOptions(*before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching status of nodehealth %s: %w", s.nh.Name, err)
	}
	s.written()
	*before = s.nh.DeepCopy()
	return nil
}

// waitForBudget records that the node waits for a budget: status.reason
// WaitingForBudget, status.blockingBudget the first budget without room and
// the message every blocking budget by name, limit and scope. The live
// counts stay out of the status (they are in the policy's status), so a
// count that moves does not rewrite every waiting node. The first time a
// budget blocks the node it is counted and, for a ComputeDomain member,
// published on the domain with the counts.
func (r *Reconciler) waitForBudget(s *scope, ds []budget.Decision, blocked []int, err error) {
	name := gpuhealthv1alpha1.BudgetMaxUnavailable
	msg, counts := "waiting for budget: ", ""
	if err != nil {
		msg += err.Error()
		counts = msg
		if len(ds) > 0 {
			name = gpuhealthv1alpha1.BudgetName(ds[len(ds)-1].Name)
		}
	} else {
		name = gpuhealthv1alpha1.BudgetName(ds[blocked[0]].Name)
		full, numbers := make([]string, len(blocked)), make([]string, len(blocked))
		for i, b := range blocked {
			full[i], numbers[i] = ds[b].Full(), ds[b].Message()
		}
		counts = msg + strings.Join(numbers, "; ")
		msg += strings.Join(full, "; ")
	}
	setStatusReason(s, ReasonWaitingForBudget, msg)
	s.nh.Status.BlockingBudget = name
	if s.prevBlocking != name {
		budgetBlocked.WithLabelValues(string(name)).Inc()
		r.domainEvent(s, corev1.EventTypeWarning, ReasonMemberWaitingForBudget, "Drain",
			"member %s is quarantined and waits for budget %s: %s", s.node.Name, name, counts)
	}
	s.wait(budgetRecheck)
}

// budgets counts the nodes draining or recertifying against every budget
// that applies to the node: maxUnavailable over the policy's managed nodes,
// maxUnavailablePerComputeDomain over its domain's members and
// maxUnavailablePerClique over its NVLink clique. The NodeHealths are read
// from the cache's fleet snapshot, or from the apiserver when
// fromAPIServer. It returns the decisions and the indexes of those without
// room.
func (r *Reconciler) budgets(ctx context.Context, s *scope, fromAPIServer bool) ([]budget.Decision, []int, error) {
	managed, nhs, err := r.fleet(ctx, s.policy)
	if err != nil {
		return nil, nil, err
	}
	if fromAPIServer {
		list := &gpuhealthv1alpha1.NodeHealthList{}
		if err := r.APIReader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, fmt.Errorf("listing nodehealths: %w", err)
		}
		nhs = list.Items
	}
	consuming := 0
	for i := range nhs {
		nh := &nhs[i]
		if _, ok := managed[nh.Name]; ok && nh.Name != s.nh.Name && usesBudget(nh) {
			consuming++
		}
	}
	limit, err := budget.Limit(s.policy.Spec.Budgets.MaxUnavailable, len(managed), budget.DefaultMaxUnavailable)
	ds := []budget.Decision{{Name: string(gpuhealthv1alpha1.BudgetMaxUnavailable), Limit: limit, Consuming: consuming, Total: len(managed)}}
	if err != nil {
		return ds, nil, err
	}
	domain, err := r.domainBudgets(s, nhs, managed)
	ds = append(ds, domain...)
	if err != nil {
		return ds, nil, err
	}
	var blocked []int
	for i, d := range ds {
		if d.Allowed() == 0 {
			blocked = append(blocked, i)
		}
	}
	return ds, blocked, nil
}

// managedNodes returns the labels of the nodes the policy selects, by
// name, read from the cache without copies (read-only).
func (r *Reconciler) managedNodes(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (map[string]map[string]string, error) {
	// The selector is compiled once and applied by the cache, so only the
	// selected nodes are copied into the list.
	sel, err := p.Selector()
	if err != nil {
		return map[string]map[string]string{}, nil // selects no node (see Selects)
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	managed := make(map[string]map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		managed[nodes.Items[i].Name] = nodes.Items[i].Labels
	}
	return managed, nil
}

// reconcileDraining evicts the node's pods and moves on when none is left.
func (r *Reconciler) reconcileDraining(ctx context.Context, s *scope) error {
	if err := r.ensureQuarantined(ctx, s); err != nil {
		return err
	}
	if s.nh.Spec.Hold {
		setStatusReason(s, ReasonHeld, "spec.hold is true: the drain is paused")
		return nil
	}
	ds := s.nh.Status.Drain
	if ds == nil || ds.StartedAt == nil {
		ds = &gpuhealthv1alpha1.DrainStatus{StartedAt: &s.now}
		s.nh.Status.Drain = ds
	}
	res, err := r.Drainer.Drain(ctx, s.node.Name, s.policy.Spec.Drain, ds.StartedAt.Time)
	if err != nil {
		return err
	}
	for _, p := range res.ForceDeleted {
		r.Recorder.Eventf(s.node, s.nh, corev1.EventTypeWarning, ReasonForceDeleted, "Drain",
			"deleted pod %s after the DeleteAfterTimeout drain timeout", p.String())
	}
	ds.PodsRemaining = int32(res.Remaining)
	ds.PodsTotal = max(ds.PodsTotal, int32(res.Total))
	ds.PodsBlocked = int32(res.Blocked)
	ds.Blocked = res.BlockedPods
	if !res.Done() {
		ds.CompletedAt = nil
		msg := fmt.Sprintf("%d of %d pods remaining", res.Remaining, ds.PodsTotal)
		reason := ReasonDraining
		if res.Blocked > 0 {
			reason = ReasonBlockedByPDB
			msg += fmt.Sprintf(", %d blocked by a PodDisruptionBudget", res.Blocked)
		}
		if res.Waiting > 0 {
			msg += fmt.Sprintf(", %d waiting for completion", res.Waiting)
		}
		setStatusReason(s, reason, msg)
		s.wait(drainRecheck)
		return nil
	}
	if ds.CompletedAt == nil {
		ds.CompletedAt = &s.now
	}
	if !r.awaitLeftComputeDomain(ctx, s) {
		return nil
	}
	if a := s.action(); needsHuman(a) {
		return r.transition(ctx, s, fsm.Fail, ReasonNeedsHuman, fmt.Sprintf("drained; the findings recommend %s: %s", a, describe(s.counting())), "")
	}
	attempt := int32(1)
	if rc := s.nh.Status.Recertification; rc != nil {
		attempt = rc.Attempt + 1
	}
	if err := r.transition(ctx, s, fsm.Recertify, ReasonRecertifying, fmt.Sprintf("drained; recertification attempt %d", attempt), ""); err != nil {
		return err
	}
	s.nh.Status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: attempt, StartedAt: &s.now, Result: gpuhealthv1alpha1.JobPending}
	s.attemptStarted = true
	return nil
}

// reconcileRecertifying runs the remediation step, the recertification Job
// and the soak window, then returns the node or counts a failed attempt.
func (r *Reconciler) reconcileRecertifying(ctx context.Context, s *scope) error {
	if err := r.ensureQuarantined(ctx, s); err != nil {
		return err
	}
	if s.nh.Spec.Hold {
		setStatusReason(s, ReasonHeld, "spec.hold is true: recertification is paused")
		return nil
	}
	rc := s.nh.Status.Recertification
	if rc == nil || rc.StartedAt == nil {
		rc = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &s.now, Result: gpuhealthv1alpha1.JobPending}
		s.nh.Status.Recertification = rc
		s.attemptStarted = true
	}
	if s.attemptStarted {
		// The attempt started in this reconcile: write it down before any
		// Job exists. Job names carry the attempt's start, and a restart
		// must find the same start to find the same Jobs.
		s.wait(time.Millisecond)
		return nil
	}
	spec := s.policy.Spec
	if kind, step := remediationStep(s.action(), spec.Remediation); step != nil {
		want := job.Build(kind, s.node.Name, r.Namespace, rc.Attempt, rc.StartedAt.Time, step.Job, step.Timeout.Get(defaultJobTimeout))
		rc.RemediationJob = want.Name
		done, err := r.awaitJob(ctx, s, want, ReasonRemediating)
		if err != nil || !done {
			return err
		}
	}
	if spec.Recertification.Job != nil {
		want := job.Build(job.Recertification, s.node.Name, r.Namespace, rc.Attempt, rc.StartedAt.Time, *spec.Recertification.Job, spec.Recertification.Timeout.Get(defaultJobTimeout))
		rc.JobName = want.Name
		done, err := r.awaitJob(ctx, s, want, ReasonRecertifying)
		if err != nil || !done {
			return err
		}
	}
	if rc.CompletedAt == nil {
		rc.CompletedAt = &s.now
		rc.Result = gpuhealthv1alpha1.JobSucceeded
		if spec.Recertification.Job == nil {
			rc.Message = "no recertification job configured; the soak window decides"
		}
	}
	for _, j := range s.counting() {
		if j.event.Status.LastSeen != nil && j.event.Status.LastSeen.After(rc.StartedAt.Time) {
			return r.failAttempt(ctx, s, "a new finding during recertification: "+describe([]judgement{j}))
		}
	}
	soakEnd := rc.CompletedAt.Add(spec.Recertification.SoakWindow.Get(defaultSoak))
	if s.now.Time.Before(soakEnd) {
		setStatusReason(s, ReasonSoaking, fmt.Sprintf("recertification passed; soaking until %s", soakEnd.UTC().Format(time.RFC3339)))
		s.wait(soakEnd.Sub(s.now.Time))
		return nil
	}
	requireFabric := spec.Recertification.RequireFabricHealthy == nil || *spec.Recertification.RequireFabricHealthy
	var open []judgement
	for _, j := range s.judged {
		if j.phase != gpuhealthv1alpha1.EventActive || isPointCheck(j.event.Spec.Check) {
			continue
		}
		if j.counts || (requireFabric && slices.Contains(fabricChecks, j.event.Spec.Check)) {
			open = append(open, j)
		}
	}
	if len(open) > 0 {
		setStatusReason(s, ReasonWaitingForResolution, "recertification passed; waiting for findings to clear: "+describe(open))
		return nil
	}
	return r.closeFindings(ctx, s, fsm.Pass, ReasonRecertified, fmt.Sprintf("recertification attempt %d passed and the soak window was clean", rc.Attempt), "")
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

// awaitJob makes sure the Job exists and says whether it succeeded; a
// failed Job fails the attempt.
func (r *Reconciler) awaitJob(ctx context.Context, s *scope, want *batchv1.Job, waitingReason string) (bool, error) {
	if s.dryRun() {
		return false, nil
	}
	live, err := job.Ensure(ctx, r.Client, want)
	if err != nil {
		return false, err
	}
	rc := s.nh.Status.Recertification
	result, msg := job.Result(live)
	switch result {
	case gpuhealthv1alpha1.JobSucceeded:
		return true, nil
	case gpuhealthv1alpha1.JobFailed:
		return false, r.failAttempt(ctx, s, fmt.Sprintf("job %s/%s: %s", live.Namespace, live.Name, msg))
	default:
		rc.Result = result
		setStatusReason(s, waitingReason, fmt.Sprintf("attempt %d: job %s/%s %s", rc.Attempt, live.Namespace, live.Name, msg))
		s.wait(jobRecheck)
		return false, nil
	}
}

// failAttempt records a failed recertification attempt: back to quarantine
// for another, or Failed when the attempts are used up.
func (r *Reconciler) failAttempt(ctx context.Context, s *scope, why string) error {
	rc := s.nh.Status.Recertification
	rc.Result, rc.CompletedAt, rc.Message = gpuhealthv1alpha1.JobFailed, &s.now, truncate(why, 1024)
	maxAttempts := s.policy.Spec.Recertification.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = defaultMaxAttempts
	}
	if rc.Attempt >= maxAttempts {
		return r.transition(ctx, s, fsm.Fail, ReasonRecertificationExhausted,
			fmt.Sprintf("recertification attempt %d of %d failed: %s", rc.Attempt, maxAttempts, why), "")
	}
	return r.transition(ctx, s, fsm.FailRecertification, ReasonRecertificationFailed,
		fmt.Sprintf("recertification attempt %d of %d failed: %s", rc.Attempt, maxAttempts, why), "")
}

// closeFindings returns the node to service: it closes the findings that
// led here (so they do not quarantine it again), lifts what gpuhealth put on
// the node and fires the event.
func (r *Reconciler) closeFindings(ctx context.Context, s *scope, e fsm.Event, reason, message, by string) error {
	r.supersede(s)
	if err := r.transition(ctx, s, e, reason, message, by); err != nil {
		return err
	}
	s.nh.Status.Drain = nil
	s.nh.Status.Recertification = nil
	for i := range s.judged {
		s.judged[i].counts = false
	}
	s.nh.Status.ActiveEvents = nil
	if s.dryRun() {
		return nil
	}
	return r.ensureReleased(ctx, s)
}

// supersede closes the node's active findings seen up to now (written by flushEvents).
func (r *Reconciler) supersede(s *scope) {
	for _, j := range s.judged {
		if j.phase != gpuhealthv1alpha1.EventActive {
			continue
		}
		j.event.Status.SupersededAt = &s.now
		j.event.Status.Phase = gpuhealthv1alpha1.EventSuperseded
	}
}

// cancel honours a human who uncordoned a node gpuhealth had taken out of
// service (Quarantined, Draining, Recertifying or Failed): the workflow for
// these findings ends, recorded, and gpuhealth does not fight it.
func (r *Reconciler) cancel(ctx context.Context, s *scope) error {
	return r.closeFindings(ctx, s, fsm.Cancel, ReasonHumanUncordon,
		"a human uncordoned the node; the workflow for its current findings is cancelled", "")
}

// markObserved records on each finding the transition it caused (written by flushEvents).
func markObserved(s *scope, js []judgement) {
	last := s.nh.Status.History[len(s.nh.Status.History)-1]
	for _, j := range js {
		j.event.Status.ObservedBy = &gpuhealthv1alpha1.TransitionRef{From: last.From, To: last.To, Time: last.Time}
	}
}
