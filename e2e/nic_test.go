//go:build e2e

package e2e

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/ib/ibfake"
)

// testNICPortDownCycle: gpu-node-1's monitor reads a sysfs with two
// ConnectX-7 InfiniBand adapters and a RoCE adapter its configuration does
// not name (management). The management port going down reports nothing;
// the compute port mlx5_1/1 going DOWN is a Fatal PortDown finding after
// the ib source's grace, and the node is taken out. The port comes back:
// the finding resolves, the node is recertified and returns. The monitor
// keeps its ib source (all ports up) for the rest of the suite, whose
// metric checks read its series.
func testNICPortDownCycle(t *testing.T) {
	g := NewWithT(t)
	const n = "gpu-node-1"
	g.Eventually(phase(n), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy), "back from the cases before")
	env.Monitors[n].Stop()
	m, err := framework.NewMonitorWith(ctx, env.Cluster, env.Bins, env.Dir, n, framework.Scenario(1),
		framework.MonitorOptions{IB: []ibfake.HCA{ibfake.InfiniBand(0), ibfake.InfiniBand(1), ibfake.RoCE(9)}})
	g.Expect(err).NotTo(HaveOccurred())
	env.Monitors[n] = m
	g.Expect(m.Start(ctx)).To(Succeed())
	g.Eventually(func() (string, error) { return scrape(m.Metrics) }, time.Minute).Should(And(
		ContainSubstring(`gpuhealth_monitor_nic_port_up{compute="true",device="mlx5_1",link_layer="InfiniBand",port="1"} 1`),
		ContainSubstring(`gpuhealth_monitor_nic_port_up{compute="false",device="mlx5_9",link_layer="Ethernet",port="1"} 1`),
		ContainSubstring(`gpuhealth_monitor_nic_port_expected_rate_gbps{device="mlx5_1",port="1"} 400`)))

	g.Expect(ibfake.SetPort(m.SysRoot, "mlx5_9", 1, false)).To(Succeed())
	g.Expect(ibfake.SetPort(m.SysRoot, "mlx5_1", 1, false)).To(Succeed())
	down := eventOf(n, gpuhealthv1alpha1.SourceIB, gpuhealthv1alpha1.CheckNIC, "mlx5_1/1", "PortDown")
	g.Eventually(down, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) string { return e.Spec.Message },
		ContainSubstring("MT4129 port mlx5_1/1 (InfiniBand) DOWN/Polling")))
	g.Eventually(phase(n), time.Minute).ShouldNot(Equal(gpuhealthv1alpha1.PhaseHealthy), "a compute port down takes the node out")
	g.Eventually(func(g Gomega) bool { return quarantined(g, n) }, time.Minute).Should(BeTrue())
	mgmt := gpuhealthv1alpha1.EventName(n, gpuhealthv1alpha1.SourceIB, gpuhealthv1alpha1.CheckNIC, "mlx5_9/1", "PortDown")
	err = env.Cluster.Client.Get(ctx, client.ObjectKey{Name: mgmt}, &gpuhealthv1alpha1.NodeHealthEvent{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a management port is never a finding: %v", err)

	g.Expect(ibfake.SetPort(m.SysRoot, "mlx5_9", 1, true)).To(Succeed())
	g.Expect(ibfake.SetPort(m.SysRoot, "mlx5_1", 1, true)).To(Succeed())
	g.Eventually(down, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	g.Eventually(phase(n), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy), "recertified and back")
}
