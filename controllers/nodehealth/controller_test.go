package nodehealth

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

const (
	quarantineTaint = "gpuhealth.dev/quarantined"
)

var (
	healthy      = gpuhealthv1alpha1.PhaseHealthy
	quarantined  = gpuhealthv1alpha1.PhaseQuarantined
	draining     = gpuhealthv1alpha1.PhaseDraining
	recertifying = gpuhealthv1alpha1.PhaseRecertifying
	failed       = gpuhealthv1alpha1.PhaseFailed
)

// TestFullCycle takes a node with XID 79 through every phase and back:
// quarantine, drain, the reboot step, recertification, soak, return.
func TestFullCycle(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("10m")
		s.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reboot"}}
	})
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)

	// Healthy: no finding, the NodeHealth appears.
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))

	// Healthy → Quarantined → Draining in one pass: cordon, taint, label, condition, evictions start.
	ev := h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	res := h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))
	h.g.Expect(res.RequeueAfter).To(Equal(drainRecheck), "a pod is still there")
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeTrue())
	h.g.Expect(hasQuarantineTaint(node)).To(BeTrue())
	h.g.Expect(node.Labels[nodepkg.PhaseLabel]).To(Equal(string(draining)), "the label mirrors the phase")
	h.g.Expect(gpuHealthyCondition(node).Status).To(Equal(corev1.ConditionFalse))
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Drain.PodsRemaining).To(BeEquivalentTo(1))
	h.g.Expect(nh.Status.ActiveEvents).To(HaveLen(1))
	h.g.Expect(nh.Status.ActiveEvents[0].RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: ev.Name}, got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(Equal(gpuhealthv1alpha1.EventActive))
	h.g.Expect(got.Status.Classification.Verdict).To(Equal(gpuhealthv1alpha1.VerdictQuarantine))
	h.g.Expect(got.Status.Classification.Rule).To(Equal(DefaultRule))
	h.g.Expect(got.Status.Classification.CatalogVersion).NotTo(BeEmpty())
	h.g.Expect(got.Status.ObservedBy.To).To(Equal(quarantined))
	h.g.Expect(h.events()).To(ContainElement(SatisfyAll(HavePrefix("Warning "+gpuhealthv1alpha1.ReasonFault+" Healthy → Quarantined"), ContainSubstring("79"))),
		"a Warning Event on the node names the fault")

	// Draining → Recertifying once the kubelet removed the evicted pod; the reboot Job runs first.
	h.g.Expect(h.playKubelet(n.Name)).To(Equal(1), "the workload pod was evicted")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	reboot := h.jobName(job.RebootNode, n.Name, 1)
	h.g.Expect(h.jobExists(reboot)).To(BeTrue())
	h.g.Expect(h.jobExists(h.jobName(job.Recertification, n.Name, 1))).To(BeFalse(), "recertification waits for the reboot")
	h.g.Expect(h.nodeHealth(n.Name).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRemediating))

	// Reboot done → the recertification Job.
	h.finishJob(reboot, true)
	h.reconcile(n.Name)
	recert := h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(recert)).To(BeTrue())
	h.finishJob(recert, true)

	// Recertification passed → soak window.
	res = h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	h.g.Expect(h.nodeHealth(n.Name).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonSoaking))
	h.g.Expect(res.RequeueAfter).To(Equal(10*time.Minute), "requeue at the end of the soak window")

	// Soak over → Healthy: uncordoned, untainted, unlabelled, condition True, finding closed.
	h.clock.Step(10 * time.Minute)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertified))
	h.g.Expect(historyPhases(nh)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining, recertifying, healthy}))
	node = h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse())
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
	h.g.Expect(node.Labels).NotTo(HaveKey(nodepkg.PhaseLabel))
	h.g.Expect(node.Annotations).NotTo(HaveKey(nodepkg.AppliedAnnotation))
	h.g.Expect(gpuHealthyCondition(node).Status).To(Equal(corev1.ConditionTrue))
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: ev.Name}, got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(Equal(gpuhealthv1alpha1.EventSuperseded))
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Normal "+gpuhealthv1alpha1.ReasonRecertified+" Recertifying → Healthy")), "a Normal Event on return")

	// A later reconcile does not re-quarantine on the closed finding.
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
}

