package nodehealth

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
	"github.com/gpuhealth/gpuhealth/remediation/member"
)

// Policy defaults for the computeDomain section (the schema defaults them
// for new objects).
const (
	defaultLeaveTimeout    = 10 * time.Minute
	defaultDeadMemberGrace = 5 * time.Minute
	// leaveRecheck bounds the wait for a drained node to leave its domain;
	// label, daemon pod and clique changes wake the node sooner.
	leaveRecheck = time.Minute
	// deadMemberSettle is how long after a dead member's daemon pods went
	// the driver may still list it before gpuhealth says so: NVIDIA's
	// controller resyncs every ~2 s, so v25.8 drops the entry well within
	// it, while on v25.12 the entry stays for good.
	deadMemberSettle = 30 * time.Second
)

// ignoreNonMemberIMEX overrides the judgement of an IMEX finding about a
// node that is no ComputeDomain member: a stale report from a daemon that
// has gone (or a host service idling without a domain) must not take a
// node out of service.
func ignoreNonMemberIMEX(o *observation, j *judgement) {
	if !j.event.Spec.IsIMEX() || o.cd.member() || j.phase != gpuhealthv1alpha1.EventActive {
		return
	}
	j.verdict, j.counts, j.phase, j.recheckAt = gpuhealthv1alpha1.VerdictIgnore, false, gpuhealthv1alpha1.EventIgnored, time.Time{}
	j.reason = fmt.Sprintf("ignored: node %s is no ComputeDomain member (no %s label, daemon pod or clique entry); IMEX findings apply only to members",
		o.node.Name, computedomain.NodeLabel)
}

// membership writes the observed membership into
// status.computeDomain and publishes a MemberLeft Event on the domain when
// the node's last trace goes. A node that left while out of service keeps
// the entry (membership Left) so it still counts against its domain's
// budget; back in service, the entry goes.
func (d *decider) membership() {
	m, st := d.o.cd, &d.p.status
	prev := st.ComputeDomain
	phase := d.machine.Phase()
	if !m.member() {
		if prev == nil || phase == gpuhealthv1alpha1.PhaseHealthy {
			st.ComputeDomain = nil
			return
		}
		next := prev.DeepCopy()
		next.Membership, next.Traces = gpuhealthv1alpha1.MembershipLeft, nil
		if next.LeftAt == nil {
			next.LeftAt = &d.o.now
			d.domainEvent(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonMemberLeft, "Leave",
				"node %s left the ComputeDomain (%s)", d.o.node.Name, phase)
		}
		if m.domain != nil {
			next.DomainStatus = m.domain.Status
		}
		st.ComputeDomain = next
		return
	}
	next := &gpuhealthv1alpha1.ComputeDomainMembership{
		UID: string(m.uid), CliqueID: m.cliqueID, Membership: gpuhealthv1alpha1.MembershipMember, Traces: m.traces,
	}
	if phase == gpuhealthv1alpha1.PhaseDraining || phase == gpuhealthv1alpha1.PhaseRecertifying || phase == gpuhealthv1alpha1.PhaseMaintenance {
		next.Membership = gpuhealthv1alpha1.MembershipLeaving
	}
	if m.domain != nil {
		next.Namespace, next.Name, next.DomainStatus = m.domain.Namespace, m.domain.Name, m.domain.Status
	} else if prev != nil && prev.UID == next.UID {
		next.Namespace, next.Name, next.DomainStatus = prev.Namespace, prev.Name, prev.DomainStatus
	}
	if prev != nil && prev.UID == next.UID {
		if next.CliqueID == "" {
			next.CliqueID = prev.CliqueID
		}
		next.DeadSince = prev.DeadSince
	}
	st.ComputeDomain = next
}

// domainRef is the node's ComputeDomain as an Event target, nil when the
// object is not known (no CRDs, or a host-managed domain).
func domainRef(m *observedMembership, st *gpuhealthv1alpha1.ComputeDomainMembership) *corev1.ObjectReference {
	var ns, name string
	var uid types.UID
	switch {
	case m != nil && m.domain != nil:
		ns, name, uid = m.domain.Namespace, m.domain.Name, m.domain.UID
	case st != nil && st.Name != "":
		cd := st
		ns, name, uid = cd.Namespace, cd.Name, types.UID(cd.UID)
	default:
		return nil
	}
	return &corev1.ObjectReference{
		APIVersion: computedomain.ComputeDomainGVK.GroupVersion().String(), Kind: computedomain.ComputeDomainGVK.Kind,
		Namespace: ns, Name: name, UID: uid,
	}
}

