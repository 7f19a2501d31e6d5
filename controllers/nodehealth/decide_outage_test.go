package nodehealth

import (
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// Rows of the decide table for outages (repair time, time between faults),
// planned maintenance and the hand-off of failed nodes.

// outageOf puts the node in a fault outage that began two hours ago.
func outageOf(cause gpuhealthv1alpha1.OutageCause) func(*observation) {
	return func(o *observation) {
		o.nh.Status.Outage = &gpuhealthv1alpha1.Outage{Since: metav1.NewTime(t0.Add(-2 * time.Hour)), Cause: cause}
		if cause == gpuhealthv1alpha1.OutageFault {
			o.nh.Status.Outage.Check, o.nh.Status.Outage.Code, o.nh.Status.Outage.Action = gpuhealthv1alpha1.CheckXID, "79", gpuhealthv1alpha1.ActionRebootNode
		}
	}
}

// failedBy puts the node in Failed, entered for reason.
func failedBy(reason string) func(*observation) {
	return func(o *observation) {
		fenced(o)
		o.nh.Status.Phase = failed
		o.nh.Status.History = []gpuhealthv1alpha1.Transition{{From: recertifying, To: failed, Reason: reason, Message: "attempt 3 of 3 failed", Time: metav1.NewTime(t0.Add(-time.Minute))}}
	}
}

func handOffBy(typ gpuhealthv1alpha1.HandOffType) func(*observation) {
	return func(o *observation) { o.policy.Spec.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: typ} }
}

func machine() *unstructured.Unstructured {
	m := &unstructured.Unstructured{}
	m.SetAPIVersion("cluster.x-k8s.io/v1beta1")
	m.SetKind("Machine")
	m.SetNamespace("capi")
	m.SetName("m-1")
	return m
}

