package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// The decide table: one row per branch of the state machine. Each row
// builds an observation by hand — no apiserver, no clock — and checks the
// plan. The envtest suites (controller_test.go and friends) check that
// observe, apply and record carry plans out against a real apiserver.

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// obs is an observation of node "n" at t0 under a default policy.
func obs(mutate ...func(*observation)) *observation {
	now := metav1.NewTime(t0)
	o := &observation{
		now:       now,
		node:      &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1"}},
		nh:        &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: "n", Generation: 1}, Status: gpuhealthv1alpha1.NodeHealthStatus{Phase: healthy}},
		policy:    &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}},
		cd:        &observedMembership{},
		namespace: "gpuhealth-system",
		jobs:      map[string]*batchv1.Job{},
	}
	o.policy.Spec.Quarantine.Taint = &gpuhealthv1alpha1.TaintSpec{Key: quarantineTaint, Effect: corev1.TaintEffectNoSchedule}
	for _, m := range mutate {
		m(o)
	}
	return o
}

func inPhase(p gpuhealthv1alpha1.NodeHealthPhase) func(*observation) {
	return func(o *observation) {
		o.nh.Status.Phase = p
		o.nh.Status.History = []gpuhealthv1alpha1.Transition{{To: p, Reason: "Test", Time: metav1.NewTime(t0.Add(-time.Hour))}}
	}
}

// finding adds an active finding: XID 79 (Fatal, RebootNode) unless changed.
func finding(mutate ...func(*gpuhealthv1alpha1.NodeHealthEvent)) func(*observation) {
	return func(o *observation) {
		seen := metav1.NewTime(t0.Add(-time.Minute))
		ev := &gpuhealthv1alpha1.NodeHealthEvent{
			ObjectMeta: metav1.ObjectMeta{Name: "n-xid-79-" + string(rune('a'+len(o.findings)))},
			Spec: gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: "n", Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
				Code: "79", Severity: gpuhealthv1alpha1.SeverityFatal, Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0"}},
			Status: gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &seen, LastSeen: &seen},
		}
		for _, m := range mutate {
			m(ev)
		}
		o.findings = append(o.findings, ev)
	}
}

func fenced(o *observation) {
	o.node.Spec.Unschedulable = true
	o.node.Spec.Taints = []corev1.Taint{{Key: quarantineTaint, Effect: corev1.TaintEffectNoSchedule}}
	o.node.Annotations = map[string]string{nodepkg.AppliedAnnotation: "cordon,taint=gpuhealth.dev/quarantined:NoSchedule"}
}

func breakerOpen(o *observation) { o.breaker = &breakerView{allowed: false, message: "open: test"} }

func breakerClosed(o *observation) { o.breaker = &breakerView{allowed: true, message: "closed"} }

func room(o *observation) {
	o.budgets = &budgetCount{decisions: []budget.Decision{{Name: string(gpuhealthv1alpha1.BudgetMaxUnavailable), Limit: 1, Total: 10}}}
}

func noRoom(o *observation) {
	o.budgets = &budgetCount{decisions: []budget.Decision{{Name: string(gpuhealthv1alpha1.BudgetMaxUnavailable), Limit: 1, Consuming: 1, Total: 10}}, blocked: []int{0}}
}

func drained(remaining int) func(*observation) {
	return func(o *observation) {
		started := metav1.NewTime(t0.Add(-time.Minute))
		o.nh.Status.Drain = &gpuhealthv1alpha1.DrainStatus{StartedAt: &started}
		o.drain = &drainPass{result: drain.Result{Total: 1, Remaining: remaining}}
	}
}

// gangWave has the drain pass stop a 4-member JobSet gang on 4 nodes
// (three peers of 8 GPUs), or hold it.
func gangWave(held bool) func(*observation) {
	return func(o *observation) {
		w := drain.Wave{Key: gang.Key{Kind: gang.JobSet, Namespace: "train", Name: "llama", Part: "0"},
			Owner:   gang.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama"},
			Members: 4, Nodes: []string{"n", "n1", "n2", "n3"}, SpannedNodes: 4, Evicted: 4, PeerGPUs: 24}
		if held {
			w.Evicted, w.PeerGPUs, w.Held = 0, 0, "held by member train/llama-3 on node n3: PodDisruptionBudget guard allows 0 disruptions"
		}
		o.drain.result.Waves = []drain.Wave{w}
	}
}

func dryRun(o *observation) { o.policy.Spec.DryRun = true }

func held(o *observation) { o.nh.Spec.Hold = true }

// attempt puts the node in recertification attempt n, started a minute ago.
func attempt(n int32) func(*observation) {
	return func(o *observation) {
		inPhase(recertifying)(o)
		fenced(o)
		started := metav1.NewTime(t0.Add(-time.Minute))
		o.nh.Status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: n, StartedAt: &started, Result: gpuhealthv1alpha1.JobPending}
	}
}

// resetOn48 configures the reset step and a rule that resets on XID 48.
func resetOn48(o *observation) {
	o.policy.Spec.Remediation.ResetGPU = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reset"}}
	o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "reset", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"48"}}, Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionResetGPU}}
}

func code48(e *gpuhealthv1alpha1.NodeHealthEvent) { e.Spec.Code = "48" }

// diagnostics configures the diagnostics step: 2 minutes, kept 2 days.
func diagnostics(o *observation) {
	o.policy.Spec.Remediation.Diagnostics = &gpuhealthv1alpha1.DiagnosticsStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "diag"}, Timeout: dur("2m"), Retain: dur("48h")}
}

// diagnosing records the attempt's diagnostics Job as created just now,
// before a reset.
func diagnosing(o *observation) {
	rc := o.nh.Status.Recertification
	rc.Remediation = gpuhealthv1alpha1.ActionResetGPU
	o.nh.Status.Diagnostics = &gpuhealthv1alpha1.DiagnosticsRecord{Job: job.Name(job.Diagnostics, "n", 1, rc.StartedAt.Time), Before: gpuhealthv1alpha1.ActionResetGPU,
		Attempt: 1, StartedAt: &metav1.Time{Time: t0.Add(-5 * time.Second)}, Result: gpuhealthv1alpha1.JobPending}
}

func recertJob(o *observation) {
	o.policy.Spec.Recertification.Job = &gpuhealthv1alpha1.JobTemplate{Image: "dcgm"}
}

func rebootStep(o *observation) {
	o.policy.Spec.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reboot"}, Timeout: dur("10m")}
}

// liveJob adds the node's Job of a kind for its current attempt in a state.
func liveJob(kind job.Kind, result gpuhealthv1alpha1.JobResult) func(*observation) {
	return func(o *observation) {
		rc := o.nh.Status.Recertification
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job.Name(kind, "n", rc.Attempt, rc.StartedAt.Time), Namespace: o.namespace}}
		switch result {
		case gpuhealthv1alpha1.JobSucceeded:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		case gpuhealthv1alpha1.JobFailed:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Message: "exit 1"}}
		case gpuhealthv1alpha1.JobRunning:
			j.Status.Active = 1
		}
		o.jobs[j.Name] = j
	}
}

func bootID(id string, ready bool) func(*observation) {
	return func(o *observation) {
		o.node.Status.NodeInfo.BootID = id
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		o.node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}
	}
}

// rebooting is a reboot step started at t0-1m on boot "boot-1".
func rebooting(o *observation) {
	rc := o.nh.Status.Recertification
	at := metav1.NewTime(t0.Add(-time.Minute))
	rc.RemediationStartedAt, rc.BootID = &at, "boot-1"
}