// domainEvent publishes an Event on the node's ComputeDomain (in the
// domain's namespace, so `kubectl describe computedomain` shows it to the
// job's owners), with the node as the related object.
func (d *decider) domainEvent(eventType, reason, action, note string, args ...any) {
	if d.dryRun() {
		return
	}
	if a, ok := domainAnnouncement(d.o, d.p.status.ComputeDomain, eventType, reason, action, fmt.Sprintf(note, args...)); ok {
		d.p.announce = append(d.p.announce, a)
	}
}

// domainAnnouncement is an Event on the node's ComputeDomain with the node
// as the related object; false when the domain object is not known.
func domainAnnouncement(o *observation, st *gpuhealthv1alpha1.ComputeDomainMembership, eventType, reason, action, note string) (announcement, bool) {
	ref := domainRef(o.cd, st)
	if ref == nil {
		return announcement{}, false
	}
	return announcement{regarding: ref, related: o.node, eventType: eventType, reason: reason, action: action, note: note}, true
}

// domainName is the domain's namespace/name when known, else its UID.
func domainName(m *observedMembership, st *gpuhealthv1alpha1.ComputeDomainMembership, uid types.UID) string {
	if m != nil && m.domain != nil && m.domain.UID == uid {
		return m.domain.Namespace + "/" + m.domain.Name
	}
	if st != nil && st.UID == string(uid) && st.Name != "" {
		return st.Namespace + "/" + st.Name
	}
	return string(uid)
}

// leftComputeDomain holds a drained node in Draining until nothing ties it
// to its ComputeDomain any more: evicting the workload unprepares its
// channel claim, the driver removes the node label, the DaemonSet removes
// the daemon pod and the clique entry goes. Until then the node is not
// drained (peers still hold it as a member). Past the policy's leaveTimeout
// the condition ComputeDomainLeaveStuck turns True with a Warning Event, and
// the node keeps waiting: going on would leave a stale member behind.
func (d *decider) leftComputeDomain() bool {
	o, st := d.o, &d.p.status
	if !o.cd.member() {
		if meta.FindStatusCondition(st.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition) != nil {
			d.condition(gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, false, gpuhealthv1alpha1.ReasonComputeDomainLeft, "the node left its ComputeDomain")
		}
		return true
	}
	ds := st.Drain
	timeout := o.policy.Spec.ComputeDomain.LeaveTimeout.Get(defaultLeaveTimeout)
	deadline := ds.CompletedAt.Add(timeout)
	traces := traceList(o.cd.traces)
	name := domainName(o.cd, st.ComputeDomain, o.cd.uid)
	if o.now.Before(&metav1.Time{Time: deadline}) {
		d.statusReason(gpuhealthv1alpha1.ReasonLeavingComputeDomain, fmt.Sprintf("drained; waiting to leave ComputeDomain %s (%s remain), stuck after %s",
			name, traces, deadline.UTC().Format(time.RFC3339)))
		d.wait(min(deadline.Sub(o.now.Time), leaveRecheck))
		return false
	}
	msg := fmt.Sprintf("drained %s ago but still tied to ComputeDomain %s by %s", o.now.Sub(ds.CompletedAt.Time).Round(time.Second), name, traces)
	if !meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition) {
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck, "Leave", "%s", msg)
		d.domainEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck, "Leave", "node %s: %s", o.node.Name, msg)
	}
	d.condition(gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, true, gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck, msg)
	d.statusReason(gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck, msg)
	d.wait(leaveRecheck)
	return false
}

func traceList(ts []gpuhealthv1alpha1.MembershipTrace) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = string(t)
	}
	return strings.Join(parts, ", ")
}

