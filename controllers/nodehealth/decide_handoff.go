package nodehealth

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
)

// handOffRecheck is how often a handed-off node's target is read again, to
// show its status.
const handOffRecheck = time.Minute

// nodeHealthOwner makes a template's object owned by the node's NodeHealth.
func nodeHealthOwner(o *observation) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: gpuhealthv1alpha1.GroupVersion.String(), Kind: "NodeHealth", Name: o.nh.Name, UID: o.nh.UID, BlockOwnerDeletion: ptr.To(false)}
}

// handOffData is what a template is rendered with.
func handOffData(o *observation) handoff.Data {
	d := handoff.Data{NodeName: o.node.Name}
	if h := lastFailure(&o.nh.Status); h != nil {
		d.Reason, d.Message = handOffReason(h.Reason, o.nh.Status.Outage), h.Message
	}
	return d
}

// lastFailure is the history entry of the node's last move into Failed.
func lastFailure(st *gpuhealthv1alpha1.NodeHealthStatus) *gpuhealthv1alpha1.Transition {
	for i := len(st.History) - 1; i >= 0; i-- {
		if h := &st.History[i]; h.To == gpuhealthv1alpha1.PhaseFailed && h.From != gpuhealthv1alpha1.PhaseFailed {
			return h
		}
	}
	return nil
}

// handOffReason says why a failure is handed off, empty when it is not:
// its attempts are exhausted, or the fault's action is ReplaceNode. A node
// that needs support (ContactSupport) stays for a human.
func handOffReason(failReason string, outage *gpuhealthv1alpha1.Outage) string {
	switch failReason {
	case gpuhealthv1alpha1.ReasonRecertificationExhausted, gpuhealthv1alpha1.ReasonCertificationExhausted:
		return failReason
	case gpuhealthv1alpha1.ReasonNeedsHuman:
		if outage != nil && outage.Action == gpuhealthv1alpha1.ActionReplaceNode {
			return string(gpuhealthv1alpha1.ActionReplaceNode)
		}
	}
	return ""
}

// withdrawHandOff ends the hand-off of a node that leaves Failed (returned,
// or retried): the Machine's remediation is taken back, so a node back in
// service is not replaced later, and the created object is deleted, so the
// next failure makes a new one.
func (d *decider) withdrawHandOff() {
	st := &d.p.status
	if h := st.HandOff; h != nil && h.State == gpuhealthv1alpha1.HandOffDone && h.Type != gpuhealthv1alpha1.HandOffCondition && !d.dryRun() {
		d.p.withdraw = h.DeepCopy()
	}
	st.HandOff = nil
}

// handOffFailed hands a failed node that must be replaced to the policy's
// hand-off once per failure, and afterwards shows its target's status.
func (d *decider) handOffFailed() {
	spec := d.o.policy.Spec.Remediation.HandOff
	st, t := &d.p.status, d.o.handOff
	if spec == nil || d.dryRun() || d.held("the hand-off waits") {
		return
	}
	if hs := st.HandOff; hs != nil {
		if t != nil && t.obj != nil && (hs.TargetRef == nil || handoff.Same(hs.TargetRef, t.obj)) {
			hs.TargetStatus = gpuhealthv1alpha1.Truncate(handoff.Summarize(t.obj), 1024)
			if hs.TargetRef != nil && hs.TargetRef.UID == "" {
				// Created after the write that recorded it: now it has one.
				hs.TargetRef.UID = t.obj.GetUID()
			}
		}
		if hs.State == gpuhealthv1alpha1.HandOffDone && spec.Type != gpuhealthv1alpha1.HandOffCondition {
			d.wait(handOffRecheck)
		}
		return
	}
	failure := lastFailure(st)
	if failure == nil {
		return
	}
	// The fault's action may have grown since the quarantine.
	if o := st.Outage; o != nil && d.action() == gpuhealthv1alpha1.ActionReplaceNode {
		o.Action = gpuhealthv1alpha1.ActionReplaceNode
	}
	reason := handOffReason(failure.Reason, st.Outage)
	if reason == "" {
		return
	}
	if !d.approved(gpuhealthv1alpha1.ActionReplaceNode, fmt.Sprintf("hand-off of the failure at %s (%s)", failure.Time.UTC().Format(time.RFC3339), reason)) {
		return
	}
	if spec.Type != gpuhealthv1alpha1.HandOffCondition && t == nil {
		// Entered Failed in this pass: the target is read in the next.
		d.p.immediate = true
		return
	}
	hs := &gpuhealthv1alpha1.HandOffStatus{Type: spec.Type, State: gpuhealthv1alpha1.HandOffDone, Time: d.o.now, Reason: reason}
	switch {
	case spec.Type == gpuhealthv1alpha1.HandOffCondition:
		hs.Target = "node condition " + string(gpuhealthv1alpha1.GPUHealthyNodeCondition) + "=False"
		hs.Message = "left to the tools that act on node condition " + string(gpuhealthv1alpha1.GPUHealthyNodeCondition) +
			"=False; its lastTransitionTime stays put while the node is out of service"
	case t.err != nil:
		hs.State, hs.Message = gpuhealthv1alpha1.HandOffFailed, gpuhealthv1alpha1.Truncate(t.err.Error(), 1024)
	case spec.Type == gpuhealthv1alpha1.HandOffClusterAPI:
		hs.Target, hs.TargetRef = handoff.Describe(t.obj), handoff.Ref(t.obj)
		hs.Message = "annotated " + handoff.RemediateMachineAnnotation + ": a MachineHealthCheck covering the Machine marks it unhealthy and its owner replaces it"
		hs.TargetStatus = gpuhealthv1alpha1.Truncate(handoff.Summarize(t.obj), 1024)
		d.p.handOff = t
	default:
		hs.Target, hs.TargetRef = handoff.Describe(t.want), handoff.Ref(t.want)
		hs.Message = "created from the policy's handOff.template"
		if t.obj != nil {
			hs.TargetRef.UID = t.obj.GetUID()
			hs.Message = "found existing, as the policy's handOff.template names it"
			hs.TargetStatus = gpuhealthv1alpha1.Truncate(handoff.Summarize(t.obj), 1024)
		}
		d.p.handOff = t
	}
	hs.Target = gpuhealthv1alpha1.Truncate(hs.Target, 512)
	st.HandOff, d.p.handedOff = hs, hs
	event, what := gpuhealthv1alpha1.ReasonHandedOff, fmt.Sprintf("handed off (%s, %s) to %s: %s", spec.Type, reason, hs.Target, hs.Message)
	if hs.State == gpuhealthv1alpha1.HandOffFailed {
		event, what = gpuhealthv1alpha1.ReasonHandOffFailed, fmt.Sprintf("hand-off (%s, %s) not possible: %s", spec.Type, reason, hs.Message)
	}
	fsm.Note(st, event, gpuhealthv1alpha1.Truncate(what, 1024), d.o.now)
	d.nodeEvent(corev1.EventTypeWarning, event, "HandOff", "%s", what)
}