// TestASecondCycleRunsItsOwnJobs: Jobs have deterministic names per node,
// kind and attempt, and finished ones are kept for their logs. A node that
// faults again must not read the previous cycle's finished Jobs as this
// cycle's: they are deleted when the new cycle starts, and new ones run.
func TestASecondCycleRunsItsOwnJobs(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("1m")
		s.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reboot"}}
		s.CircuitBreaker.Enabled = ptr.To(false) // the node quarantines twice within the breaker's window
	})
	n := h.node("again", nil)
	h.reconcile(n.Name) // the NodeHealth appears
	// fresh reconciles until the node's Job of that kind exists and has not
	// run yet: this cycle's, not the last one's.
	fresh := func(kind job.Kind) batchv1.Job {
		var j batchv1.Job
		for range 8 {
			err := k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: h.jobName(kind, n.Name, 1)}, &j)
			if err == nil && len(j.Status.Conditions) == 0 {
				return j
			}
			h.reconcile(n.Name)
		}
		h.t.Fatalf("no fresh %s job", kind)
		return j
	}
	cycle := func(code string) (types.UID, types.UID) {
		h.fault(n.Name, gpuhealthv1alpha1.CheckXID, code)
		rebootJob := fresh(job.RebootNode)
		h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
		h.finishJob(rebootJob.Name, true)
		recertJob := fresh(job.Recertification)
		h.g.Expect(h.phase(n.Name)).To(Equal(recertifying), "last cycle's finished recertification does not count")
		h.finishJob(recertJob.Name, true)
		h.reconcile(n.Name)
		h.clock.Step(time.Minute)
		h.reconcile(n.Name)
		h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
		return rebootJob.UID, recertJob.UID
	}
	firstReboot, firstRecert := cycle("79")
	secondReboot, secondRecert := cycle("151")
	h.g.Expect(secondReboot).NotTo(Equal(firstReboot))
	h.g.Expect(secondRecert).NotTo(Equal(firstRecert))
}

// TestRecertificationFailsTwiceThenFailed: two failed attempts use up
// maxAttempts 2; the node goes to Failed, stays cordoned, and a manual
// release returns it.
func TestRecertificationFailsTwiceThenFailed(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.MaxAttempts = 2
		s.Recertification.Backoff = dur("1m")
	})
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "48")

	// Attempt 1: no pods, straight to Recertifying.
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	h.finishJob(h.jobName(job.Recertification, n.Name, 1), false)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(quarantined))
	h.g.Expect(nh.Status.History[len(nh.Status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertificationFailed))

	// Backoff holds the next attempt.
	res := h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonBackoff))
	h.g.Expect(res.RequeueAfter).To(Equal(time.Minute))
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue(), "still cordoned between attempts")
	h.clock.Step(time.Minute)

	// Attempt 2 fails → Failed.
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(recertifying))
	h.g.Expect(nh.Status.Recertification.Attempt).To(BeEquivalentTo(2))
	h.finishJob(h.jobName(job.Recertification, n.Name, 2), false)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertificationExhausted))
	h.g.Expect(nh.Status.Message).To(ContainSubstring("dcgmi diag failed"))
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(failed), "only a human leaves Failed")
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue())

	// A human releases it.
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: "inc-1", Reason: "replaced the GPU", RequestedBy: "sre"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonManualRelease))
	last := nh.Status.History[len(nh.Status.History)-1]
	h.g.Expect(last.By).To(ContainSubstring("sre"))
	h.g.Expect(last.By).To(ContainSubstring("manager "))
	h.g.Expect(nh.Status.LastRequest.ID).To(Equal("inc-1"))
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeFalse())
	h.g.Expect(h.events()).To(ContainElement(SatisfyAll(HavePrefix("Normal "+gpuhealthv1alpha1.ReasonManualRelease+" Failed → Healthy"), ContainSubstring("sre"))),
		"the release is published, with who asked")
}

// TestPreexistingCordonSurvivesACycle: a node a human had cordoned stays
// cordoned after gpuhealth returns it.
func TestPreexistingCordonSurvivesACycle(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.SoakWindow = dur("0s") })
	n := h.node("a", func(n *corev1.Node) { n.Spec.Unschedulable = true })
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	// No pods, no Job, no soak: the whole cycle runs in one pass.
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(historyPhases(nh)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining, recertifying, healthy}))
	h.g.Expect(nh.Status.PreexistingCordon).To(BeTrue())
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeTrue(), "the human's cordon is never lifted by us")
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse(), "our taint is lifted")
}

