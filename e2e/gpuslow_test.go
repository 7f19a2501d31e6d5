//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// testThrottledGPUCycle: GPU 5 of gpu-node-4 runs under HW slowdown for 7 s,
// longer than half of the monitor's 4 s judging window. The monitor reports
// Throttled (Degraded, Recertify) and, the condition holding, again one
// window later; the default policy's slow-gpu rule (two reports within 15
// minutes) quarantines the node, which is drained and recertified and
// returns once the throttle has ended and the finding resolved. The other
// GPUs idle at PCIe gen 1, which is no finding.
func testThrottledGPUCycle(t *testing.T) {
	g := NewWithT(t)
	// gpu-node-4: the ComputeDomain cases kill gpu-node-3, whose monitor's
	// token (bound to its DaemonSet pod) then no longer authenticates.
	const node = "gpu-node-4"
	g.Eventually(phase(node)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	recerts := len(jobs(g, node, job.Recertification))

	start := time.Now()
	inject(t, node,
		fmt.Sprintf("clocks device=5 reasons=hw_slowdown sm=1005 at=%s", fakenvml.At(start.Add(time.Second))),
		fmt.Sprintf("clocks device=5 reasons=gpu_idle sm=345 at=%s", fakenvml.At(start.Add(8*time.Second))))

	throttled := event(node, gpuhealthv1alpha1.CheckThrottled, framework.GPUUUID(4, 5), "HW_SLOWDOWN")
	g.Eventually(throttled).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, BeNumerically(">=", 1)))
	spec := throttled(g).Spec
	g.Expect(spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRecertify))
	g.Expect(spec.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(4, 5)}))
	g.Expect(spec.Message).To(ContainSubstring("SM clock 1005 of 1980 MHz"))

	g.Eventually(func(g Gomega) bool { return quarantined(g, node) }).Should(BeTrue(), "quarantined on the second report")
	e := throttled(g)
	g.Expect(e.Status.Count).To(BeNumerically(">=", 2))
	g.Expect(e.Status.Classification).NotTo(BeNil())
	g.Expect(e.Status.Classification.Rule).To(Equal("slow-gpu"))
	quarantinedAfter := time.Since(start)

	// The fence comes before the write-up: the phase may still read
	// Healthy while the node is already cordoned.
	cycle := func(g Gomega) []gpuhealthv1alpha1.NodeHealthPhase {
		var out []gpuhealthv1alpha1.NodeHealthPhase
		for _, h := range nodeHealth(g, node).Status.History {
			if !h.Time.Time.Before(start.Truncate(time.Second)) {
				out = append(out, h.To)
			}
		}
		return out
	}
	g.Eventually(cycle).Should(ContainElement(gpuhealthv1alpha1.PhaseQuarantined), "the quarantine written up")
	g.Eventually(phase(node), time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Expect(throttled(g).Status.Resolved).To(BeTrue(), "back only once the throttle ended")
	g.Eventually(func(g Gomega) bool { return quarantined(g, node) }).Should(BeFalse())
	g.Expect(jobs(g, node, job.Recertification)).To(HaveLen(recerts+1), "one recertification")
	g.Expect(cycle(g)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{
		gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying, gpuhealthv1alpha1.PhaseHealthy,
	}), "one cycle since the throttle, each transition once")
	t.Logf("throttle at +1s, quarantined by +%s, Healthy again by +%s", quarantinedAfter.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))

	for d := range 8 {
		for _, code := range []string{"GENERATION", "WIDTH"} {
			name := gpuhealthv1alpha1.EventName(node, gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckPCIeDegraded, framework.GPUUUID(4, d), code)
			g.Expect(kubectl(t, "get", "nodehealthevents", "--ignore-not-found", name)).To(BeEmpty(), "an idle link at gen 1 is no finding")
		}
	}
}