func TestDecideOutages(t *testing.T) {
	soaked := func(o *observation) {
		done := metav1.NewTime(t0.Add(-time.Hour))
		o.nh.Status.Recertification.CompletedAt = &done
	}
	rows := []row{
		{"a fault's quarantine starts an outage with the worst finding", obs(finding(), fenced, room, func(o *observation) {
			since := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Since = &since
		}), func(g *WithT, p *plan) {
			o := p.status.Outage
			g.Expect(o).NotTo(BeNil())
			g.Expect(o.Cause).To(Equal(gpuhealthv1alpha1.OutageFault))
			g.Expect(o.Since.Time).To(Equal(t0))
			g.Expect([]any{o.Check, o.Code, o.Action}).To(Equal([]any{gpuhealthv1alpha1.CheckXID, "79", gpuhealthv1alpha1.ActionRebootNode}))
			g.Expect(p.status.LastFaults).To(Equal([]gpuhealthv1alpha1.FaultMark{{Check: gpuhealthv1alpha1.CheckXID, Time: metav1.NewTime(t0)}}))
			g.Expect(p.faultGaps).To(BeEmpty(), "the first fault of its class has no gap")
			g.Expect(p.transitions[0].spent).To(Equal(time.Hour), "an hour Healthy")
			g.Expect(p.transitions[1].spent).To(BeZero(), "Quarantined and drained in one pass")
		}},
		{"a second fault of the class: the time between them", obs(finding(), fenced, room, func(o *observation) {
			o.nh.Status.LastFaults = []gpuhealthv1alpha1.FaultMark{{Check: gpuhealthv1alpha1.CheckXID, Time: metav1.NewTime(t0.Add(-36 * time.Hour))}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.faultGaps).To(Equal([]faultGap{{check: gpuhealthv1alpha1.CheckXID, gap: 36 * time.Hour}}))
			g.Expect(p.status.LastFaults[0].Time.Time).To(Equal(t0))
		}},
		{"recertified: the repair took two hours, outage over", obs(attempt(1), finding(), soaked, outageOf(gpuhealthv1alpha1.OutageFault)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.repairs).To(Equal([]repairRecord{{action: gpuhealthv1alpha1.ActionRebootNode, outcome: outcomeRecertified, took: 2 * time.Hour}}))
			g.Expect(p.status.Outage).To(BeNil())
		}},
		{"released: a repair, outcome released", obs(attempt(1), finding(), outageOf(gpuhealthv1alpha1.OutageFault), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(p.repairs).To(Equal([]repairRecord{{action: gpuhealthv1alpha1.ActionRebootNode, outcome: outcomeReleased, took: 2 * time.Hour}}))
		}},
		{"attempts exhausted: a repair that failed, measured once", obs(attempt(3), recertJob, finding(), outageOf(gpuhealthv1alpha1.OutageFault), liveJob(job.Recertification, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{failed}))
			g.Expect(p.repairs).To(Equal([]repairRecord{{action: gpuhealthv1alpha1.ActionRebootNode, outcome: outcomeFailed, took: 2 * time.Hour}}))
			g.Expect(p.status.Outage.FailedAt.Time).To(Equal(t0))
		}},
		{"a failed node released later: no second repair", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), outageOf(gpuhealthv1alpha1.OutageFault), func(o *observation) {
			at := metav1.NewTime(t0.Add(-time.Minute))
			o.nh.Status.Outage.FailedAt = &at
		}, asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.repairs).To(BeEmpty())
			g.Expect(p.status.Outage).To(BeNil())
		}},
		{"a maintenance's return is no repair", obs(attempt(1), finding(), soaked, outageOf(gpuhealthv1alpha1.OutageMaintenance)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.repairs).To(BeEmpty())
		}},
		{"a dry run's quarantine is no outage", obs(finding(), breakerClosed, dryRun), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.status.Outage).To(BeNil())
		}},
		{"a manual recertification is an outage of cause Request", obs(asks(gpuhealthv1alpha1.RequestRecertify), fenced), func(g *WithT, p *plan) {
			g.Expect(p.status.Outage.Cause).To(Equal(gpuhealthv1alpha1.OutageRequest))
		}},

		// Maintenance.
		{"maintenance asked of a Healthy node: quarantined, audited, drains when the budgets allow", obs(asks(gpuhealthv1alpha1.RequestMaintenance)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.transitions[0].reason).To(Equal(gpuhealthv1alpha1.ReasonMaintenance))
			g.Expect(p.status.History[len(p.status.History)-1].By).To(ContainSubstring("alice"))
			g.Expect(p.status.Outage.Cause).To(Equal(gpuhealthv1alpha1.OutageMaintenance))
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("quarantined for maintenance"))
			g.Expect(p.node).To(Equal(nodeOutOfService))
			g.Expect(p.immediate).To(BeTrue(), "the budgets are counted in the next pass")
		}},
		{"maintenance asked of a quarantined node: refused", obs(inPhase(quarantined), fenced, finding(), room, asks(gpuhealthv1alpha1.RequestMaintenance)), func(g *WithT, p *plan) {
			g.Expect(p.status.LastRequest.Result).To(HavePrefix("refused"))
			g.Expect(p.status.Outage).To(BeNil())
		}},
		{"maintenance waits for the budget like a fault", obs(inPhase(quarantined), fenced, outageOf(gpuhealthv1alpha1.OutageMaintenance), noRoom), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
		}},
		{"drained for maintenance: held in Maintenance", obs(inPhase(draining), fenced, drained(0), outageOf(gpuhealthv1alpha1.OutageMaintenance)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseMaintenance}))
			g.Expect(p.status.Recertification).To(BeNil())
			g.Expect(p.node).To(Equal(nodeOutOfService))
		}},
		{"in Maintenance: held, nothing runs", obs(inPhase(gpuhealthv1alpha1.PhaseMaintenance), fenced, outageOf(gpuhealthv1alpha1.OutageMaintenance), finding()), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.node).To(Equal(nodeOutOfService))
		}},
		{"back from maintenance: Recertify starts attempt 1", obs(inPhase(gpuhealthv1alpha1.PhaseMaintenance), fenced, outageOf(gpuhealthv1alpha1.OutageMaintenance), asks(gpuhealthv1alpha1.RequestRecertify)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{recertifying}))
			g.Expect(p.status.Recertification.Attempt).To(BeEquivalentTo(1))
			g.Expect(p.immediate).To(BeTrue(), "the attempt's start is written before its Jobs")
		}},
		{"a failed attempt after maintenance drains again for the next, not back to Maintenance", obs(inPhase(draining), fenced, drained(0), outageOf(gpuhealthv1alpha1.OutageMaintenance), func(o *observation) {
			done := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &done, CompletedAt: &done, Result: gpuhealthv1alpha1.JobFailed}
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{recertifying}))
			g.Expect(p.status.Recertification.Attempt).To(BeEquivalentTo(2))
		}},
		{"released from Maintenance: Healthy", obs(inPhase(gpuhealthv1alpha1.PhaseMaintenance), fenced, outageOf(gpuhealthv1alpha1.OutageMaintenance), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Outage).To(BeNil())
		}},

		// Hand-off.
		{"exhausted, Condition hand-off: recorded once, in history and an Event", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), outageOf(gpuhealthv1alpha1.OutageFault), handOffBy(gpuhealthv1alpha1.HandOffCondition)), func(g *WithT, p *plan) {
			h := p.status.HandOff
			g.Expect(h).NotTo(BeNil())
			g.Expect([]any{h.Type, h.State, h.Reason}).To(Equal([]any{gpuhealthv1alpha1.HandOffCondition, gpuhealthv1alpha1.HandOffDone, gpuhealthv1alpha1.ReasonRecertificationExhausted}))
			g.Expect(h.Target).To(Equal("node condition GPUHealthy=False"))
			last := p.status.History[len(p.status.History)-1]
			g.Expect([]any{last.From, last.To, last.Reason}).To(Equal([]any{failed, failed, gpuhealthv1alpha1.ReasonHandedOff}))
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonHandedOff}))
			g.Expect(p.handedOff).To(Equal(h))
			g.Expect(p.node).To(Equal(nodeOutOfService), "GPUHealthy stays False")
		}},
		{"handed off already: not again", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffCondition), func(o *observation) {
			o.nh.Status.HandOff = &gpuhealthv1alpha1.HandOffStatus{Type: gpuhealthv1alpha1.HandOffCondition, State: gpuhealthv1alpha1.HandOffDone, Time: metav1.NewTime(t0.Add(-time.Hour)), Reason: "x"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.announce).To(BeEmpty())
			g.Expect(p.handedOff).To(BeNil())
			g.Expect(p.status.History).To(HaveLen(1))
		}},
		{"ContactSupport: stays for a human", obs(failedBy(gpuhealthv1alpha1.ReasonNeedsHuman), handOffBy(gpuhealthv1alpha1.HandOffCondition), finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) {
			e.Spec.Code = "95"
		}), func(o *observation) {
			o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "support", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"95"}}, Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionContactSupport}}
		}, outageOf(gpuhealthv1alpha1.OutageFault)), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff).To(BeNil())
		}},
		{"ReplaceNode: handed off", obs(failedBy(gpuhealthv1alpha1.ReasonNeedsHuman), handOffBy(gpuhealthv1alpha1.HandOffCondition), outageOf(gpuhealthv1alpha1.OutageFault), func(o *observation) {
			o.nh.Status.Outage.Action = gpuhealthv1alpha1.ActionReplaceNode
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff.Reason).To(Equal(string(gpuhealthv1alpha1.ActionReplaceNode)))
		}},
		{"entered Failed in this pass, Cluster API: the Machine is read in the next", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffClusterAPI)), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff).To(BeNil())
			g.Expect(p.immediate).To(BeTrue())
		}},
		{"Cluster API: the Machine is annotated, then shown", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffClusterAPI), func(o *observation) {
			o.handOff = &handOffTarget{obj: machine()}
		}), func(g *WithT, p *plan) {
			g.Expect(p.handOff).NotTo(BeNil())
			g.Expect(p.status.HandOff.Target).To(Equal("Machine capi/m-1"))
			g.Expect(p.status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffDone))
		}},
		{"Cluster API, no Machine: Failed hand-off, recorded once", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffClusterAPI), func(o *observation) {
			o.handOff = &handOffTarget{err: fmt.Errorf("%w: Machine capi/m-1 not found", handoff.ErrPermanent)}
		}), func(g *WithT, p *plan) {
			g.Expect(p.handOff).To(BeNil())
			g.Expect(p.status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffFailed))
			g.Expect(p.status.HandOff.Message).To(ContainSubstring("not found"))
			g.Expect(reasonsOf(p.announce)).To(Equal([]string{"Warning " + gpuhealthv1alpha1.ReasonHandOffFailed}))
		}},
		{"a handed-off target's status is shown as it changes", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffTemplate), func(o *observation) {
			o.nh.Status.HandOff = &gpuhealthv1alpha1.HandOffStatus{Type: gpuhealthv1alpha1.HandOffTemplate, State: gpuhealthv1alpha1.HandOffDone, Time: metav1.NewTime(t0.Add(-time.Hour)), Reason: "x"}
			obj := machine()
			obj.Object["status"] = map[string]any{"phase": "Repairing"}
			o.handOff = &handOffTarget{obj: obj, want: machine()}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff.TargetStatus).To(Equal("phase Repairing"))
			g.Expect(p.handOff).To(BeNil(), "made once")
			g.Expect(p.requeue).To(Equal(handOffRecheck))
		}},
		{"retried from Failed: a later failure may hand off again", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), fenced, finding(), asks(gpuhealthv1alpha1.RequestRecertify), func(o *observation) {
			o.nh.Status.HandOff = &gpuhealthv1alpha1.HandOffStatus{Type: gpuhealthv1alpha1.HandOffCondition, State: gpuhealthv1alpha1.HandOffDone, Time: metav1.NewTime(t0.Add(-time.Hour)), Reason: "x"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff).To(BeNil())
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			g := NewWithT(t)
			p := decide(r.obs)
			if r.check != nil {
				r.check(g, p)
			}
		})
	}
}