// TestPreexistingTaintSurvivesACycle: a node that already carried the
// quarantine taint (another tool's, or a human's) keeps it after gpuhealth
// returns the node, and the NodeHealth records it as pre-existing.
func TestPreexistingTaintSurvivesACycle(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.SoakWindow = dur("0s") })
	theirs := corev1.Taint{Key: quarantineTaint, Value: "ops-ticket-7", Effect: corev1.TaintEffectNoSchedule}
	n := h.node("a", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{theirs} })
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(historyPhases(nh)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining, recertifying, healthy}))
	h.g.Expect(nh.Status.PreexistingTaints).To(ConsistOf(HaveField("Value", "ops-ticket-7")))
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Taints).To(ContainElement(HaveField("Value", "ops-ticket-7")), "a taint that was there before is never lifted by us")
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse(), "our cordon is lifted")
}

// TestPolicyTaintChangedWhileOut: the policy's taint changes while a node
// is out of service. gpuhealth adds the new one too, owns both in status,
// and lifts both when the node returns: none stays behind for ever.
func TestPolicyTaintChangedWhileOut(t *testing.T) {
	h := newHarness(t)
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.SoakWindow = dur("0s") })
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))

	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: p.Name}, p)).To(Succeed())
	p.Spec.Quarantine.Taint = &gpuhealthv1alpha1.TaintSpec{Key: "example.com/gpu-out", Effect: corev1.TaintEffectNoExecute}
	h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))
	owned := []corev1.Taint{{Key: quarantineTaint, Effect: corev1.TaintEffectNoSchedule}, {Key: "example.com/gpu-out", Effect: corev1.TaintEffectNoExecute}}
	h.g.Expect(h.nodeHealth(n.Name).Status.OwnedTaints).To(Equal(owned))
	h.g.Expect(h.getNode(n.Name).Spec.Taints).To(ContainElements(HaveField("Key", quarantineTaint), HaveField("Key", "example.com/gpu-out")))

	h.playKubelet(n.Name)
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
	h.g.Expect(h.getNode(n.Name).Spec.Taints).NotTo(ContainElement(HaveField("Key", Or(Equal(quarantineTaint), Equal("example.com/gpu-out")))), "both of ours are lifted")
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.OwnedTaints).To(BeEmpty(), "nothing left to own once released")
}

// TestHumanUncordonCancels: uncordoning a draining node ends the workflow
// for its findings, recorded, and gpuhealth does not fight it.
func TestHumanUncordonCancels(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))

	h.humanUncordon(n.Name)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon))
	h.g.Expect(nh.Status.History[len(nh.Status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon), "recorded in the history")
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Normal "+gpuhealthv1alpha1.ReasonHumanUncordon+" Draining → Healthy")), "and in an Event")
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse())
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy), "the cancelled finding does not quarantine again")
}

// TestHumanUncordonOfAFailedNodeIsNotFought: a Failed node waits for a
// human; one who uncordons it takes it back, and gpuhealth does not cordon
// it again for the same findings.
func TestHumanUncordonOfAFailedNodeIsNotFought(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.Job = jobTemplate() })
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "54") // ContactSupport
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(failed))

	h.humanUncordon(n.Name)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon))
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Normal " + gpuhealthv1alpha1.ReasonHumanUncordon + " Failed → Healthy")))
	h.reconcile(n.Name)
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned again")
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
}

// TestExcludedNodeIsNotTouched and TestDryRunTouchesNothing.
func TestExcludedNodeIsNotTouched(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	nh.Spec.Exclude = true
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse())
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
	h.g.Expect(node.Labels).NotTo(HaveKey(nodepkg.PhaseLabel))
}

func TestDryRunTouchesNothing(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.DryRun = true })
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(quarantined), "the decision is recorded")
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonDryRun))
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse())
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
	h.g.Expect(node.Annotations).NotTo(HaveKey(nodepkg.AppliedAnnotation))
	h.g.Expect(node.Labels).NotTo(HaveKey(nodepkg.PhaseLabel))
	h.g.Expect(gpuHealthyCondition(node)).To(BeNil(), "no node condition")
	pod := &corev1.Pod{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Namespace: "default", Name: "trainer-0"}, pod)).To(Succeed())
	h.g.Expect(pod.DeletionTimestamp).To(BeNil(), "no pod is evicted")
	h.g.Expect(h.jobExists(h.jobName(job.Recertification, n.Name, 1))).To(BeFalse(), "no Job")
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Warning "+gpuhealthv1alpha1.ReasonDryRun+" Healthy → Quarantined")), "the decision is published")
}

