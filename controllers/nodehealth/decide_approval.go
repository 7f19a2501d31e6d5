package nodehealth

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// approved says whether act may go ahead for subject (its occasion: one
// recertification attempt, one failure). It may when the policy does not
// ask for approval of act, when a request Approve approved it for this
// subject, or when the wait timed out and the policy's onTimeout is
// Proceed. Otherwise the node waits in its phase with AwaitingApproval;
// the wait starts with one Event.
func (d *decider) approved(act gpuhealthv1alpha1.Action, subject string) bool {
	spec := d.o.policy.Spec.Approval
	if spec == nil || !slices.Contains(spec.Actions, act) {
		return true
	}
	d.askedApproval = true
	st, now := &d.p.status, d.o.now
	a := st.Approval
	if a == nil || a.Action != act || a.Subject != subject {
		a = &gpuhealthv1alpha1.ApprovalStatus{Action: act, Subject: gpuhealthv1alpha1.Truncate(subject, 256), State: gpuhealthv1alpha1.ApprovalWaiting, Since: now}
		st.Approval = a
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonAwaitingApproval, string(act), "%s", waitingMessage(a, d.o.node.Name))
	}
	switch a.State {
	case gpuhealthv1alpha1.ApprovalApproved:
		d.clearCondition(gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition, gpuhealthv1alpha1.ReasonApproved,
			fmt.Sprintf("%s (%s) approved by %s", a.Action, a.Subject, a.By))
		return true
	case gpuhealthv1alpha1.ApprovalTimedOut:
		return true
	}
	if spec.Timeout != nil {
		deadline := a.Since.Add(spec.Timeout.Get(0))
		switch {
		case spec.OnTimeout != gpuhealthv1alpha1.ApprovalProceed:
		case !now.Before(&metav1.Time{Time: deadline}):
			a.State, a.Time = gpuhealthv1alpha1.ApprovalTimedOut, &now
			msg := fmt.Sprintf("%s (%s) was not approved within %s; the policy's approval.onTimeout is Proceed", a.Action, a.Subject, spec.Timeout.Get(0))
			d.clearCondition(gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition, gpuhealthv1alpha1.ReasonApprovalTimedOut, msg)
			d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonApprovalTimedOut, string(a.Action), "%s", msg)
			return true
		default:
			d.wait(deadline.Sub(now.Time))
		}
	}
	msg := waitingMessage(a, d.o.node.Name)
	d.condition(gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition, true, gpuhealthv1alpha1.ReasonAwaitingApproval, msg)
	d.statusReason(gpuhealthv1alpha1.ReasonAwaitingApproval, msg)
	return false
}

func waitingMessage(a *gpuhealthv1alpha1.ApprovalStatus, node string) string {
	return fmt.Sprintf("%s (%s) waits for approval since %s: kubectl gpuhealth approve %s --reason ...",
		a.Action, a.Subject, a.Since.UTC().Format(time.RFC3339), node)
}

// approvalUnasked ends a wait nothing asks for any more (the node was
// released, returned or failed another way, or the policy changed): the
// condition clears and the waiting record goes; an approval given stays as
// the audit of the act it let through.
func (d *decider) approvalUnasked() {
	if d.askedApproval {
		return
	}
	st := &d.p.status
	if st.Approval != nil && st.Approval.State == gpuhealthv1alpha1.ApprovalWaiting {
		st.Approval = nil
	}
	d.clearCondition(gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition, gpuhealthv1alpha1.ReasonNotWaitingForApproval,
		"nothing waits for approval (the node moved on: "+string(d.machine.Phase())+")")
}

// approve carries out a request Approve: the act the node waits for may go
// ahead. It returns the request's result.
func (d *decider) approve(by, reason string) string {
	a := d.p.status.Approval
	if a == nil || a.State != gpuhealthv1alpha1.ApprovalWaiting {
		return "nothing to approve: no act waits for approval"
	}
	now := d.o.now
	a.State, a.By, a.Reason, a.Time = gpuhealthv1alpha1.ApprovalApproved, gpuhealthv1alpha1.Truncate(by, 512), gpuhealthv1alpha1.Truncate(reason, 1024), &now
	d.nodeEvent(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonApproved, string(a.Action), "%s (%s) approved by %s: %s", a.Action, a.Subject, by, reason)
	return fmt.Sprintf("approved %s (%s)", a.Action, a.Subject)
}

// remediationAction is the policy action a remediation step carries out.
func remediationAction(kind job.Kind) gpuhealthv1alpha1.Action {
	if kind == job.RebootNode {
		return gpuhealthv1alpha1.ActionRebootNode
	}
	return gpuhealthv1alpha1.ActionResetGPU
}

// attemptSubject names a recertification attempt, the occasion of its
// remediation step.
func attemptSubject(rc *gpuhealthv1alpha1.RecertificationStatus) string {
	return fmt.Sprintf("recertification attempt %d (started %s)", rc.Attempt, rc.StartedAt.UTC().Format(time.RFC3339))
}