func TestGPUTime(t *testing.T) {
	g := NewWithT(t)
	gpus := func(n int64) corev1.ResourceList {
		return corev1.ResourceList{GPUResource: *resource.NewQuantity(n, resource.DecimalSI)}
	}
	managed := []metav1.Condition{{Type: gpuhealthv1alpha1.NodeHealthManagedCondition, Status: metav1.ConditionTrue}}
	cd := &gpuhealthv1alpha1.ComputeDomainMembership{UID: "u", Namespace: "ml", Name: "train"}
	nh := func(name string, phase gpuhealthv1alpha1.NodeHealthPhase, mutate ...func(*gpuhealthv1alpha1.NodeHealth)) gpuhealthv1alpha1.NodeHealth {
		x := gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: gpuhealthv1alpha1.NodeHealthStatus{Phase: phase, Conditions: managed}}
		for _, m := range mutate {
			m(&x)
		}
		return x
	}
	inDomain := func(x *gpuhealthv1alpha1.NodeHealth) { x.Status.ComputeDomain = cd }
	nhs := []gpuhealthv1alpha1.NodeHealth{
		nh("a", healthy, inDomain),
		nh("b", draining, inDomain, func(x *gpuhealthv1alpha1.NodeHealth) {
			x.Status.Outage = &gpuhealthv1alpha1.Outage{Cause: gpuhealthv1alpha1.OutageFault, Check: gpuhealthv1alpha1.CheckXID, Code: "79"}
		}),
		nh("c", healthy),
		nh("d", gpuhealthv1alpha1.PhaseMaintenance, func(x *gpuhealthv1alpha1.NodeHealth) {
			x.Status.Outage = &gpuhealthv1alpha1.Outage{Cause: gpuhealthv1alpha1.OutageMaintenance}
		}),
		nh("e", healthy, func(x *gpuhealthv1alpha1.NodeHealth) { x.Spec.Exclude = true }),
		nh("f", certifying),
		nh("g", quarantined),
		nh("gone", healthy),
	}
	nodes := map[string]*corev1.Node{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}, Status: corev1.NodeStatus{Allocatable: gpus(8)}}
	}
	nodes["c"].Spec.Unschedulable = true
	nodes["d"].Status.Allocatable = gpus(6) // two taken out by the device plugin: still 8 GPUs
	nodes["d"].Status.Capacity = gpus(8)
	g.Expect(gpuTime(nhs, nodes)).To(ConsistOf(
		gpuSample{node: "a", gpus: 8},
		gpuSample{node: "b", gpus: 8},
		gpuSample{node: "b", phase: draining, cause: "fault", check: gpuhealthv1alpha1.CheckXID, code: "79", gpus: 8},
		gpuSample{node: "c", gpus: 8},
		gpuSample{node: "c", phase: healthy, cause: causeCordoned, gpus: 8},
		gpuSample{node: "d", gpus: 8},
		gpuSample{node: "d", phase: gpuhealthv1alpha1.PhaseMaintenance, cause: "maintenance", gpus: 8},
		gpuSample{node: "f", gpus: 8},
		gpuSample{node: "f", phase: certifying, cause: "certification", gpus: 8},
		gpuSample{node: "g", gpus: 8}, // quarantined in a dry run: nothing fenced, nothing lost
		gpuSample{domain: "ml/train", gpus: 8},
	))
	nodes["a"].Spec.Taints = []corev1.Taint{{Key: gpuhealthv1alpha1.FabricDegradedTaintKey, Effect: corev1.TaintEffectNoSchedule}}
	g.Expect(gpuTime(nhs[:1], nodes)).To(ContainElement(gpuSample{node: "a", phase: healthy, cause: causeFabric, gpus: 8}))
	fenced(&observation{node: nodes["a"]})
	g.Expect(gpuTime(nhs[:1], nodes)).To(ContainElement(gpuSample{node: "a", phase: healthy, cause: "fault", gpus: 8}), "our fence, the bookkeeping to follow")

	// A GPU out of service alone counts one GPU of a node in service.
	gpuOut := nh("h", healthy, func(x *gpuhealthv1alpha1.NodeHealth) {
		x.Status.Devices = []gpuhealthv1alpha1.DeviceStatus{{UUID: "GPU-3", Device: "gpu-3", Phase: gpuhealthv1alpha1.DeviceDraining, Class: "xid-48"}}
	})
	nodes["h"] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "h"}, Status: corev1.NodeStatus{Allocatable: gpus(8)}}
	g.Expect(gpuTime([]gpuhealthv1alpha1.NodeHealth{gpuOut}, nodes)).To(ConsistOf(
		gpuSample{node: "h", gpus: 8},
		gpuSample{node: "h", phase: healthy, cause: causeDevice, check: gpuhealthv1alpha1.CheckXID, code: "48", gpus: 1},
	))
}