// TestBudgetDrainsOneAtATime: with maxUnavailable 1 and three faulty nodes
// all three are cordoned, only one drains at a time, and all come back.
func TestBudgetDrainsOneAtATime(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(1))
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
		s.CircuitBreaker.Enabled = ptr.To(false)
	})
	var names []string
	for _, suffix := range []string{"a", "b", "c"} {
		n := h.node(suffix, nil)
		names = append(names, n.Name)
		h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	}
	for _, n := range names {
		h.reconcile(n)
	}
	count := func(p gpuhealthv1alpha1.NodeHealthPhase) int {
		c := 0
		for _, n := range names {
			if h.phase(n) == p {
				c++
			}
		}
		return c
	}
	for _, n := range names {
		h.g.Expect(h.getNode(n).Spec.Unschedulable).To(BeTrue(), "fatal faults cordon every node at once")
	}
	h.g.Expect(count(recertifying)).To(Equal(1))
	h.g.Expect(count(quarantined)).To(Equal(2))
	for _, n := range names {
		if h.phase(n) == quarantined {
			nh := h.nodeHealth(n)
			h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
			h.g.Expect(nh.Status.Message).To(ContainSubstring("no room under maxUnavailable 1"))
		}
	}
	// A node joining the fleet changes the counts but not what a waiting
	// node records: its status is not rewritten (with many nodes waiting,
	// every join or return would otherwise rewrite all of them).
	for _, n := range names {
		if h.phase(n) == quarantined {
			rv := h.nodeHealth(n).ResourceVersion
			joined := h.node("joined", nil)
			h.g.Eventually(func() error {
				return h.r.Client.Get(h.ctx, types.NamespacedName{Name: joined.Name}, &corev1.Node{})
			}).Should(Succeed(), "the reconciler's cache sees the new node")
			h.reconcile(n)
			h.g.Expect(h.nodeHealth(n).ResourceVersion).To(Equal(rv), "a waiting node's status is not rewritten when the fleet grows")
			break
		}
	}
	// Finish the nodes one by one; each return lets the next drain.
	for range names {
		var active string
		for _, n := range names {
			if h.phase(n) == recertifying {
				active = n
			}
		}
		h.g.Expect(active).NotTo(BeEmpty())
		h.finishJob(h.jobName(job.Recertification, active, 1), true)
		h.reconcile(active)
		h.g.Expect(h.phase(active)).To(Equal(healthy))
		for _, n := range names {
			h.reconcile(n)
		}
		h.g.Expect(count(recertifying)).To(BeNumerically("<=", 1))
	}
	h.g.Expect(count(healthy)).To(Equal(3))
}

// TestContactSupportGoesToFailedAfterDrain: a finding that needs a human
// empties the node and hands it over without recertification.
func TestContactSupportGoesToFailedAfterDrain(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.Job = jobTemplate() })
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "54")
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonNeedsHuman))
	h.g.Expect(h.jobExists(h.jobName(job.Recertification, n.Name, 1))).To(BeFalse())
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue())
}