// approvalFor makes the policy ask for approval of act.
func approvalFor(act gpuhealthv1alpha1.Action) func(*observation) {
	return func(o *observation) {
		if o.policy.Spec.Approval == nil {
			o.policy.Spec.Approval = &gpuhealthv1alpha1.ApprovalSpec{OnTimeout: gpuhealthv1alpha1.ApprovalWait}
		}
		o.policy.Spec.Approval.Actions = append(o.policy.Spec.Approval.Actions, act)
	}
}

func approvalTimeout(d string, on gpuhealthv1alpha1.ApprovalTimeoutPolicy) func(*observation) {
	return func(o *observation) {
		o.policy.Spec.Approval.Timeout, o.policy.Spec.Approval.OnTimeout = dur(d), on
	}
}

// waitingApproval: the current attempt's reboot has waited for approval for ago.
func waitingApproval(ago time.Duration) func(*observation) {
	return func(o *observation) {
		o.nh.Status.Approval = &gpuhealthv1alpha1.ApprovalStatus{Action: gpuhealthv1alpha1.ActionRebootNode, Subject: attemptSubject(o.nh.Status.Recertification),
			State: gpuhealthv1alpha1.ApprovalWaiting, Since: metav1.NewTime(t0.Add(-ago))}
		o.nh.Status.Conditions = append(o.nh.Status.Conditions, metav1.Condition{Type: gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition,
			Status: metav1.ConditionTrue, Reason: gpuhealthv1alpha1.ReasonAwaitingApproval, LastTransitionTime: metav1.NewTime(t0.Add(-ago))})
	}
}

func asks(action gpuhealthv1alpha1.RequestAction) func(*observation) {
	return func(o *observation) {
		o.nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: action, ID: "t-1", Reason: "ticket", RequestedBy: "alice"}
	}
}

func cdMember(o *observation) {
	o.cd = &observedMembership{uid: "cd-1", traces: []gpuhealthv1alpha1.MembershipTrace{gpuhealthv1alpha1.TraceNodeLabel}}
}

// deadMember makes the node dead by the policy's rules: NotReady for an
// hour under notReadyIsDead.
func deadMember(o *observation) {
	o.policy.Spec.ComputeDomain.NotReadyIsDead = true
	o.node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}}
}

// ranPod is a daemon pod that ran: it has an IP.
func ranPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "nvidia"}, Status: corev1.PodStatus{PodIP: "10.1.0.9"}}
}

func phasesOf(p *plan) []gpuhealthv1alpha1.NodeHealthPhase {
	var out []gpuhealthv1alpha1.NodeHealthPhase
	for _, t := range p.transitions {
		out = append(out, t.to)
	}
	return out
}

func reasonsOf(as []announcement) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.eventType+" "+a.reason)
	}
	return out
}

type row struct {
	name  string
	obs   *observation
	check func(g *WithT, p *plan)
}