// deadMember plans what gpuhealth does about a dead member so that its
// peers stop holding it. Dead means: fenced (out of service and cordoned),
// NotReady for longer than the policy's deadMemberGracePeriod, and either
// carrying the node.kubernetes.io/out-of-service taint or under a policy
// with notReadyIsDead. A Ready node is never touched.
//
//   - Its stale daemon pods are deleted, once per dead period: on NVIDIA's
//     driver v25.8 the controller then drops the node's status.nodes entry.
//     A pod that never ran (no IP, never Ready: the DaemonSet re-created
//     it on the dead node) is left alone, so nothing churns.
//   - With the policy's releaseDeadMemberLabel, the node's
//     resource.nvidia.com/computeDomain label is removed, so that no daemon
//     pod can be bound there and v25.12's controller drops the clique entry.
//   - While the driver still lists it, the NodeHealth says so
//     (DeadMemberListed, alerted on), with an Event on the domain when that
//     starts.
func (d *decider) deadMember() {
	o := d.o
	since, dead := d.deadSince()
	listed := slices.ContainsFunc(o.cd.traces, func(t gpuhealthv1alpha1.MembershipTrace) bool {
		return t == gpuhealthv1alpha1.TraceCliqueEntry || t == gpuhealthv1alpha1.TraceStatusEntry
	})
	st := d.p.status.ComputeDomain
	if !dead || st == nil {
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition, gpuhealthv1alpha1.ReasonNotDeadMember,
			"the node is not a dead ComputeDomain member")
		return
	}
	if st.DeadSince == nil || !st.DeadSince.Equal(&metav1.Time{Time: since}) {
		if pods := ranOnce(o.cd.daemonPods); len(pods) > 0 {
			d.p.deleteDaemonPods = pods
			st.DeadSince = &metav1.Time{Time: since}
		}
	}
	if o.policy.Spec.ComputeDomain.ReleaseDeadMemberLabel && o.node.Labels[computedomain.NodeLabel] != "" {
		d.p.removeDomainLabel = true
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonDeadMemberLabelRemoved, "Release",
			"removing label %s=%s of the dead node (NotReady since %s), as the policy's releaseDeadMemberLabel says",
			computedomain.NodeLabel, o.node.Labels[computedomain.NodeLabel], since.UTC().Format(time.RFC3339))
	}
	if !listed {
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition, gpuhealthv1alpha1.ReasonComputeDomainLeft,
			"the driver no longer lists the dead node")
		return
	}
	if settled := since.Add(d.deadMemberGrace() + deadMemberSettle); o.now.Before(&metav1.Time{Time: settled}) {
		d.wait(settled.Sub(o.now.Time)) // the driver may still be catching up
		return
	}
	msg := fmt.Sprintf("the node is dead (NotReady since %s, fenced) but NVIDIA's driver still lists it (%s), so its peers hold it; "+
		"on driver v25.12 and later the entry goes only once no daemon pod can be bound to the node: remove its %s label "+
		"(the policy's computeDomain.releaseDeadMemberLabel does that) or delete the Node",
		since.UTC().Format(time.RFC3339), traceList(o.cd.traces), computedomain.NodeLabel)
	if !meta.IsStatusConditionTrue(d.p.status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition) {
		d.domainEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonDeadMemberStillListed, "Release", "node %s: %s", o.node.Name, msg)
	}
	d.condition(gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition, true, gpuhealthv1alpha1.ReasonDeadMemberStillListed, msg)
	d.wait(leaveRecheck)
}

// deadSince says whether the node is a dead member by the policy's rules,
// and since when it is NotReady. Inside the grace period it asks for a look
// when the period ends.
func (d *decider) deadSince() (time.Time, bool) {
	o := d.o
	if d.dryRun() || !o.cd.member() || !o.node.Spec.Unschedulable || readiness.Node(o.node) {
		return time.Time{}, false
	}
	since, notReady := member.NotReadySince(o.node)
	if !notReady {
		return time.Time{}, false
	}
	if !member.OutOfService(o.node) && !o.policy.Spec.ComputeDomain.NotReadyIsDead {
		return time.Time{}, false
	}
	if until := since.Add(d.deadMemberGrace()); o.now.Before(&metav1.Time{Time: until}) {
		d.wait(until.Sub(o.now.Time))
		return time.Time{}, false
	}
	return since, true
}

func (d *decider) deadMemberGrace() time.Duration {
	return d.o.policy.Spec.ComputeDomain.DeadMemberGracePeriod.Get(defaultDeadMemberGrace)
}

// ranOnce returns the pods that ever ran: with an IP, or Ready. A daemon
// pod the DaemonSet re-created on a dead node has neither; deleting it
// would only have it re-created again.
func ranOnce(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Status.PodIP != "" || readiness.Pod(p) {
			out = append(out, p)
		}
	}
	return out
}