// TestCircuitBreaker: a storm trips the breaker, which blocks new
// quarantines but lets a quarantined node recover, and a reset closes it.
func TestCircuitBreaker(t *testing.T) {
	h := newHarness(t)
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.CircuitBreaker.Threshold = ptr.To(intstrFromInt(2))
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(10))
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
	})
	var names []string
	for _, suffix := range []string{"a", "b", "c", "d"} {
		n := h.node(suffix, nil)
		names = append(names, n.Name)
	}
	for _, n := range names[:3] {
		h.fault(n, gpuhealthv1alpha1.CheckXID, "79")
		h.reconcile(n)
	}
	// Two quarantines fill the window; the third opens the breaker.
	h.g.Expect(h.phase(names[0])).To(Equal(recertifying))
	h.g.Expect(h.phase(names[1])).To(Equal(recertifying))
	nh := h.nodeHealth(names[2])
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCircuitBreakerOpen))
	h.g.Expect(nh.Status.Message).To(ContainSubstring("2 nodes entered quarantine within 10m0s (limit 2)"))
	h.g.Expect(h.getNode(names[2]).Spec.Unschedulable).To(BeFalse())
	// The Node does not say it is healthy: GPUHealthy is Unknown, held,
	// naming the finding and what holds it, with one Event on the node.
	cond := gpuHealthyCondition(h.getNode(names[2]))
	h.g.Expect(cond).NotTo(BeNil())
	h.g.Expect(cond.Status).To(Equal(corev1.ConditionUnknown))
	h.g.Expect(cond.Reason).To(Equal(gpuhealthv1alpha1.ReasonQuarantineHeld))
	h.g.Expect(cond.Message).To(And(ContainSubstring("circuit breaker"), ContainSubstring("XID 79")))
	var seen []string
	held := func() (n int) {
		seen = append(seen, h.events()...)
		for _, e := range seen {
			if strings.HasPrefix(e, "Warning "+gpuhealthv1alpha1.ReasonQuarantineHeld) {
				n++
			}
		}
		return n
	}
	h.g.Expect(held()).To(Equal(1))
	h.reconcile(names[2])
	h.g.Expect(held()).To(Equal(1), "held on, not announced again")
	got := h.syncPolicy(p.Name)
	h.g.Expect(got.Status.CircuitBreaker.State).To(Equal(gpuhealthv1alpha1.BreakerOpen), "the policy status controller mirrors the breaker")
	h.g.Expect(got.Status.CircuitBreaker.QuarantinesInWindow).To(BeEquivalentTo(2), "each quarantine counted once")
	h.g.Expect(append(seen, h.events()...)).To(ContainElement(And(HavePrefix("Warning "+gpuhealthv1alpha1.ReasonCircuitBreakerOpen+" circuit breaker"),
		HaveSuffix("holding 1 nodes from quarantine: "+names[2]))), "a Warning Event on the policy, naming the node it holds")

	// Recoveries are never blocked: a quarantined node returns.
	h.finishJob(h.jobName(job.Recertification, names[0], 1), true)
	h.reconcile(names[0])
	h.g.Expect(h.phase(names[0])).To(Equal(healthy))

	// A fourth fault is also held back while the breaker is open.
	h.fault(names[3], gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(names[3])
	h.g.Expect(h.phase(names[3])).To(Equal(healthy))

	// A human resets the breaker; the held nodes are quarantined.
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: p.Name}, got)).To(Succeed())
	got.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "after-driver-rollback"}
	h.g.Expect(k8sClient.Update(h.ctx, got)).To(Succeed())
	h.reconcile(names[2])
	h.reconcile(names[3])
	h.g.Expect(h.phase(names[2])).To(Equal(recertifying))
	h.g.Expect(h.phase(names[3])).To(Equal(recertifying))
	got = h.syncPolicy(p.Name)
	h.g.Expect(got.Status.CircuitBreaker.State).To(Equal(gpuhealthv1alpha1.BreakerClosed))
	h.g.Expect(got.Status.CircuitBreaker.LastReset).To(Equal("after-driver-rollback"))
}

// TestCircuitBreakerCoolsDown: an open breaker closes by itself after its cool-down.
func TestCircuitBreakerCoolsDown(t *testing.T) {
	h := newHarness(t)
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.CircuitBreaker.Threshold = ptr.To(intstrFromInt(1))
		s.CircuitBreaker.CoolDown = dur("30m")
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(10))
		s.Recertification.Job = jobTemplate()
	})
	a, b := h.node("a", nil), h.node("b", nil)
	h.fault(a.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.fault(b.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(a.Name)
	res := h.reconcile(b.Name)
	h.g.Expect(h.nodeHealth(b.Name).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCircuitBreakerOpen))
	h.g.Expect(res.RequeueAfter).To(Equal(breakerRecheck))
	h.g.Expect(h.syncPolicy(p.Name).Status.CircuitBreaker.State).To(Equal(gpuhealthv1alpha1.BreakerOpen))

	// A new leader 20 minutes on (the breaker's memory is gone; the window
	// no longer holds a's quarantine) keeps the breaker open for the rest
	// of its cool-down, from the policy's status.
	h.r.Breaker = breaker.New()
	h.clock.Step(20 * time.Minute)
	h.reconcile(b.Name)
	h.g.Expect(h.nodeHealth(b.Name).Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCircuitBreakerOpen))
	h.g.Expect(h.phase(b.Name)).To(Equal(healthy))
	h.clock.Step(10 * time.Minute)
	h.reconcile(b.Name)
	h.g.Expect(h.phase(b.Name)).To(Equal(recertifying))
}