func TestDecide(t *testing.T) {
	rows := []row{
		// Top level.
		{"excluded: not managed, nothing done", obs(func(o *observation) { o.nh.Spec.Exclude = true }, finding()), func(g *WithT, p *plan) {
			g.Expect(meta.IsStatusConditionFalse(p.status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)).To(BeTrue())
			g.Expect(p.node).To(Equal(nodeUnchanged))
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"excluded mid-recertification: held where it is, its unfinished Jobs deleted", obs(attempt(1), recertJob, finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobPending),
			func(o *observation) { o.nh.Spec.Exclude = true }), func(g *WithT, p *plan) {
			g.Expect(p.deleteJobs).To(BeTrue())
			g.Expect(p.node).To(Equal(nodeUnchanged), "the cordon and taint stay")
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition).Message).To(ContainSubstring("deleting its unfinished jobs"))
		}},
		{"the policy breaks the Job rules: nothing done, even mid-recertification, and the condition says why",
			obs(finding(), breakerClosed, attempt(1), rebootStep, func(o *observation) {
				o.breaches = []string{`spec.remediation.rebootNode.job: serviceAccountName "gpuhealth-operator" is gpuhealth's own identity and never a Job's`}
			}), func(g *WithT, p *plan) {
				c := meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonJobRulesBreached))
				g.Expect(c.Message).To(ContainSubstring(`serviceAccountName "gpuhealth-operator"`))
				g.Expect(p.node).To(Equal(nodeUnchanged))
				g.Expect(p.createJobs).To(BeEmpty())
				g.Expect(p.deleteJobs).To(BeFalse())
				g.Expect(p.transitions).To(BeEmpty())
				g.Expect(p.reserveBreaker).To(BeFalse())
				g.Expect(p.status.Phase).To(Equal(recertifying), "left where it was")
			}},
		{"unknown phase: no decision", obs(inPhase("Broken")), func(g *WithT, p *plan) {
			g.Expect(p.err).To(MatchError(ContainSubstring("unknown phase")))
		}},
		{"first sight: Healthy recorded, released", obs(func(o *observation) { o.nh.Status = gpuhealthv1alpha1.NodeHealthStatus{} }), func(g *WithT, p *plan) {
			g.Expect(p.status.Phase).To(Equal(healthy))
			g.Expect(p.status.History).To(HaveLen(1))
			g.Expect(p.status.History[0].Reason).To(Equal(gpuhealthv1alpha1.ReasonManaged))
			g.Expect(p.node).To(Equal(nodeInService))
		}},

		// Healthy.
		{"healthy without findings: kept in service", obs(), func(g *WithT, p *plan) {
			g.Expect(p.node).To(Equal(nodeInService))
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.announce).To(BeEmpty())
		}},
		{"healthy, dry run, no findings: the node is not touched", obs(dryRun), func(g *WithT, p *plan) {
			g.Expect(p.node).To(Equal(nodeUnchanged))
		}},
		{"an Info finding is ignored", obs(finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			e.Spec.Check, e.Spec.Code, e.Spec.Severity = gpuhealthv1alpha1.CheckNVLinkErrors, "CRC", gpuhealthv1alpha1.SeverityInfo
		})), func(g *WithT, p *plan) {
			g.Expect(p.judged[0].phase).To(Equal(gpuhealthv1alpha1.EventIgnored))
			g.Expect(p.node).To(Equal(nodeInService))
		}},
		{"a fault without the breaker's state is not decided", obs(finding()), func(g *WithT, p *plan) {
			g.Expect(p.err).To(MatchError(ContainSubstring("circuit breaker")))
			g.Expect(p.node).To(Equal(nodeUnchanged))
		}},
		{"a fault, breaker open: not quarantined, held on the Node, looks again", obs(finding(), breakerOpen), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCircuitBreakerOpen))
			g.Expect(p.node).To(Equal(nodeHeld), "GPUHealthy Unknown, never the True of a healthy node")
			g.Expect(p.nodeReason).To(Equal(gpuhealthv1alpha1.ReasonQuarantineHeld))
			g.Expect(p.nodeMessage).To(HavePrefix("not quarantined, circuit breaker "))
			g.Expect(p.announce).To(ContainElement(WithTransform(func(a announcement) string { return a.reason }, Equal(gpuhealthv1alpha1.ReasonQuarantineHeld))), "one Event on the node")
			g.Expect(p.reserveBreaker).To(BeFalse())
			g.Expect(p.requeue).To(Equal(breakerRecheck))
		}},
		{"a fault, breaker closed: fence only, counted by the breaker", obs(finding(), breakerClosed), func(g *WithT, p *plan) {
			g.Expect(p.node).To(Equal(nodeFence))
			g.Expect(p.fenceOnly).To(BeTrue())
			g.Expect(p.reserveBreaker).To(BeTrue())
			g.Expect(p.transitions).To(BeEmpty(), "the bookkeeping follows the fence")
			g.Expect(p.announce).To(BeEmpty())
		}},
		{"a fault beside a resolved finding in its clearAfter: the bookkeeping follows the fence at once, not at the recheck",
			obs(finding(), breakerClosed, finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
				e.Spec.Check, e.Spec.Code, e.Spec.Severity = gpuhealthv1alpha1.CheckNVLinkErrors, "CRC_FLIT", gpuhealthv1alpha1.SeverityDegraded
				e.Status.Resolved, e.Status.ResolvedAt = true, &metav1.Time{Time: t0.Add(-time.Minute)}
			}), func(o *observation) {
				o.policy.Spec.Rules = append([]gpuhealthv1alpha1.Rule{{Name: "nvlink", Match: gpuhealthv1alpha1.RuleMatch{Checks: []gpuhealthv1alpha1.Check{gpuhealthv1alpha1.CheckNVLinkErrors}},
					Verdict: gpuhealthv1alpha1.VerdictObserve, Recovery: &gpuhealthv1alpha1.Recovery{ClearAfter: "5m"}}}, o.policy.Spec.Rules...)
			}), func(g *WithT, p *plan) {
				g.Expect(p.fenceOnly).To(BeTrue())
				g.Expect(result(p).RequeueAfter).To(Equal(time.Millisecond))
			}},
		{"fenced, a storm goes on: the bookkeeping waits", obs(finding(), fenced, func(o *observation) { o.stormHold = 300 * time.Millisecond }), func(g *WithT, p *plan) {
			g.Expect(p.fenceOnly).To(BeTrue())
			g.Expect(p.requeue).To(Equal(300 * time.Millisecond))
			g.Expect(p.reserveBreaker).To(BeFalse(), "counted at the fence")
		}},
		{"fenced: quarantined and draining, confirmed from the apiserver", obs(finding(), fenced, room), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined, draining}))
			g.Expect(p.reserveBreaker).To(BeFalse(), "a fenced node was counted when it was fenced")
			g.Expect(p.confirmBudget).To(BeTrue())
			g.Expect(p.immediate).To(BeTrue(), "the drain starts in the next pass")
			g.Expect(p.node).To(Equal(nodeOutOfService))
			g.Expect(p.nodeReason).To(Equal(gpuhealthv1alpha1.ReasonDraining))
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning Fault", "Warning Draining"}))
			g.Expect(p.judged[0].event.Status.ObservedBy.To).To(Equal(quarantined))
			g.Expect(p.status.Drain.StartedAt).NotTo(BeNil())
		}},
		{"fenced, counted from the apiserver: no second count", obs(finding(), fenced, room, func(o *observation) { o.budgets.fromAPIServer = true }), func(g *WithT, p *plan) {
			g.Expect(p.confirmBudget).To(BeFalse())
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined, draining}))
		}},
		{"a policy that neither cordons nor taints quarantines at once", obs(finding(), breakerClosed, room, func(o *observation) {
			o.policy.Spec.Quarantine.Cordon, o.policy.Spec.Quarantine.Taint = ptr.To(false), nil
		}), func(g *WithT, p *plan) {
			g.Expect(p.reserveBreaker).To(BeTrue())
			g.Expect(p.fenceOnly).To(BeFalse())
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined, draining}))
		}},
		{"dry run: recorded as quarantined, the node untouched", obs(finding(), breakerClosed, dryRun), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonDryRun))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonDryRun))
			g.Expect(p.node).To(Equal(nodeUnchanged), "not even its condition")
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonDryRun}), "the decision is published")
		}},
		{"debounce not reached: observed, not counted", obs(breakerClosed, finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) { e.Spec.Code = "13" }), func(o *observation) {
			o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "xid13", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"13"}},
				Verdict: gpuhealthv1alpha1.VerdictQuarantine, Debounce: &gpuhealthv1alpha1.Debounce{Count: 5, Window: gpuhealthv1alpha1.Duration("24h")}}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.judged[0].counts).To(BeFalse())
			g.Expect(p.judged[0].reason).To(ContainSubstring("waits for 5 occurrences within 24h0m0s (seen 1)"))
			g.Expect(p.judged[0].event.Status.Occurrences).To(HaveLen(1), "the count seen is sampled")
			g.Expect(p.node).To(Equal(nodeInService))
		}},

		// Quarantined.
		{"quarantined, held", obs(inPhase(quarantined), fenced, finding(), held, room), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHeld))
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.node).To(Equal(nodeOutOfService))
		}},
		{"quarantined after a failed attempt: backoff", obs(inPhase(quarantined), fenced, finding(), room, func(o *observation) {
			done := metav1.NewTime(t0.Add(-time.Minute))
			o.nh.Status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, Result: gpuhealthv1alpha1.JobFailed, CompletedAt: &done}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonBackoff))
			g.Expect(p.requeue).To(Equal(4 * time.Minute))
		}},
		{"quarantined without a count: counted in the next pass", obs(inPhase(quarantined), fenced, finding()), func(g *WithT, p *plan) {
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"quarantined, no room: waits, counted once", obs(inPhase(quarantined), fenced, finding(), noRoom), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
			g.Expect(p.status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetMaxUnavailable))
			g.Expect(p.budgetBlocked).To(Equal(gpuhealthv1alpha1.BudgetMaxUnavailable))
			g.Expect(p.requeue).To(Equal(budgetRecheck))
		}},
		{"quarantined, still no room for the same budget: not counted again", obs(inPhase(quarantined), fenced, finding(), noRoom, func(o *observation) {
			o.nh.Status.BlockingBudget = gpuhealthv1alpha1.BudgetMaxUnavailable
		}), func(g *WithT, p *plan) {
			g.Expect(p.budgetBlocked).To(BeEmpty())
			g.Expect(p.announce).To(BeEmpty())
		}},
		{"a member without room: the domain hears of it", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, func(o *observation) {
			o.nh.Status.ComputeDomain = &gpuhealthv1alpha1.ComputeDomainMembership{UID: "cd-1", Namespace: "ml", Name: "train"}
		}), func(g *WithT, p *plan) {
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonMemberWaitingForBudget}))
		}},
		{"quarantined, a budget that cannot be resolved: waits, fails closed", obs(inPhase(quarantined), fenced, finding(), func(o *observation) {
			o.budgets = &budgetCount{decisions: []budget.Decision{{Name: string(gpuhealthv1alpha1.BudgetPerClique)}}, err: errors.New("bad percentage")}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
			g.Expect(p.status.Message).To(ContainSubstring("bad percentage"))
			g.Expect(p.status.BlockingBudget).To(Equal(gpuhealthv1alpha1.BudgetPerClique))
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"a member that left while quarantined: Left, announced once, still counted", obs(inPhase(quarantined), fenced, finding(), noRoom, func(o *observation) {
			o.nh.Status.ComputeDomain = &gpuhealthv1alpha1.ComputeDomainMembership{UID: "cd-1", Namespace: "ml", Name: "train", Membership: gpuhealthv1alpha1.MembershipMember}
			o.nh.Status.BlockingBudget = gpuhealthv1alpha1.BudgetMaxUnavailable
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeft))
			g.Expect(p.status.ComputeDomain.LeftAt).NotTo(BeNil())
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Normal " + gpuhealthv1alpha1.ReasonMemberLeft}))
		}},
		{"dry run, quarantined, the finding gone: cancelled", obs(inPhase(quarantined), dryRun), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonDryRun))
			g.Expect(p.node).To(Equal(nodeUnchanged))
		}},
		{"dry run, quarantined: would drain", obs(inPhase(quarantined), dryRun, finding()), func(g *WithT, p *plan) {
			g.Expect(p.status.Message).To(ContainSubstring("would drain"))
		}},

		// Draining.
		{"draining, held", obs(inPhase(draining), fenced, finding(), held), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHeld))
		}},
		{"draining without a drain pass: drains in the next pass", obs(inPhase(draining), fenced, finding()), func(g *WithT, p *plan) {
			g.Expect(p.immediate).To(BeTrue())
		}},
		{"draining, pods left", obs(inPhase(draining), fenced, finding(), drained(2)), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonDraining))
			g.Expect(p.status.Drain.PodsRemaining).To(BeEquivalentTo(2))
			g.Expect(p.requeue).To(Equal(drainRecheck))
		}},
		{"draining, the drain pass failed: the error is kept, not done", obs(inPhase(draining), fenced, finding(), drained(0), func(o *observation) {
			o.drain.err = errors.New("listing pods: timeout")
		}), func(g *WithT, p *plan) {
			g.Expect(p.err).To(MatchError(ContainSubstring("listing pods")))
			g.Expect(p.status.Drain.CompletedAt).To(BeNil())
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"draining, a PDB blocks: the budget's change wakes it, the recheck is a safety net", obs(inPhase(draining), fenced, finding(), drained(1), func(o *observation) { o.drain.result.Blocked = 1 }), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonBlockedByPDB))
			g.Expect(p.requeue).To(Equal(drainRecheck))
		}},
		{"draining, pods left for lack of an eviction token: looks again soon", obs(inPhase(draining), fenced, finding(), drained(3), func(o *observation) {
			o.drain.result.Deferred, o.drain.result.Blocked = 2, 1
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonBlockedByPDB))
			g.Expect(p.requeue).To(Equal(drainDeferredRecheck))
		}},
		{"draining, a gang's wave sent: recorded once, the node and the gang's owner told, the stranded GPU-time counted",
			obs(inPhase(draining), fenced, finding(), drained(1), gangWave(false)), func(g *WithT, p *plan) {
				gs := p.status.Drain.Gangs
				g.Expect(gs).To(HaveLen(1))
				g.Expect(gs[0]).To(MatchFields(IgnoreExtras, Fields{"Kind": Equal("JobSet"), "Namespace": Equal("train"), "Name": Equal("llama"),
					"Part": Equal("0"), "Owner": Equal("JobSet llama"), "Size": BeEquivalentTo(4), "SpannedNodes": BeEquivalentTo(4), "Held": BeEmpty()}))
				g.Expect(gs[0].EvictedAt).NotTo(BeNil())
				g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Normal " + gpuhealthv1alpha1.ReasonGangStopped, "Warning " + gpuhealthv1alpha1.ReasonGangStopped}))
				g.Expect(p.announce[1].regarding.(*metav1.PartialObjectMetadata).Name).To(Equal("llama"))
				g.Expect(p.status.Message).To(ContainSubstring("JobSet train/llama (0) stopped: 4 members on 4 nodes"))
				g.Expect(p.gangWaves).To(HaveLen(1))
				// Three peers of 8 GPUs held them for the minute since the drain began.
				g.Expect(p.gangWaves[0].strandedGPUSeconds).To(BeNumerically("==", 24*60))
			}},
		{"draining, the wave already recorded: no second Event", obs(inPhase(draining), fenced, finding(), drained(1), gangWave(false), func(o *observation) {
			sent := metav1.NewTime(t0.Add(-time.Second))
			o.nh.Status.Drain.Gangs = []gpuhealthv1alpha1.GangWave{{Kind: "JobSet", Namespace: "train", Name: "llama", Part: "0", Size: 4, EvictedAt: &sent}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.announce).To(BeEmpty())
			g.Expect(p.gangWaves).To(BeEmpty())
			g.Expect(p.status.Drain.Gangs[0].EvictedAt.Time).To(Equal(t0.Add(-time.Second)))
		}},
		{"draining, a wave sent in a pass whose status write was lost: recorded once its members are seen leaving", obs(inPhase(draining), fenced, finding(), drained(1), gangWave(false), func(o *observation) {
			w := &o.drain.result.Waves[0]
			w.Evicted, w.Leaving, w.PeerGPUs = 0, 4, 0
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Drain.Gangs).To(HaveLen(1))
			g.Expect(p.status.Drain.Gangs[0].EvictedAt).NotTo(BeNil())
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal " + gpuhealthv1alpha1.ReasonGangStopped))
		}},
		{"draining, a ninth gang: not recorded, still announced and counted", obs(inPhase(draining), fenced, finding(), drained(1), gangWave(false), func(o *observation) {
			for i := range 8 {
				o.nh.Status.Drain.Gangs = append(o.nh.Status.Drain.Gangs, gpuhealthv1alpha1.GangWave{Kind: "JobSet", Namespace: "train", Name: fmt.Sprintf("other-%d", i), EvictedAt: &o.now})
			}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Drain.Gangs).To(HaveLen(8))
			g.Expect(p.gangWaves).To(HaveLen(1))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal " + gpuhealthv1alpha1.ReasonGangStopped))
		}},
		{"draining, a gang's wave held by a member's budget: one Warning, not sent", obs(inPhase(draining), fenced, finding(), drained(1), gangWave(true)), func(g *WithT, p *plan) {
			gs := p.status.Drain.Gangs
			g.Expect(gs).To(HaveLen(1))
			g.Expect(gs[0].EvictedAt).To(BeNil())
			g.Expect(gs[0].Held).To(ContainSubstring("held by member"))
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonGangHeld}))
			g.Expect(p.status.Message).To(ContainSubstring("held: 4 members"))
		}},
		{"draining, members of a sent wave left to evict elsewhere: not done", obs(inPhase(draining), fenced, finding(), drained(0), gangWave(false), func(o *observation) {
			o.drain.result.WavePending = 1
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Drain.CompletedAt).To(BeNil())
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.Message).To(ContainSubstring("1 members of its gangs on other nodes left to evict"))
		}},
		{"draining past the timeout: DrainTimedOut with one Event", obs(inPhase(draining), fenced, finding(), drained(1), func(o *observation) {
			o.drain.result.TimedOut, o.drain.result.TimedOutPods = 1, []gpuhealthv1alpha1.BlockedPod{{Namespace: "ml", Name: "trainer-0"}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonDrainTimedOut))
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition)).To(BeTrue())
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonDrainTimedOut}))
		}},
		{"still past the timeout: no second Event", obs(inPhase(draining), fenced, finding(), drained(1), func(o *observation) {
			o.drain.result.TimedOut = 1
			meta.SetStatusCondition(&o.nh.Status.Conditions, metav1.Condition{Type: gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition, Status: metav1.ConditionTrue, Reason: "x"})
		}), func(g *WithT, p *plan) {
			g.Expect(p.announce).To(BeEmpty())
		}},
		{"drained, still a member: waits to leave", obs(inPhase(draining), fenced, finding(), drained(0), cdMember), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonLeavingComputeDomain))
			g.Expect(p.status.ComputeDomain.Membership).To(Equal(gpuhealthv1alpha1.MembershipLeaving))
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"drained, a member past leaveTimeout: stuck", obs(inPhase(draining), fenced, finding(), drained(0), cdMember, func(o *observation) {
			done := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Drain.CompletedAt = &done
		}), func(g *WithT, p *plan) {
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthComputeDomainLeaveStuckCondition)).To(BeTrue())
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonComputeDomainLeaveStuck))
		}},
		{"drained, the finding asks for support: Failed", obs(inPhase(draining), fenced, drained(0), finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			e.Spec.Check, e.Spec.Code, e.Spec.RecommendedAction = gpuhealthv1alpha1.CheckGPULost, "GPU_LOST", gpuhealthv1alpha1.ActionContactSupport
		})), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{failed}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonNeedsHuman))
		}},
		{"drained: attempt 1 starts, written before any Job", obs(inPhase(draining), fenced, finding(), drained(0), recertJob), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{recertifying}))
			g.Expect(p.status.Recertification.Attempt).To(BeEquivalentTo(1))
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.status.Drain.CompletedAt).NotTo(BeNil())
		}},

		// Recertifying.
		{"recertifying without an attempt: one starts", obs(inPhase(recertifying), fenced, finding()), func(g *WithT, p *plan) {
			g.Expect(p.status.Recertification.Attempt).To(BeEquivalentTo(1))
			g.Expect(p.immediate).To(BeTrue())
		}},
		{"recertifying, held", obs(attempt(1), finding(), held), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHeld))
		}},
		{"reset step: its Job is created", obs(attempt(1), recertJob, finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) { e.Spec.Code = "48" }), func(o *observation) {
			o.policy.Spec.Remediation.ResetGPU = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reset"}}
			o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "reset", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"48"}}, Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionResetGPU}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.ResetGPU)))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))
		}},
		{"a reset done in this attempt is not judged again: its Job gone, none is made", obs(attempt(1), recertJob, resetOn48, finding(code48), func(o *observation) {
			done := metav1.NewTime(t0.Add(-30 * time.Second))
			o.nh.Status.Recertification.Remediation, o.nh.Status.Recertification.RemediatedAt = gpuhealthv1alpha1.ActionResetGPU, &done
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.Recertification)), "the suite goes on; no second reset")
		}},
		{"a reset asked for mid-attempt waits for the next attempt, never runs beside the suite", obs(attempt(1), recertJob, resetOn48, finding(code48), liveJob(job.Recertification, gpuhealthv1alpha1.JobPending), func(o *observation) {
			o.nh.Status.Recertification.Remediation = gpuhealthv1alpha1.ActionNone
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.status.Recertification.Remediation).To(Equal(gpuhealthv1alpha1.ActionNone))
		}},
		{"an attempt fixes its remediation when it reaches it", obs(attempt(1), recertJob, resetOn48, finding(code48)), func(g *WithT, p *plan) {
			g.Expect(p.status.Recertification.Remediation).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
			g.Expect(p.status.Recertification.RemediatedAt).To(BeNil())
		}},
		{"a reset whose Job succeeded is recorded done", obs(attempt(1), recertJob, resetOn48, finding(code48), liveJob(job.ResetGPU, gpuhealthv1alpha1.JobSucceeded)), func(g *WithT, p *plan) {
			g.Expect(p.status.Recertification.RemediatedAt).To(HaveValue(Equal(metav1.NewTime(t0))))
		}},
		// Diagnostics before the reset.
		{"diagnostics configured: its Job first, kept for retain, no reset yet", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48)), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			j := p.createJobs[0]
			g.Expect(j.Labels[job.KindLabel]).To(Equal(string(job.Diagnostics)))
			g.Expect(j.Spec.TTLSecondsAfterFinished).To(HaveValue(BeEquivalentTo(48 * 3600)))
			g.Expect(j.Spec.ActiveDeadlineSeconds).To(HaveValue(BeEquivalentTo(120)))
			dg := p.status.Diagnostics
			g.Expect(dg).NotTo(BeNil())
			g.Expect(dg.Job).To(Equal(j.Name))
			g.Expect(dg.Before).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))
			g.Expect(p.status.Message).To(ContainSubstring("collecting diagnostics before ResetGPU"))
		}},
		{"diagnostics running: the reset waits", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), diagnosing, liveJob(job.Diagnostics, gpuhealthv1alpha1.JobRunning)), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.status.Diagnostics.Result).To(Equal(gpuhealthv1alpha1.JobRunning))
			g.Expect(p.status.Recertification.DiagnosedAt).To(BeNil())
		}},
		{"diagnostics collected: the reset goes ahead, the record says where the log is and until when", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), diagnosing,
			liveJob(job.Diagnostics, gpuhealthv1alpha1.JobSucceeded), func(o *observation) {
				rc := o.nh.Status.Recertification
				o.jobs[job.Name(job.Diagnostics, "n", 1, rc.StartedAt.Time)].Status.CompletionTime = &metav1.Time{Time: t0.Add(-time.Minute)}
			}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.ResetGPU)))
			dg := p.status.Diagnostics
			g.Expect(dg.Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
			g.Expect(dg.KeptUntil).To(HaveValue(Equal(metav1.NewTime(t0.Add(48*time.Hour - time.Minute)))))
			g.Expect(p.status.Recertification.DiagnosedAt).To(HaveValue(Equal(metav1.NewTime(t0))))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal " + gpuhealthv1alpha1.ReasonDiagnosticsCollected))
		}},
		{"diagnostics failed: the reset goes ahead anyway, said in a Warning", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), diagnosing,
			liveJob(job.Diagnostics, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.ResetGPU)))
			g.Expect(p.status.Diagnostics.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonDiagnosticsFailed))
		}},
		{"diagnostics Job not seen (not cached yet, refused, deleted) within its timeout: asked for again, the reset waits", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), diagnosing, func(o *observation) {
			at := metav1.NewTime(t0.Add(-90 * time.Second))
			o.nh.Status.Diagnostics.StartedAt = &at
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.Diagnostics)), "creating an existing Job is a no-op")
			g.Expect(p.status.Recertification.DiagnosedAt).To(BeNil())
			g.Expect(p.requeue).To(Equal(30*time.Second), "until its timeout")
		}},
		{"diagnostics Job not seen past its timeout: the reset goes ahead", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), diagnosing, func(o *observation) {
			at := metav1.NewTime(t0.Add(-2 * time.Minute))
			o.nh.Status.Diagnostics.StartedAt = &at
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.ResetGPU)))
			g.Expect(p.status.Diagnostics.Message).To(ContainSubstring("not seen within its 2m0s timeout"))
		}},
		{"diagnostics done in this attempt: not again", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), func(o *observation) {
			at := metav1.NewTime(t0.Add(-time.Minute))
			o.nh.Status.Recertification.DiagnosedAt = &at
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.ResetGPU)))
		}},
		{"diagnostics, then approval: collected before the act waits for a person", obs(attempt(1), recertJob, resetOn48, diagnostics, finding(code48), approvalFor(gpuhealthv1alpha1.ActionResetGPU)), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.Diagnostics)))
			g.Expect(p.status.Approval).To(BeNil(), "asked once the evidence is in")
		}},
		{"no reset in this attempt: no diagnostics", obs(attempt(1), recertJob, diagnostics, finding()), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.Recertification)))
			g.Expect(p.status.Diagnostics).To(BeNil())
		}},
		{"recertification Job failed: back to quarantine", obs(attempt(1), recertJob, finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonRecertificationFailed))
			g.Expect(p.status.Recertification.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
		}},
		{"the last attempt failed: Failed", obs(attempt(3), recertJob, finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{failed}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonRecertificationExhausted))
		}},
		{"approval asked: a reboot waits, with AwaitingApproval and one Event", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval).NotTo(BeNil())
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalWaiting))
			g.Expect(p.status.Approval.Subject).To(ContainSubstring("attempt 1"))
			g.Expect(p.status.Recertification.RemediationStartedAt).To(BeNil(), "the step does not start")
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition)).To(BeTrue())
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonAwaitingApproval))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonAwaitingApproval))
		}},
		{"approval asked, still waiting: no second Event", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode), waitingApproval(10*time.Minute)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalWaiting))
			g.Expect(reasonsOf(p.announce)).NotTo(ContainElement("Warning " + gpuhealthv1alpha1.ReasonAwaitingApproval))
			g.Expect(p.status.Recertification.RemediationStartedAt).To(BeNil())
		}},
		{"a request Approve lets the reboot start, naming who approved", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode),
			waitingApproval(10*time.Minute), asks(gpuhealthv1alpha1.RequestApprove)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalApproved))
			g.Expect(p.status.Approval.By).To(ContainSubstring("alice"))
			g.Expect(p.status.Approval.Reason).To(Equal("ticket"))
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("approved RebootNode"))
			g.Expect(p.status.Recertification.RemediationStartedAt).NotTo(BeNil(), "the reboot step starts: its boot ID written down")
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition)).To(BeFalse())
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal " + gpuhealthv1alpha1.ReasonApproved))
		}},
		{"a request Approve with nothing waiting does nothing", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), asks(gpuhealthv1alpha1.RequestApprove)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval).To(BeNil())
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("nothing to approve"))
		}},
		{"an approval holds for its attempt only", obs(attempt(2), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode), func(o *observation) {
			o.nh.Status.Approval = &gpuhealthv1alpha1.ApprovalStatus{Action: gpuhealthv1alpha1.ActionRebootNode, Subject: "recertification attempt 1 (started 2026-12-01T11:00:00Z)",
				State: gpuhealthv1alpha1.ApprovalApproved, Since: metav1.NewTime(t0.Add(-time.Hour)), By: "alice"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalWaiting))
			g.Expect(p.status.Approval.Subject).To(ContainSubstring("attempt 2"))
			g.Expect(p.status.Recertification.RemediationStartedAt).To(BeNil())
		}},
		{"nobody approved within the timeout, onTimeout Proceed: the reboot starts", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode),
			approvalTimeout("1h", gpuhealthv1alpha1.ApprovalProceed), waitingApproval(2*time.Hour)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalTimedOut))
			g.Expect(p.status.Recertification.RemediationStartedAt).NotTo(BeNil())
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonApprovalTimedOut))
		}},
		{"nobody approved within the timeout, onTimeout Wait: still waiting", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode),
			approvalTimeout("1h", gpuhealthv1alpha1.ApprovalWait), waitingApproval(2*time.Hour)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval.State).To(Equal(gpuhealthv1alpha1.ApprovalWaiting))
			g.Expect(p.status.Recertification.RemediationStartedAt).To(BeNil())
		}},
		{"released while waiting: the wait and its condition go", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionRebootNode),
			waitingApproval(10*time.Minute), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Approval).To(BeNil())
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition)).To(BeFalse())
		}},
		{"only the acts listed wait: a reboot when the policy asks about GPU resets", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), approvalFor(gpuhealthv1alpha1.ActionResetGPU)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval).To(BeNil())
			g.Expect(p.status.Recertification.RemediationStartedAt).NotTo(BeNil())
		}},
		{"a reboot already under way is not stopped by a new approval rule", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), rebooting, approvalFor(gpuhealthv1alpha1.ActionRebootNode)), func(g *WithT, p *plan) {
			g.Expect(p.status.Approval).To(BeNil())
			g.Expect(p.createJobs).To(HaveLen(1))
		}},
		{"reboot step: the boot ID is written down first", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true)), func(g *WithT, p *plan) {
			g.Expect(p.status.Recertification.BootID).To(Equal("boot-1"))
			g.Expect(p.status.Recertification.RemediationStartedAt).NotTo(BeNil())
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.immediate).To(BeTrue())
		}},
		{"reboot step: the Job is created once", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), rebooting), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.status.Recertification.RemediationJob).To(Equal(p.createJobs[0].Name))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))
		}},
		{"reboot step: a Job gone with its pod is not made again", obs(attempt(1), rebootStep, finding(), bootID("boot-1", false), rebooting, func(o *observation) {
			rc := o.nh.Status.Recertification
			rc.RemediationJob = job.Name(job.RebootNode, "n", 1, rc.StartedAt.Time)
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.status.Message).To(ContainSubstring("gone"))
		}},
		{"reboot step: its Job failed, the boot ID not yet changed: waits", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), rebooting,
			func(o *observation) {
				o.nh.Status.Recertification.RemediationJob = job.Name(job.RebootNode, "n", 1, o.nh.Status.Recertification.StartedAt.Time)
			},
			liveJob(job.RebootNode, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty(), "a reboot kills its own pod: the Job's failure is no verdict")
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))
		}},
		{"reboot step: new boot ID and Ready: on to recertification", obs(attempt(1), rebootStep, recertJob, finding(), bootID("boot-2", true), rebooting), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels[job.KindLabel]).To(Equal(string(job.Recertification)))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertifying))
		}},
		{"reboot step: new boot ID, not Ready: waits", obs(attempt(1), rebootStep, recertJob, finding(), bootID("boot-2", false), rebooting), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))
		}},
		{"reboot step done, recertifying, the node NotReady later: still done", obs(attempt(1), rebootStep, recertJob, finding(), bootID("boot-2", false), rebooting,
			func(o *observation) { o.nh.Status.Recertification.JobName = "gpuhealth-recert-n-1" }), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertifying))
		}},
		{"reboot step: no new boot ID within the timeout: the attempt fails", obs(attempt(1), rebootStep, finding(), bootID("boot-1", true), rebooting, func(o *observation) {
			at := metav1.NewTime(t0.Add(-11 * time.Minute))
			o.nh.Status.Recertification.RemediationStartedAt = &at
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.status.Recertification.Message).To(ContainSubstring("did not report a new boot ID"))
		}},
		{"reboot step on a node without a boot ID: the Job decides", obs(attempt(1), rebootStep, finding(), bootID("", true), func(o *observation) {
			at := metav1.NewTime(t0.Add(-time.Minute))
			o.nh.Status.Recertification.RemediationStartedAt = &at
		}, liveJob(job.RebootNode, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
		}},
		{"recertification passed: soak", obs(attempt(1), recertJob, finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobSucceeded)), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonSoaking))
			g.Expect(p.requeue).To(Equal(defaultSoak))
			g.Expect(p.status.Recertification.Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
		}},
		{"a new finding during recertification supersedes the attempt", obs(attempt(1), finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			seen := metav1.NewTime(t0)
			e.Status.LastSeen = &seen
		})), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.status.Recertification.Message).To(ContainSubstring("superseded by a new finding during recertification"))
			g.Expect(p.status.Recertification.Result).To(Equal(gpuhealthv1alpha1.JobSuperseded))
		}},
		{"soaked, a fabric finding open: waits for it", obs(attempt(1), finding(), finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			e.Spec.Source, e.Spec.Check, e.Spec.Code, e.Spec.Severity = gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckFabric, "NOT_COMPLETED", gpuhealthv1alpha1.SeverityDegraded
		}), func(o *observation) {
			done := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Recertification.CompletedAt = &done
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForResolution))
		}},
		{"soaked and clean: Healthy, findings closed, released after the write", obs(attempt(1), finding(), func(o *observation) {
			done := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Recertification.CompletedAt = &done
			o.findings[0].Status.Count = 4
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonRecertified))
			g.Expect(p.node).To(Equal(nodeInService))
			g.Expect(p.status.Recertification).To(BeNil())
			st := p.judged[0].event.Status
			g.Expect(st.Phase).To(Equal(gpuhealthv1alpha1.EventSuperseded))
			g.Expect(st.SupersededCount).To(BeEquivalentTo(4), "a debounce counts from here")
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Normal " + gpuhealthv1alpha1.ReasonRecertified}))
		}},

		// Failed.
		{"failed: kept out of service", obs(inPhase(failed), fenced, finding()), func(g *WithT, p *plan) {
			g.Expect(p.node).To(Equal(nodeOutOfService))
			g.Expect(p.transitions).To(BeEmpty())
		}},

		// Requests.
		{"release while draining: Healthy, its Jobs ended, who asked recorded", obs(attempt(1), finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobRunning), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.deleteJobs).To(BeTrue())
			g.Expect(p.status.History[len(p.status.History)-1].By).To(Equal("alice"))
			g.Expect(p.status.LastRequest.Result).To(Equal("released from Recertifying"))
			g.Expect(p.node).To(Equal(nodeInService))
		}},
		{"release while healthy: nothing to do", obs(asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("nothing to do"))
		}},
		{"recertify while healthy: quarantined", obs(asks(gpuhealthv1alpha1.RequestRecertify), fenced), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonManualRecertify))
			g.Expect(p.immediate).To(BeTrue(), "counted in the next pass")
		}},
		{"recertify from Failed: fresh attempts", obs(inPhase(failed), fenced, finding(), asks(gpuhealthv1alpha1.RequestRecertify), func(o *observation) {
			o.nh.Status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 3}
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.status.Recertification).To(BeNil())
		}},
		{"recertify while draining: already under way", obs(inPhase(draining), fenced, finding(), asks(gpuhealthv1alpha1.RequestRecertify)), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("already under way"))
		}},
		{"a request carried out before is not repeated", obs(asks(gpuhealthv1alpha1.RequestRecertify), func(o *observation) {
			o.nh.Status.LastRequest = &gpuhealthv1alpha1.HandledRequest{ID: "t-1"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
		}},

		// Human uncordon.
		{"a human uncordoned a draining node: cancelled, by them, Jobs ended", obs(attempt(1), finding(), liveJob(job.Recertification, gpuhealthv1alpha1.JobRunning), func(o *observation) {
			o.node.Spec.Unschedulable = false
			o.uncordonedBy = "manager kubectl-uncordon"
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon))
			g.Expect(p.status.History[len(p.status.History)-1].By).To(Equal("manager kubectl-uncordon"))
			g.Expect(p.deleteJobs).To(BeTrue())
		}},
		{"dry run: an uncordon cancels nothing", obs(inPhase(quarantined), dryRun, finding(), func(o *observation) { o.uncordonedBy = "someone" }), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
		}},

		// ComputeDomains.
		{"a dead, fenced member: its daemon pods go", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.cd.daemonPods = []*corev1.Pod{ranPod("imex-n")}
		}), func(g *WithT, p *plan) {
			g.Expect(p.deleteDaemonPods).To(HaveLen(1))
			g.Expect(p.status.ComputeDomain.DeadSince.Time).To(Equal(t0.Add(-time.Hour)), "once per dead period")
			g.Expect(p.removeDomainLabel).To(BeFalse(), "the driver's label is the policy's choice")
		}},
		{"a dead member's pod that never ran (re-created by the DaemonSet) is left alone", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.cd.daemonPods = []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "imex-n-new", Namespace: "nvidia"}}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.deleteDaemonPods).To(BeEmpty())
		}},
		{"a dead member's pods go once per dead period", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.cd.daemonPods = []*corev1.Pod{ranPod("imex-n")}
			o.nh.Status.ComputeDomain = &gpuhealthv1alpha1.ComputeDomainMembership{UID: "cd-1", DeadSince: &metav1.Time{Time: t0.Add(-time.Hour)}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.deleteDaemonPods).To(BeEmpty())
		}},
		{"a dead member the driver still lists: DeadMemberListed and an Event on the domain", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.cd.traces = []gpuhealthv1alpha1.MembershipTrace{gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceNodeLabel}
			o.cd.domain = &computedomain.Domain{UID: "cd-1", Namespace: "ml", Name: "train"}
		}), func(g *WithT, p *plan) {
			c := meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Message).To(ContainSubstring("releaseDeadMemberLabel"))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonDeadMemberStillListed))
		}},
		{"releaseDeadMemberLabel removes a dead member's domain label", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.policy.Spec.ComputeDomain.ReleaseDeadMemberLabel = true
			o.node.Labels = map[string]string{computedomain.NodeLabel: "cd-1"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.removeDomainLabel).To(BeTrue())
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonDeadMemberLabelRemoved))
		}},
		{"a Ready member is never released", obs(inPhase(quarantined), fenced, finding(), noRoom, cdMember, deadMember, func(o *observation) {
			o.policy.Spec.ComputeDomain.ReleaseDeadMemberLabel = true
			o.node.Labels = map[string]string{computedomain.NodeLabel: "cd-1"}
			o.cd.daemonPods = []*corev1.Pod{ranPod("imex-n")}
			o.node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.removeDomainLabel).To(BeFalse())
			g.Expect(p.deleteDaemonPods).To(BeEmpty())
		}},
		{"an IMEX finding about a node that is no member is ignored", obs(breakerClosed, finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			e.Spec.Source, e.Spec.Check, e.Spec.Code = gpuhealthv1alpha1.SourceIMEX, gpuhealthv1alpha1.CheckIMEXDaemon, "DOWN"
		})), func(g *WithT, p *plan) {
			g.Expect(p.judged[0].phase).To(Equal(gpuhealthv1alpha1.EventIgnored))
			g.Expect(p.node).To(Equal(nodeInService))
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			before := r.obs.nh.DeepCopy()
			findings := make([]*gpuhealthv1alpha1.NodeHealthEvent, len(r.obs.findings))
			for i, f := range r.obs.findings {
				findings[i] = f.DeepCopy()
			}
			p := decide(r.obs)
			g := NewWithT(t)
			r.check(g, p)
			g.Expect(r.obs.nh).To(Equal(before), "decide never writes through the observation")
			for i, f := range r.obs.findings {
				g.Expect(f).To(Equal(findings[i]), "decide never writes through the observation")
			}
		})
	}
}

