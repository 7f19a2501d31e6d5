//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// These cases run against one installation (TestMain), in the order of
// the suite's list (cases, cases_test.go); each works on its own nodes or
// waits for the nodes it shares to be Healthy.

// testXID79FullCycle: an XID 79 on one node takes it through quarantine,
// drain (honouring the workload's PDB), the reboot step and
// recertification back to Healthy, and the workload moves to a healthy node.
func testXID79FullCycle(t *testing.T) {
	g := NewWithT(t)
	// Two replicas that each take a whole node's GPUs, preferring gpu-node-0
	// and gpu-node-3; gpu-node-4 is where a replacement can go.
	g.Expect(framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
		Namespace: "ml", Name: "trainer", Replicas: 2,
		Allowed: []string{"gpu-node-0", "gpu-node-3", "gpu-node-4"}, Preferred: []string{"gpu-node-0", "gpu-node-3"},
		MinAvailable: ptr.To[int32](1),
	})).To(Succeed())
	g.Eventually(func(g Gomega) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "trainer")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods).To(HaveKey("gpu-node-0"))
		g.Expect(pods["gpu-node-0"][0].Status.Phase).To(Equal(corev1.PodRunning))
	}).Should(Succeed())

	injectXID(t, "gpu-node-0", 0, 79)

	e := xidEvent(0, 0, "79")
	g.Eventually(e).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, BeNumerically(">=", 1)))
	spec := e(g).Spec
	g.Expect(spec.NodeName).To(Equal("gpu-node-0"))
	g.Expect(spec.Source).To(Equal(gpuhealthv1alpha1.SourceNVML))
	g.Expect(spec.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(0, 0)}))
	g.Expect(spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRebootNode))

	g.Eventually(func(g Gomega) bool { return quarantined(g, "gpu-node-0") }).Should(BeTrue(), "cordoned and tainted")

	// The trainer pod on gpu-node-0 is evicted and its replacement runs on
	// the free, healthy gpu-node-4.
	g.Eventually(func(g Gomega) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "trainer")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods).NotTo(HaveKey("gpu-node-0"))
		g.Expect(pods).To(HaveKey("gpu-node-4"))
		g.Expect(pods["gpu-node-4"][0].Status.Phase).To(Equal(corev1.PodRunning))
	}).Should(Succeed())

	g.Eventually(phase("gpu-node-0")).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return quarantined(g, "gpu-node-0") }).Should(BeFalse())
	g.Eventually(func(g Gomega) bool { return node(g, "gpu-node-0").Spec.Unschedulable }).Should(BeFalse(), "schedulable again")
	g.Expect(jobs(g, "gpu-node-0", job.RebootNode)).To(HaveLen(1), "one reboot step")
	g.Expect(jobs(g, "gpu-node-0", job.Recertification)).To(HaveLen(1), "one recertification")
	g.Expect(historyPhases(nodeHealth(g, "gpu-node-0"))).To(ContainElements(
		gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying, gpuhealthv1alpha1.PhaseHealthy))
	out := kubectl(t, "get", "nodehealth", "gpu-node-0")
	g.Expect(out).To(ContainSubstring("Healthy"))
	t.Logf("kubectl get nodehealth gpu-node-0:\n%s", out)
}

// testNVLinkCRCBurst: a CRC-rate burst on one link is a Degraded finding.
// With the default policy (rule nvlink-error-rate: quarantine after three
// threshold crossings within ten minutes) one burst is recorded, not acted
// on; the finding resolves when the rate drops.
func testNVLinkCRCBurst(t *testing.T) {
	g := NewWithT(t)
	inject(t, "gpu-node-1", fmt.Sprintf("nvlink device=2 link=5 counter=crc_flit rate=5000 from=%s for=6s", fakenvml.At(time.Now())))
	link := event("gpu-node-1", gpuhealthv1alpha1.CheckNVLinkErrors, framework.GPUUUID(1, 2)+"/link-5", "CRC_FLIT")
	g.Eventually(link).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Count >= 1 }, BeTrue()))
	e := link(g)
	g.Expect(e.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(e.Spec.Component.Kind).To(Equal(gpuhealthv1alpha1.ComponentNVLink))
	g.Consistently(func(g Gomega) bool { return node(g, "gpu-node-1").Spec.Unschedulable }, 3*time.Second).Should(BeFalse(),
		"one crossing does not quarantine under the default policy")
	g.Eventually(link).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	g.Expect(phase("gpu-node-1")(g)).To(Equal(gpuhealthv1alpha1.PhaseHealthy))
}

