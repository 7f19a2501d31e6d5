//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// restartMonitor replaces node's monitor with one running scenario (and,
// with pciGPUs, a fake PCI bus).
func restartMonitor(t *testing.T, node, scenario string, pciGPUs []string) {
	t.Helper()
	g := NewWithT(t)
	env.Monitors[node].Stop()
	m, err := framework.NewMonitorWith(ctx, env.Cluster, env.Bins, env.Dir, node, scenario, framework.MonitorOptions{PCIGPUs: pciGPUs})
	g.Expect(err).NotTo(HaveOccurred())
	env.Monitors[node] = m
	g.Expect(m.Start(ctx)).To(Succeed())
}

// testStackDriftAndMissingGPU: gpu-node-4 reports another driver (its
// monitor's NVML says 570.86.15, the others 570.133.20): a Drift
// finding names both, observed, the node stays in service; it goes when
// the node runs the pool's driver again. gpu-node-3 boots with seven of
// the eight GPUs its PCI bus has: NVML's list is short, GPUMissing (PCI)
// is Fatal and the node is taken out; with all eight back it returns.
func testStackDriftAndMissingGPU(t *testing.T) {
	g := NewWithT(t)
	const drifted, short = "gpu-node-4", "gpu-node-3"
	patchPolicy(t, `{"spec":{"drift":{"verdict":"Observe"}}}`)
	var bus []string
	for d := range 8 {
		bus = append(bus, "0000:"+hex2(0x18+d*0x10)+":00.0")
	}

	restartMonitor(t, drifted, "system driver=570.86.15\n"+framework.Scenario(4), nil)
	drift := eventOf(drifted, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, "", "driver")
	g.Eventually(drift, time.Minute).Should(And(
		WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) string { return e.Spec.Message }, And(ContainSubstring(`"570.86.15"`), ContainSubstring(`"570.133.20"`))),
		WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) gpuhealthv1alpha1.EventPhase { return e.Status.Phase }, Equal(gpuhealthv1alpha1.EventActive))))
	g.Consistently(phase(drifted), 2*time.Second).Should(Equal(gpuhealthv1alpha1.PhaseHealthy), "drift is observed, not acted on")
	g.Eventually(func() (string, error) { return scrape(env.Operator.Metrics) }).Should(ContainSubstring(
		`gpuhealth_node_drift{majority="570.133.20",node="gpu-node-4",pool="default/",property="driver",value="570.86.15"} 1`),
		"the alert's and the dashboard's series, while the node drifts")

	var seven []string
	for _, l := range strings.Split(framework.Scenario(3), "\n") {
		if !strings.Contains(l, "index=7 ") && !strings.Contains(l, "device=7") {
			seven = append(seven, l)
		}
	}
	restartMonitor(t, short, strings.Join(seven, "\n"), bus)
	missing := event(short, gpuhealthv1alpha1.CheckGPUMissing, "", "PCI")
	g.Eventually(missing, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) string { return e.Spec.Message },
		ContainSubstring("not in NVML: 0000:88:00.0")))
	g.Eventually(phase(short), time.Minute).ShouldNot(Equal(gpuhealthv1alpha1.PhaseHealthy), "a missing GPU takes the node out")
	g.Eventually(func(g Gomega) bool { return quarantined(g, short) }, time.Minute).Should(BeTrue())

	// Both put right: the pool's driver, all eight GPUs.
	restartMonitor(t, drifted, framework.Scenario(4), nil)
	restartMonitor(t, short, framework.Scenario(3), bus)
	g.Eventually(drift, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	g.Eventually(missing, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	g.Eventually(phase(short), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy), "recertified and back")
}

func hex2(n int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[n>>4], digits[n&15]})
}