// TestDecideIllegalTransition: an event the phase does not allow is
// refused, kept for the metric, and not recorded.
func TestDecideIllegalTransition(t *testing.T) {
	g := NewWithT(t)
	o := obs()
	d := &decider{o: o, p: &plan{planWrite: planWrite{status: *o.nh.Status.DeepCopy()}}}
	var err error
	d.machine, err = fsm.New(healthy)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.transition(fsm.Pass, gpuhealthv1alpha1.ReasonRecertified, "", "")).To(BeFalse())
	g.Expect(d.p.illegal).To(Equal([]fsm.IllegalTransitionError{{Phase: healthy, Event: fsm.Pass}}))
	g.Expect(d.p.status.History).To(BeEmpty())
	g.Expect(d.p.transitions).To(BeEmpty())
	g.Expect(d.p.announce).To(BeEmpty())
}

// TestDecideIsDeterministic: the same observation gives the same plan.
func TestDecideIsDeterministic(t *testing.T) {
	g := NewWithT(t)
	mk := func() *observation { return obs(finding(), fenced, room) }
	a, b := decide(mk()), decide(mk())
	g.Expect(a.status).To(Equal(b.status))
	g.Expect(strings.Join(reasonsOf(a.announce), ",")).To(Equal(strings.Join(reasonsOf(b.announce), ",")))
}

