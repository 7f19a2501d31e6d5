package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
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
)

// observedMembership is what this reconcile sees of the node's
// ComputeDomain membership, from the node's labels, the daemon pods in the
// cache and the view; no apiserver call.
type observedMembership struct {
	// uid is the domain's UID; empty when no trace names one.
	uid types.UID
	// traces are the signs of membership present now.
	traces []gpuhealthv1alpha1.MembershipTrace
	// cliqueID is the node's clique within the domain, when known.
	cliqueID string
	// domain is the domain object, when the view knows it.
	domain *computedomain.Domain
	// daemonPods are the node's ComputeDomain daemon pods (cache copies).
	daemonPods []*corev1.Pod
}

// member says whether anything still ties the node to a domain.
func (m *observedMembership) member() bool { return len(m.traces) > 0 }

// observeComputeDomain reads the node's membership. Membership sources, in
// the order the driver creates them: the node label (the only one when
// IMEX runs as a host service), the domain's daemon pod, and the entry in
// a ComputeDomainClique or, on drivers without cliques, in the domain's
// status.nodes.
func (r *Reconciler) observeComputeDomain(ctx context.Context, s *scope) error {
	m := &observedMembership{}
	s.cd = m
	if uid := s.node.Labels[computedomain.NodeLabel]; uid != "" {
		m.uid = types.UID(uid)
		m.traces = append(m.traces, gpuhealthv1alpha1.TraceNodeLabel)
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.MatchingFields{PodNodeIndex: s.node.Name}, client.HasLabels{computedomain.NodeLabel}); err != nil {
		return fmt.Errorf("listing daemon pods of node %s: %w", s.node.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if m.uid == "" {
			m.uid = types.UID(p.Labels[computedomain.NodeLabel])
		}
		if m.cliqueID == "" {
			m.cliqueID = p.Labels[computedomain.PodCliqueLabel]
		}
		m.daemonPods = append(m.daemonPods, p)
	}
	if len(m.daemonPods) > 0 {
		m.traces = append(m.traces, gpuhealthv1alpha1.TraceDaemonPod)
	}
	if r.ComputeDomains != nil {
		for _, l := range r.ComputeDomains.Listed(s.node.Name) {
			if m.uid == "" {
				m.uid = l.DomainUID
			}
			if l.DomainUID != m.uid {
				continue // a stale entry of another domain; the label's domain wins
			}
			if l.CliqueID != "" {
				m.cliqueID = l.CliqueID
			}
			if !slices.Contains(m.traces, l.Trace) {
				m.traces = append(m.traces, l.Trace)
			}
		}
		if m.uid == "" && s.nh.Status.ComputeDomain != nil {
			m.uid = types.UID(s.nh.Status.ComputeDomain.UID)
		}
		if m.uid != "" {
			if d, ok := r.ComputeDomains.Domain(m.uid); ok {
				m.domain = &d
			}
		}
	}
	if m.cliqueID == "" && m.member() {
		m.cliqueID = s.node.Labels[computedomain.CliqueNodeLabel]
	}
	slices.Sort(m.traces)
	return nil
}

// isIMEXFinding says whether a finding is about IMEX, which exists on a
// node only while it is a ComputeDomain member.
func isIMEXFinding(sp *gpuhealthv1alpha1.NodeHealthEventSpec) bool {
	return sp.Source == gpuhealthv1alpha1.SourceIMEX || sp.Check == gpuhealthv1alpha1.CheckIMEXDaemon ||
		sp.Check == gpuhealthv1alpha1.CheckIMEXDomain
}

// ignoreNonMemberIMEX overrides the judgement of an IMEX finding about a
// node that is no ComputeDomain member: a stale report from a daemon that
// has gone (or a host service idling without a domain) must not take a
// node out of service.
func ignoreNonMemberIMEX(s *scope, j *judgement) {
	if !isIMEXFinding(&j.event.Spec) || s.cd.member() || j.phase != gpuhealthv1alpha1.EventActive {
		return
	}
	j.verdict, j.counts, j.phase, j.recheckAt = gpuhealthv1alpha1.VerdictIgnore, false, gpuhealthv1alpha1.EventIgnored, time.Time{}
	j.reason = fmt.Sprintf("ignored: node %s is no ComputeDomain member (no %s label, daemon pod or clique entry); IMEX findings apply only to members",
		s.node.Name, computedomain.NodeLabel)
}

// ensureMembershipStatus writes the observed membership into
// status.computeDomain and publishes a MemberLeft Event on the domain when
// the node's last trace goes. A node that left while out of service keeps
// the entry (membership Left) so it still counts against its domain's
// budget; back in service, the entry goes.
func (r *Reconciler) ensureMembershipStatus(s *scope) {
	m, prev := s.cd, s.nh.Status.ComputeDomain
	phase := s.machine.Phase()
	if !m.member() {
		if prev == nil || phase == gpuhealthv1alpha1.PhaseHealthy {
			s.nh.Status.ComputeDomain = nil
			return
		}
		next := prev.DeepCopy()
		next.Membership, next.Traces = gpuhealthv1alpha1.MembershipLeft, nil
		if next.LeftAt == nil {
			next.LeftAt = &s.now
			r.domainEvent(s, corev1.EventTypeNormal, ReasonMemberLeft, "Leave",
				"node %s left the ComputeDomain (%s)", s.node.Name, phase)
		}
		if m.domain != nil {
			next.DomainStatus = m.domain.Status
		}
		s.nh.Status.ComputeDomain = next
		return
	}
	next := &gpuhealthv1alpha1.ComputeDomainMembership{
		UID: string(m.uid), CliqueID: m.cliqueID, Membership: gpuhealthv1alpha1.MembershipMember, Traces: m.traces,
	}
	if phase == gpuhealthv1alpha1.PhaseDraining || phase == gpuhealthv1alpha1.PhaseRecertifying {
		next.Membership = gpuhealthv1alpha1.MembershipLeaving
	}
	if m.domain != nil {
		next.Namespace, next.Name, next.DomainStatus = m.domain.Namespace, m.domain.Name, m.domain.Status
	} else if prev != nil && prev.UID == next.UID {
		next.Namespace, next.Name, next.DomainStatus = prev.Namespace, prev.Name, prev.DomainStatus
	}
	if next.CliqueID == "" && prev != nil && prev.UID == next.UID {
		next.CliqueID = prev.CliqueID
	}
	s.nh.Status.ComputeDomain = next
}

// domainRef is the node's ComputeDomain as an Event target, nil when the
// object is not known (no CRDs, or a host-managed domain).
func (s *scope) domainRef() *corev1.ObjectReference {
	var ns, name string
	var uid types.UID
	switch {
	case s.cd != nil && s.cd.domain != nil:
		ns, name, uid = s.cd.domain.Namespace, s.cd.domain.Name, s.cd.domain.UID
	case s.nh.Status.ComputeDomain != nil && s.nh.Status.ComputeDomain.Name != "":
		cd := s.nh.Status.ComputeDomain
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
func (r *Reconciler) domainEvent(s *scope, eventType, reason, action, note string, args ...any) {
	if ref := s.domainRef(); ref != nil && !s.dryRun() {
		r.Recorder.Eventf(ref, s.node, eventType, reason, action, note, args...)
	}
}

// domainBudgets returns the per-ComputeDomain and per-clique decisions for
// the node. nhs are all NodeHealths (read by the caller through the reader
// the decision needs); nodes are the managed nodes' labels from the cache.
func (r *Reconciler) domainBudgets(s *scope, nhs []gpuhealthv1alpha1.NodeHealth, nodes map[string]map[string]string) ([]budget.Decision, error) {
	var out []budget.Decision
	var errs []error
	// The domain's budget applies while the node is a member: a node whose
	// job ended while it was quarantined holds no domain up.
	if uid := s.cd.uid; uid != "" && s.cd.member() {
		members := map[string]bool{s.node.Name: true}
		for name, lbls := range nodes {
			if lbls[computedomain.NodeLabel] == string(uid) {
				members[name] = true
			}
		}
		if r.ComputeDomains != nil {
			for _, n := range r.ComputeDomains.Members(uid) {
				members[n] = true
			}
		}
		consuming := 0
		for i := range nhs {
			nh := &nhs[i]
			if nh.Name == s.nh.Name || nh.Status.ComputeDomain == nil || nh.Status.ComputeDomain.UID != string(uid) {
				continue
			}
			if usesBudget(nh) {
				members[nh.Name] = true
				consuming++
			}
		}
		limit, err := budget.Limit(s.policy.Spec.Budgets.MaxUnavailablePerComputeDomain, len(members), intstr.FromInt32(1))
		errs = append(errs, err)
		out = append(out, budget.Decision{Name: string(gpuhealthv1alpha1.BudgetPerComputeDomain), Limit: limit,
			Consuming: consuming, Total: len(members), Scope: "ComputeDomain " + s.domainName(uid)})
	}
	if clique := cliqueOf(s.node.Labels, s.nh.Status.ComputeDomain); clique != "" {
		total, consuming := 0, 0
		for name, lbls := range nodes {
			if lbls[computedomain.CliqueNodeLabel] == clique || name == s.node.Name {
				total++
			}
		}
		for i := range nhs {
			nh := &nhs[i]
			lbls, managed := nodes[nh.Name]
			if nh.Name == s.nh.Name || !managed || !usesBudget(nh) {
				continue
			}
			if cliqueOf(lbls, nh.Status.ComputeDomain) == clique {
				consuming++
			}
		}
		limit, err := budget.Limit(s.policy.Spec.Budgets.MaxUnavailablePerClique, total, intstr.FromInt32(1))
		errs = append(errs, err)
		out = append(out, budget.Decision{Name: string(gpuhealthv1alpha1.BudgetPerClique), Limit: limit,
			Consuming: consuming, Total: total, Scope: "clique " + clique})
	}
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// cliqueOf is the node's NVLink clique: its GPU Feature Discovery label,
// else the clique its ComputeDomain membership names.
func cliqueOf(lbls map[string]string, cd *gpuhealthv1alpha1.ComputeDomainMembership) string {
	if c := lbls[computedomain.CliqueNodeLabel]; c != "" {
		return c
	}
	if cd != nil {
		return cd.CliqueID
	}
	return ""
}

func (s *scope) domainName(uid types.UID) string {
	if s.cd.domain != nil && s.cd.domain.UID == uid {
		return s.cd.domain.Namespace + "/" + s.cd.domain.Name
	}
	if cd := s.nh.Status.ComputeDomain; cd != nil && cd.UID == string(uid) && cd.Name != "" {
		return cd.Namespace + "/" + cd.Name
	}
	return string(uid)
}

// awaitLeftComputeDomain holds a drained node in Draining until nothing
// ties it to its ComputeDomain any more: evicting the workload unprepares
// its channel claim, the driver removes the node label, the DaemonSet
// removes the daemon pod and the clique entry goes. Until then the node is
// not drained (peers still hold it as a member). Past the policy's
// leaveTimeout the condition ComputeDomainLeaveStuck turns True with a
// Warning Event, and the node keeps waiting: going on would leave a stale
// member behind.
func (r *Reconciler) awaitLeftComputeDomain(ctx context.Context, s *scope) bool {
	if !s.cd.member() {
		if meta.FindStatusCondition(s.nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition) != nil {
			setCondition(s, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, false, ReasonComputeDomainLeft, "the node left its ComputeDomain")
		}
		return true
	}
	ds := s.nh.Status.Drain
	timeout := s.policy.Spec.ComputeDomain.LeaveTimeout.Get(defaultLeaveTimeout)
	deadline := ds.CompletedAt.Add(timeout)
	traces := traceList(s.cd.traces)
	if s.now.Time.Before(deadline) {
		setStatusReason(s, ReasonLeavingComputeDomain, fmt.Sprintf("drained; waiting to leave ComputeDomain %s (%s remain), stuck after %s",
			s.domainName(s.cd.uid), traces, deadline.UTC().Format(time.RFC3339)))
		s.wait(min(deadline.Sub(s.now.Time), leaveRecheck))
		return false
	}
	msg := fmt.Sprintf("drained %s ago but still tied to ComputeDomain %s by %s", s.now.Sub(ds.CompletedAt.Time).Round(time.Second),
		s.domainName(s.cd.uid), traces)
	if !meta.IsStatusConditionTrue(s.nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition) {
		log.FromContext(ctx).Info("ComputeDomain leave is stuck", "traces", traces)
		r.Recorder.Eventf(s.node, s.nh, corev1.EventTypeWarning, ReasonComputeDomainLeaveStuck, "Leave", "%s", msg)
		r.domainEvent(s, corev1.EventTypeWarning, ReasonComputeDomainLeaveStuck, "Leave", "node %s: %s", s.node.Name, msg)
	}
	setCondition(s, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition, true, ReasonComputeDomainLeaveStuck, msg)
	setStatusReason(s, ReasonComputeDomainLeaveStuck, msg)
	s.wait(leaveRecheck)
	return false
}

func traceList(ts []gpuhealthv1alpha1.MembershipTrace) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = string(t)
	}
	return strings.Join(parts, ", ")
}

// ensureDeadMemberReleased deletes the stale ComputeDomain daemon pods of a
// dead member so the driver drops it from its clique and the surviving
// daemons stop holding a dead peer. Dead means: fenced (out of service and
// cordoned), NotReady for longer than the policy's deadMemberGracePeriod,
// and either carrying the node.kubernetes.io/out-of-service taint or under
// a policy with notReadyIsDead. A Ready node's pods are never touched.
func (r *Reconciler) ensureDeadMemberReleased(ctx context.Context, s *scope) error {
	if s.dryRun() || len(s.cd.daemonPods) == 0 || !s.node.Spec.Unschedulable || member.Ready(s.node) {
		return nil
	}
	since, notReady := member.NotReadySince(s.node)
	if !notReady {
		return nil
	}
	if !member.OutOfService(s.node) && !s.policy.Spec.ComputeDomain.NotReadyIsDead {
		return nil
	}
	if until := since.Add(s.policy.Spec.ComputeDomain.DeadMemberGracePeriod.Get(defaultDeadMemberGrace)); s.now.Time.Before(until) {
		s.wait(until.Sub(s.now.Time))
		return nil
	}
	for _, p := range s.cd.daemonPods {
		log.FromContext(ctx).Info("Deleting stale ComputeDomain daemon pod of a dead member", "Pod", klog.KObj(p), "notReadySince", since)
		if err := member.DeleteStalePod(ctx, r.Client, s.node, p); err != nil {
			return err
		}
		staleDaemonPodsDeleted.Inc()
		r.Recorder.Eventf(s.node, s.nh, corev1.EventTypeWarning, ReasonStaleDaemonPodDeleted, "Delete",
			"deleted ComputeDomain daemon pod %s/%s of the dead node (NotReady since %s)", p.Namespace, p.Name, since.UTC().Format(time.RFC3339))
		r.domainEvent(s, corev1.EventTypeWarning, ReasonStaleDaemonPodDeleted, "Delete",
			"node %s is dead (NotReady since %s, fenced): deleted its daemon pod %s so the other members drop it",
			s.node.Name, since.UTC().Format(time.RFC3339), p.Name)
	}
	return nil
}