func TestHandOffObservationErrorsArePermanentOrNot(t *testing.T) {
	g := NewWithT(t)
	_, err := handoff.MachineKey(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	g.Expect(errors.Is(err, handoff.ErrPermanent)).To(BeTrue())
}

// Rows the review of the maintenance and hand-off paths asked for.
func TestDecideMaintenanceAndHandOffEdges(t *testing.T) {
	replaceNode := func(o *observation) {
		o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "replace", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"79"}},
			Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionReplaceNode}}
	}
	rows := []row{
		{"retried after maintenance ended Failed: drains to recertification, not back to Maintenance", obs(inPhase(draining), fenced, drained(0), outageOf(gpuhealthv1alpha1.OutageMaintenance), func(o *observation) {
			at := metav1.NewTime(t0.Add(-time.Hour))
			o.nh.Status.Outage.FailedAt = &at
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{recertifying}))
		}},
		{"a ReplaceNode finding while draining for maintenance: Failed, not Maintenance", obs(inPhase(draining), fenced, drained(0), outageOf(gpuhealthv1alpha1.OutageMaintenance), finding(), replaceNode), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{failed}))
		}},
		{"back from maintenance with a ReplaceNode finding: Failed, not recertified", obs(inPhase(gpuhealthv1alpha1.PhaseMaintenance), fenced, outageOf(gpuhealthv1alpha1.OutageMaintenance), finding(), replaceNode, asks(gpuhealthv1alpha1.RequestRecertify)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{failed}))
			g.Expect(p.status.LastRequest.Result).To(ContainSubstring("ReplaceNode"))
		}},
		{"maintenance in a dry run: nothing moves", obs(dryRun, asks(gpuhealthv1alpha1.RequestMaintenance)), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.LastRequest.Result).To(HavePrefix("dry run"))
		}},
		{"held: no hand-off", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffCondition), held), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff).To(BeNil())
		}},
		{"released after a Cluster API hand-off: taken back", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), handOffBy(gpuhealthv1alpha1.HandOffClusterAPI), func(o *observation) {
			o.nh.Status.HandOff = &gpuhealthv1alpha1.HandOffStatus{Type: gpuhealthv1alpha1.HandOffClusterAPI, State: gpuhealthv1alpha1.HandOffDone, Time: metav1.NewTime(t0.Add(-time.Hour)), Reason: "x"}
		}, asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(p.status.HandOff).To(BeNil())
			g.Expect(p.withdraw).NotTo(BeNil())
			g.Expect(p.withdraw.Type).To(Equal(gpuhealthv1alpha1.HandOffClusterAPI))
		}},
		{"a failed hand-off has nothing to take back", obs(failedBy(gpuhealthv1alpha1.ReasonRecertificationExhausted), func(o *observation) {
			o.nh.Status.HandOff = &gpuhealthv1alpha1.HandOffStatus{Type: gpuhealthv1alpha1.HandOffClusterAPI, State: gpuhealthv1alpha1.HandOffFailed, Time: metav1.NewTime(t0.Add(-time.Hour)), Reason: "x"}
		}, asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(p.withdraw).To(BeNil())
		}},
		{"the failed repair carries the action that failed it", obs(inPhase(draining), fenced, drained(0), finding(), replaceNode, outageOf(gpuhealthv1alpha1.OutageFault)), func(g *WithT, p *plan) {
			g.Expect(p.repairs).To(Equal([]repairRecord{{action: gpuhealthv1alpha1.ActionReplaceNode, outcome: outcomeFailed, took: 2 * time.Hour}}))
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) { r.check(NewWithT(t), decide(r.obs)) })
	}
}