// TestResetGPUStepRunsBeforeRecertification: a ResetGPU finding runs the
// policy's reset Job first.
func TestResetGPUStepRunsBeforeRecertification(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
		s.Remediation.ResetGPU = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reset", Privileged: true}}
	})
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "48")
	h.reconcile(n.Name)
	reset, recert := h.jobName(job.ResetGPU, n.Name, 1), h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(reset)).To(BeTrue())
	h.g.Expect(h.jobExists(recert)).To(BeFalse())
	h.g.Expect(h.nodeHealth(n.Name).Status.Recertification.RemediationJob).To(Equal(reset))
	h.finishJob(reset, true)
	h.reconcile(n.Name)
	h.g.Expect(h.jobExists(recert)).To(BeTrue())
	h.finishJob(recert, true)
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
}

// TestManualRecertifyAndHold: a human asks to recertify a healthy node and
// holds it in quarantine; clearing hold lets it go on.
func TestManualRecertifyAndHold(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
	})
	n := h.node("a", nil)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	nh.Spec.Hold = true
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "riser-swap", RequestedBy: "bob"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(quarantined))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHeld))
	h.g.Expect(nh.Status.LastRequest.Result).To(Equal("quarantined for recertification"))
	h.g.Expect(nh.Status.History[len(nh.Status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonManualRecertify))
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue())
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(quarantined), "the request is carried out once; hold keeps it there")

	nh.Spec.Hold = false
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	h.finishJob(h.jobName(job.Recertification, n.Name, 1), true)
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy))
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeFalse())
}

// TestPhaseGaugeFollowsTheNode: the leader exports each managed node's
// persisted phase as one series, read from the NodeHealths at the scrape
// (a new leader's too, before its first pass), and a node that leaves
// management or is deleted loses it; a standby exports none.
func TestPhaseGaugeFollowsTheNode(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	out := h.phase(n.Name)
	h.g.Expect(out).NotTo(Equal(healthy))
	phases := func() map[string]float64 { return gaugeValues(t, true, "gpuhealth_nodehealth_phase", n.Name) }
	h.g.Expect(phases()).To(Equal(map[string]float64{string(out): 1}), "one series, the node's phase")
	h.g.Expect(gaugeValues(t, false, "gpuhealth_nodehealth_phase", n.Name)).To(BeEmpty(), "a standby exports nothing")

	// Excluded from management by a human: no phase series.
	nh := h.nodeHealth(n.Name)
	nh.Spec.Exclude = true
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.g.Eventually(phases).Should(BeEmpty())
	nh = h.nodeHealth(n.Name)
	nh.Spec.Exclude = false
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.g.Eventually(phases).Should(HaveLen(1))

	// Out of management: the policy no longer selects it.
	node := h.getNode(n.Name)
	delete(node.Labels, "test")
	h.g.Expect(k8sClient.Update(h.ctx, node)).To(Succeed())
	h.g.Eventually(phases).Should(BeEmpty())

	// Deleted.
	node.Labels["test"] = h.label
	h.g.Expect(k8sClient.Update(h.ctx, node)).To(Succeed())
	h.g.Eventually(phases).Should(HaveLen(1))
	h.g.Expect(k8sClient.Delete(h.ctx, node)).To(Succeed())
	h.g.Eventually(phases).Should(BeEmpty())
}

// TestActiveFindingsGauge: the leader exports how many active findings
// each managed node's NodeHealth lists.
func TestActiveFindingsGauge(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	findings := func() map[string]float64 { return gaugeValues(t, true, "gpuhealth_nodehealth_active_findings", n.Name) }
	h.g.Expect(findings()).To(Equal(map[string]float64{"": 0}))
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "48")
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.ActiveEvents).To(HaveLen(2))
	h.g.Expect(findings()).To(Equal(map[string]float64{"": 2}))
}