// testRecertificationFailsTwice: recertification Jobs that fail (the kwok
// stage fails Job pods labelled gpuhealth.dev/e2e-fail=true) leave the node
// Failed and cordoned after maxAttempts (2); a manual release returns it.
func testRecertificationFailsTwice(t *testing.T) {
	g := NewWithT(t)
	failing := `{"spec":{"recertification":{"steps":[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok","labels":{"gpuhealth.dev/e2e-fail":"true"}},"timeout":"2m","parser":{"type":"exit-code"}}]}}}`
	passing := `{"spec":{"recertification":{"steps":` + kwokStep + `}}}`
	patchPolicy(t, failing)
	defer patchPolicy(t, passing)
	injectXID(t, "gpu-node-2", 0, 79)
	g.Eventually(phase("gpu-node-2")).Should(Equal(gpuhealthv1alpha1.PhaseFailed))
	g.Expect(jobs(g, "gpu-node-2", job.Recertification)).To(HaveLen(2), "one Job per attempt")
	g.Consistently(func(g Gomega) bool { return quarantined(g, "gpu-node-2") }, 2*time.Second).Should(BeTrue(), "Failed stays cordoned")

	patchPolicy(t, passing)
	request(t, "gpu-node-2", "Release", "e2e-release-1", "GPU swapped by the e2e suite")
	g.Eventually(phase("gpu-node-2")).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	// The uncordon follows the status write that says Healthy.
	g.Eventually(func(g Gomega) bool { return quarantined(g, "gpu-node-2") }).Should(BeFalse())
}

// testOperatorKilledMidDrain: the operator is SIGKILLed while a PDB blocks
// the drain; the restarted operator (after taking over the leader Lease)
// finishes the cycle with no duplicate Jobs.
func testOperatorKilledMidDrain(t *testing.T) {
	g := NewWithT(t)
	g.Expect(framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
		Namespace: "ml", Name: "pinned", Replicas: 1, Allowed: []string{"gpu-node-3"}, GPUs: -1, MinAvailable: ptr.To[int32](1),
	})).To(Succeed())
	g.Eventually(func(g Gomega) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "pinned")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods).To(HaveKey("gpu-node-3"))
		g.Expect(pods["gpu-node-3"][0].Status.Phase).To(Equal(corev1.PodRunning))
	}).Should(Succeed())

	injectXID(t, "gpu-node-3", 1, 79)
	g.Eventually(phase("gpu-node-3")).Should(Equal(gpuhealthv1alpha1.PhaseDraining))
	g.Consistently(phase("gpu-node-3"), 2*time.Second).Should(Equal(gpuhealthv1alpha1.PhaseDraining), "the PDB blocks the drain")

	env.Operator.Kill()
	g.Expect(env.Operator.Start(ctx)).To(Succeed())
	g.Expect(env.Cluster.Client.Delete(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pinned"}})).To(Succeed())

	g.Eventually(phase("gpu-node-3")).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Expect(jobs(g, "gpu-node-3", job.RebootNode)).To(HaveLen(1), "no duplicate reboot Job")
	g.Expect(jobs(g, "gpu-node-3", job.Recertification)).To(HaveLen(1), "no duplicate recertification Job")
}

// testMonitorRestartDuringOutage: with the kube-apiserver stopped, a finding
// is made and the monitor restarted; when the apiserver is back, the finding
// arrives, once.
func testMonitorRestartDuringOutage(t *testing.T) {
	g := NewWithT(t)
	const n = "gpu-node-4"
	restart, err := env.Cluster.StopAPIServer(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	injectXID(t, n, 1, 13)
	record := filepath.Join(env.Monitors[n].SpoolDir, gpuhealthv1alpha1.EventName(n, gpuhealthv1alpha1.SourceNVML,
		gpuhealthv1alpha1.CheckXID, framework.GPUUUID(4, 1), "13")+".json")
	g.Eventually(record).Should(BeAnExistingFile(), "the finding waits in the spool")
	m := env.Monitors[n]
	m.Stop()
	g.Expect(m.Start(ctx)).To(Succeed())
	g.Expect(restart()).To(Succeed())
	// The operator may lose its leader Lease while the apiserver is away and
	// exit, as a leader-elected controller must; its Deployment would
	// restart it.
	if !env.Operator.Running() {
		g.Expect(env.Operator.Start(ctx)).To(Succeed())
	}
	xid13 := xidEvent(4, 1, "13")
	g.Eventually(xid13).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
	g.Eventually(func() int { return spooled(n) }).Should(BeZero())
	g.Consistently(xid13, 3*time.Second).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))), "once, not twice")
}

