package nodehealth

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
)

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
	d.gangWaves(res.Waves)
	d.drainTimeout()
	if !res.Done() || o.drain.err != nil {
		ds.CompletedAt = nil
		msg := fmt.Sprintf("%d of %d pods remaining", res.Remaining, ds.PodsTotal)
		if res.WavePending > 0 {
			msg += fmt.Sprintf(", %d members of its gangs on other nodes left to evict", res.WavePending)
		}
		if s := gangSummary(ds.Gangs); s != "" {
			msg += "; " + s
		}
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