// TestConditionGauges: a node's condition gauges are 1 while their
// condition is True, 0 otherwise.
func TestConditionGauges(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	gauges := func() [3]map[string]float64 {
		return [3]map[string]float64{
			gaugeValues(t, true, "gpuhealth_nodehealth_drain_timed_out", n.Name),
			gaugeValues(t, true, "gpuhealth_nodehealth_dead_member_listed", n.Name),
			gaugeValues(t, true, "gpuhealth_nodehealth_phase", n.Name),
		}
	}
	h.g.Expect(gauges()).To(Equal([3]map[string]float64{{"": 0}, {"": 0}, {string(healthy): 1}}))

	setConditions := func(timedOut, listed metav1.ConditionStatus) {
		nh := h.nodeHealth(n.Name)
		meta.SetStatusCondition(&nh.Status.Conditions, metav1.Condition{Type: gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition, Status: timedOut, Reason: "Test"})
		meta.SetStatusCondition(&nh.Status.Conditions, metav1.Condition{Type: gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition, Status: listed, Reason: "Test"})
		h.g.Expect(k8sClient.Status().Update(h.ctx, nh)).To(Succeed())
	}
	setConditions(metav1.ConditionTrue, metav1.ConditionTrue)
	h.g.Expect(gauges()).To(Equal([3]map[string]float64{{"": 1}, {"": 1}, {string(healthy): 1}}))
	setConditions(metav1.ConditionFalse, metav1.ConditionTrue)
	h.g.Expect(gauges()).To(Equal([3]map[string]float64{{"": 0}, {"": 1}, {string(healthy): 1}}))
}

// gaugeValues scrapes the per-node gauges of a fresh collector reading
// the apiserver, as the leader (elected) or a standby, and returns
// metric's values for node, by the phase label ("" for a gauge without one).
func gaugeValues(t *testing.T, elected bool, metric, node string) map[string]float64 {
	t.Helper()
	ch := make(chan struct{})
	if elected {
		close(ch)
	}
	f := &nodeGauges{}
	f.serve(k8sClient, ch)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(f); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels[labelNode] == node {
				out[labels[labelPhase]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestFenceFirst: the first pass after a quarantining finding writes the
// fence (cordon, taint, label and the applied annotation) and nothing else;
// the next pass records the transition.
func TestFenceFirst(t *testing.T) {
	h := newHarness(t)
	h.policy(nil)
	n := h.node("a", func(n *corev1.Node) { n.Spec.Unschedulable = true })
	h.reconcile(n.Name)
	ev := h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	quarantines := func() float64 {
		return testutil.ToFloat64(transitions.WithLabelValues(string(healthy), string(quarantined), gpuhealthv1alpha1.ReasonFault))
	}
	start := quarantines()

	res := h.reconcileOnce(n.Name)
	h.g.Expect(quarantines()).To(Equal(start), "nothing is counted before it is written")
	h.g.Expect(res.Priority).To(HaveValue(Equal(fencedPriority)))
	h.g.Expect(res.RequeueAfter).To(BeNumerically(">", 0))
	node := h.getNode(n.Name)
	h.g.Expect(hasQuarantineTaint(node)).To(BeTrue())
	h.g.Expect(node.Annotations[nodepkg.AppliedAnnotation]).To(Equal("taint="+quarantineTaint+":NoSchedule"), "the cordon was the human's")
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy), "no bookkeeping yet")
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: ev.Name}, got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(BeEmpty(), "no bookkeeping yet")

	h.reconcileOnce(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(historyPhases(nh)).To(ContainElement(quarantined))
	h.g.Expect(quarantines()).To(Equal(start + 1))
	h.g.Expect(nh.Status.PreexistingCordon).To(BeTrue(), "known from the applied annotation across passes")
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: ev.Name}, got)).To(Succeed())
	h.g.Expect(got.Status.Phase).To(Equal(gpuhealthv1alpha1.EventActive))

	// The human lifts the cordon that was there before: the node goes back
	// in service (as when gpuhealth's own is lifted), and the cordon is not
	// put back as gpuhealth's.
	h.humanUncordon(n.Name)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon))
	node = h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned again")
	h.g.Expect(node.Annotations).NotTo(HaveKey(nodepkg.AppliedAnnotation))
	h.g.Expect(hasQuarantineTaint(node)).To(BeFalse())
}