func TestABudgetWakesOnlyDrainsItBlocks(t *testing.T) {
	blocked := func(total int32, namespaces ...string) gpuhealthv1alpha1.NodeHealthStatus {
		st := gpuhealthv1alpha1.NodeHealthStatus{Phase: gpuhealthv1alpha1.PhaseDraining, Drain: &gpuhealthv1alpha1.DrainStatus{PodsBlocked: total}}
		for _, ns := range namespaces {
			st.Drain.Blocked = append(st.Drain.Blocked, gpuhealthv1alpha1.BlockedPod{Namespace: ns, Name: "p"})
		}
		return st
	}
	for _, tc := range []struct {
		name string
		st   gpuhealthv1alpha1.NodeHealthStatus
		want bool
	}{
		{"blocked in the budget's namespace", blocked(1, "ml"), true},
		{"blocked elsewhere only", blocked(1, "web"), false},
		{"more blocked than listed: any namespace may be among them", blocked(11, "web", "web", "web", "web", "web", "web", "web", "web", "web", "web"), true},
		{"draining, nothing blocked", blocked(0), false},
		{"not draining", gpuhealthv1alpha1.NodeHealthStatus{Phase: gpuhealthv1alpha1.PhaseQuarantined, Drain: &gpuhealthv1alpha1.DrainStatus{PodsBlocked: 1, Blocked: []gpuhealthv1alpha1.BlockedPod{{Namespace: "ml"}}}}, false},
		{"no drain status", gpuhealthv1alpha1.NodeHealthStatus{Phase: gpuhealthv1alpha1.PhaseDraining}, false},
	} {
		if got := blockedIn(tc.st, "ml"); got != tc.want {
			t.Errorf("%s: blockedIn = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The owned list keeps the latest taints by key and effect, and Release may
// lift the policy's taint too, never a preexisting one.
func TestOwnedTaints(t *testing.T) {
	g := NewWithT(t)
	var owned []corev1.Taint
	for i := range maxOwnedTaints + 2 {
		owned = ownTaint(owned, corev1.Taint{Key: fmt.Sprintf("example.com/t%d", i), Value: "v", Effect: corev1.TaintEffectNoSchedule})
	}
	g.Expect(owned).To(HaveLen(maxOwnedTaints))
	g.Expect(owned[0].Key).To(Equal("example.com/t2"), "the oldest go first")
	g.Expect(owned[0].Value).To(BeEmpty(), "owned by key and effect")
	g.Expect(ownTaint(owned, corev1.Taint{Key: "example.com/t9", Effect: corev1.TaintEffectNoSchedule})).To(Equal(owned), "no duplicate")

	st := &gpuhealthv1alpha1.NodeHealthStatus{
		OwnedTaints:       []corev1.Taint{{Key: "a", Effect: corev1.TaintEffectNoSchedule}},
		PreexistingTaints: []corev1.Taint{{Key: "b", Value: "theirs", Effect: corev1.TaintEffectNoExecute}},
	}
	g.Expect(releasable(st, &corev1.Taint{Key: "c", Effect: corev1.TaintEffectNoSchedule})).To(Equal([]corev1.Taint{{Key: "a", Effect: corev1.TaintEffectNoSchedule}, {Key: "c", Effect: corev1.TaintEffectNoSchedule}}))
	g.Expect(releasable(st, &corev1.Taint{Key: "b", Effect: corev1.TaintEffectNoExecute})).To(Equal(st.OwnedTaints), "the policy's taint, when it was there before, is not ours")
}

// A node that left management is looked at again (its Jobs listed) until
// it says NotSelected, and for as long as it is out of service.
func TestHeldAlready(t *testing.T) {
	notSelected := []metav1.Condition{{Type: gpuhealthv1alpha1.NodeHealthManagedCondition, Status: metav1.ConditionFalse, Reason: gpuhealthv1alpha1.ReasonNotSelected}}
	managed := []metav1.Condition{{Type: gpuhealthv1alpha1.NodeHealthManagedCondition, Status: metav1.ConditionTrue, Reason: gpuhealthv1alpha1.ReasonManaged}}
	cases := []struct {
		name string
		st   gpuhealthv1alpha1.NodeHealthStatus
		want bool
	}{
		{"healthy and said so", gpuhealthv1alpha1.NodeHealthStatus{Phase: healthy, Conditions: notSelected}, true},
		{"healthy, not said yet", gpuhealthv1alpha1.NodeHealthStatus{Phase: healthy, Conditions: managed}, false},
		{"out of service: its Jobs are looked at every pass", gpuhealthv1alpha1.NodeHealthStatus{Phase: recertifying, Conditions: notSelected}, false},
		{"never written", gpuhealthv1alpha1.NodeHealthStatus{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { NewWithT(t).Expect(heldAlready(&tc.st)).To(Equal(tc.want)) })
	}
}

// TestARefusedQuarantineGivesBackItsNetworkSlot: a NIC-only quarantine takes
// a slot of its group's network breaker first; when the policy's breaker
// then refuses it (another node took the last slot since the peek), the
// node is held and the group's slot is given back, though the pass still
// writes the node's status.
func TestARefusedQuarantineGivesBackItsNetworkSlot(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{Breaker: breaker.New()}
	settings := breaker.Settings{Limit: 1, Window: 10 * time.Minute, CoolDown: 30 * time.Minute}
	const key = "p/network/"
	o := obs(finding(func(ev *gpuhealthv1alpha1.NodeHealthEvent) {
		ev.Spec.Source, ev.Spec.Check, ev.Spec.Code = gpuhealthv1alpha1.SourceIB, gpuhealthv1alpha1.CheckNIC, "PortDown"
	}), func(o *observation) {
		o.breaker = &breakerView{allowed: true, enabled: true, settings: settings}
		o.network = &networkView{breakerView: breakerView{allowed: true, enabled: true, settings: breaker.Settings{Limit: 3, Window: 10 * time.Minute, CoolDown: 30 * time.Minute}}, key: key, group: "g"}
	})
	r.Breaker.Seed("p", []time.Time{t0.Add(-time.Minute)}, "", time.Time{}) // the last slot, taken since the peek
	r.Breaker.Seed(key, nil, "", time.Time{})
	p := decide(o)
	g.Expect(p.reserveNetwork).To(BeTrue())
	g.Expect(p.reserveBreaker).To(BeTrue())
	tk, p := r.admit(context.Background(), o, p)
	g.Expect(p.reserveBreaker).To(BeFalse(), "held")
	g.Expect(o.nh.Status.Phase).To(Equal(healthy))
	tk.wrote("n", &o.nh.Status)
	tk.release()
	g.Expect(r.Breaker.Peek(key, o.network.settings, t0).InWindow).To(BeZero(), "the group's slot went back")

	// Granted by both, the quarantine keeps both slots.
	r2 := &Reconciler{Breaker: breaker.New()}
	r2.Breaker.Seed("p", nil, "", time.Time{})
	r2.Breaker.Seed(key, nil, "", time.Time{})
	o.network.allowed, o.breaker = true, &breakerView{allowed: true, enabled: true, settings: settings}
	tk, p = r2.admit(context.Background(), o, decide(o))
	g.Expect(p.reserveBreaker).To(BeTrue())
	tk.wrote("n", &o.nh.Status)
	tk.release()
	g.Expect(r2.Breaker.Peek(key, o.network.settings, t0).InWindow).To(Equal(1))
	g.Expect(r2.Breaker.Peek("p", settings, t0).InWindow).To(Equal(1))
}

// TestTheNetworkBreakerIsReadOnlyForNICQuarantines: finding a node's group
// walks the policy's nodes, so a pass reads the network breaker only for a
// quarantine it could hold (every counting finding a NIC finding); a
// decision that needs it without it fails rather than skip the breaker.
func TestTheNetworkBreakerIsReadOnlyForNICQuarantines(t *testing.T) {
	g := NewWithT(t)
	nic := finding(func(ev *gpuhealthv1alpha1.NodeHealthEvent) {
		ev.Spec.Source, ev.Spec.Check, ev.Spec.Code = gpuhealthv1alpha1.SourceIB, gpuhealthv1alpha1.CheckNIC, "PortDown"
	})
	g.Expect(inputsFor(obs(finding())).network).To(BeFalse(), "an XID quarantine does not read it")
	g.Expect(inputsFor(obs(finding())).breaker).To(BeTrue(), "the policy's breaker it does")
	g.Expect(inputsFor(obs(nic)).network).To(BeTrue(), "a NIC-only quarantine does")

	o := obs(nic, func(o *observation) {
		o.breaker = &breakerView{allowed: true, message: "disabled"}
	})
	g.Expect(decide(o).err).To(MatchError(ContainSubstring("without the network breaker's state")))
}