// testMonitorMayOnlyWriteItsOwnNode: a monitor token bound to gpu-node-0's
// DaemonSet pod may write events about gpu-node-0 and not about gpu-node-1.
func testMonitorMayOnlyWriteItsOwnNode(t *testing.T) {
	g := NewWithT(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", monitorKubeconfig("gpu-node-0"))
	g.Expect(err).NotTo(HaveOccurred())
	c, err := client.New(cfg, client.Options{Scheme: env.Cluster.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	mk := func(nodeName string) *gpuhealthv1alpha1.NodeHealthEvent {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: nodeName, Source: gpuhealthv1alpha1.SourceManual, Check: gpuhealthv1alpha1.CheckXID,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(0, 7)},
			Code:      "43", Severity: gpuhealthv1alpha1.SeverityInfo, RecommendedAction: gpuhealthv1alpha1.ActionNone,
		}
		return &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
	}
	err = c.Create(ctx, mk("gpu-node-1"))
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("may only write NodeHealthEvents about its own node"))
	g.Expect(c.Create(ctx, mk("gpu-node-0"))).To(Succeed(), "its own node is fine")
}

// testBudgetDrainsOneAtATime: with maxUnavailable 1, three nodes faulted at
// once are all cordoned at once, drained and recertified one at a time, and
// all come back.
func testBudgetDrainsOneAtATime(t *testing.T) {
	g := NewWithT(t)
	patchPolicy(t, `{"spec":{"budgets":{"maxUnavailable":1}}}`)
	defer patchPolicy(t, `{"spec":{"budgets":{"maxUnavailable":"10%"}}}`)
	nodes := []string{"gpu-node-1", "gpu-node-2", "gpu-node-3"}
	for _, n := range nodes {
		g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	}
	for _, n := range nodes {
		injectXID(t, n, 3, 79)
	}
	maxOut := 0
	// observe returns how many of the nodes are cordoned and how many are
	// Healthy, and tracks the most that were out (Draining or Recertifying)
	// at once.
	observe := func(g Gomega) (cordoned, back int) {
		// One List of each kind: a consistent snapshot (node-by-node reads
		// could see one node still Recertifying and, a moment later, the
		// next already Draining).
		var nhs gpuhealthv1alpha1.NodeHealthList
		g.Expect(env.Cluster.Client.List(ctx, &nhs)).To(Succeed())
		var ns corev1.NodeList
		g.Expect(env.Cluster.Client.List(ctx, &ns)).To(Succeed())
		unschedulable := map[string]bool{}
		for _, n := range ns.Items {
			unschedulable[n.Name] = n.Spec.Unschedulable
		}
		out := 0
		for _, nh := range nhs.Items {
			if !slices.Contains(nodes, nh.Name) {
				continue
			}
			switch p := nh.Status.Phase; {
			case p == gpuhealthv1alpha1.PhaseDraining || p == gpuhealthv1alpha1.PhaseRecertifying:
				out++
			case p == gpuhealthv1alpha1.PhaseHealthy && !unschedulable[nh.Name]:
				// Back in service. (Right after the fence a node is
				// cordoned while its NodeHealth still says Healthy: the
				// cordon is written first, the bookkeeping after.)
				back++
			}
		}
		for _, n := range nodes {
			if unschedulable[n] {
				cordoned++
			}
		}
		maxOut = max(maxOut, out)
		return cordoned, back
	}
	g.Eventually(func(g Gomega) int { c, _ := observe(g); return c }, time.Minute, 100*time.Millisecond).Should(Equal(len(nodes)),
		"all three cordoned at once: fatal faults do not wait for the budget")
	g.Eventually(func(g Gomega) int { _, b := observe(g); return b }, 5*time.Minute, 100*time.Millisecond).Should(Equal(len(nodes)))
	g.Expect(maxOut).To(Equal(1), "never more than one draining or recertifying")
}

// testBadInputIsRejected: kubectl rejects a malformed policy and a
// hand-written event with an invalid code, with a clear message; the
// operator keeps running.
func testBadInputIsRejected(t *testing.T) {
	g := NewWithT(t)
	_, err := env.Cluster.Kubectl(ctx, "apply", "-f", "e2e/testdata/bad-policy.yaml")
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("maxUnavailable must be a non-negative count"))
	_, err = env.Cluster.Kubectl(ctx, "apply", "-f", "e2e/testdata/bad-event.yaml")
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("code of an XID finding must be the XID number"))
	g.Consistently(env.Operator.Running, 2*time.Second).Should(BeTrue())
}