// TestLeavingManagementHoldsTheNodeAndStopsItsJobs: a recertifying node
// whose policy is deleted is held where it is — cordon and taint stay, its
// GPUs were found faulty — but its unfinished Jobs are deleted, and its
// NodeHealth says it is not managed and what stays.
func TestLeavingManagementHoldsTheNodeAndStopsItsJobs(t *testing.T) {
	h := newHarness(t)
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
	})
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	recert := h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(recert)).To(BeTrue())

	h.g.Expect(k8sClient.Delete(h.ctx, p)).To(Succeed())
	h.g.Eventually(func() bool {
		return apierrors.IsNotFound(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), &gpuhealthv1alpha1.RemediationPolicy{}))
	}).Should(BeTrue())
	h.reconcile(n.Name)
	h.g.Eventually(func() bool { return h.jobExists(recert) }).Should(BeFalse(), "no privileged act goes on without a manager")
	nh := h.nodeHealth(n.Name)
	c := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
	h.g.Expect(c).NotTo(BeNil())
	h.g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	h.g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonNotSelected))
	h.g.Expect(c.Message).To(And(ContainSubstring("left in phase Recertifying"), ContainSubstring("deleted its unfinished jobs "+recert)))
	node := h.getNode(n.Name)
	h.g.Expect(node.Spec.Unschedulable).To(BeTrue(), "held: the cordon stays")
	h.g.Expect(hasQuarantineTaint(node)).To(BeTrue())
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).ResourceVersion).To(Equal(nh.ResourceVersion), "said once")
}

// TestNetworkBreakerHoldsTheSwitchNotTheFleet: quarantines for NIC findings
// alone are counted per group of nodes behind one switch; a group that
// fills its window holds its next NIC-only quarantine (a failing leaf
// switch), while a node of another group, a node of the same group with a
// GPU fault beside its NIC fault, and recoveries go on; the policy's reset
// annotation resets the group.
func TestNetworkBreakerHoldsTheSwitchNotTheFleet(t *testing.T) {
	h := newHarness(t)
	const leaf = "example.com/leaf"
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.CircuitBreaker.Threshold = ptr.To(intstrFromInt(100))
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(100))
		s.Network.TopologyLabels = []string{leaf}
		s.Network.CircuitBreaker.Threshold = ptr.To(intstrFromInt(2))
	})
	nodes := map[string]string{}
	for suffix, group := range map[string]string{"a": "l1", "b": "l1", "c": "l1", "d": "l1", "e": "l2"} {
		nodes[suffix] = h.node(suffix, func(n *corev1.Node) { n.Labels[leaf] = group }).Name
	}
	nic := func(node string) {
		h.finding(gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: node, Source: gpuhealthv1alpha1.SourceIB, Check: gpuhealthv1alpha1.CheckNIC, Code: "PortDown",
			Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionNone,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "mlx5_0/1"}, Message: "port down",
		})
		h.reconcile(node)
	}
	nic(nodes["a"])
	nic(nodes["b"])
	h.g.Expect(h.phase(nodes["a"])).NotTo(Equal(healthy))
	h.g.Expect(h.phase(nodes["b"])).NotTo(Equal(healthy))

	// The third NIC-only quarantine behind leaf l1 is held.
	nic(nodes["c"])
	nh := h.nodeHealth(nodes["c"])
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCircuitBreakerOpen))
	h.g.Expect(nh.Status.Message).To(And(ContainSubstring("network circuit breaker of "+leaf+"=l1"),
		ContainSubstring("2 nodes entered quarantine within 10m0s (limit 2)")))
	h.g.Expect(h.getNode(nodes["c"]).Spec.Unschedulable).To(BeFalse())
	cond := gpuHealthyCondition(h.getNode(nodes["c"]))
	h.g.Expect(cond.Reason).To(Equal(gpuhealthv1alpha1.ReasonQuarantineHeld))

	// Another leaf's node is its own group.
	nic(nodes["e"])
	h.g.Expect(h.phase(nodes["e"])).NotTo(Equal(healthy))

	// A GPU fault beside the NIC fault is not the switch's: quarantined.
	h.fault(nodes["d"], gpuhealthv1alpha1.CheckXID, "79")
	nic(nodes["d"])
	h.g.Expect(h.phase(nodes["d"])).NotTo(Equal(healthy))

	// The reset annotation resets the group; the held node goes in.
	got := &gpuhealthv1alpha1.RemediationPolicy{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: p.Name}, got)).To(Succeed())
	got.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "switch-replaced"}
	h.g.Expect(k8sClient.Update(h.ctx, got)).To(Succeed())
	h.reconcile(nodes["c"])
	h.g.Expect(h.phase(nodes["c"])).NotTo(Equal(healthy))
	h.g.Expect(h.events()).To(ContainElement(ContainSubstring("network circuit breaker of " + leaf + "=l1 reset by annotation")))
}
