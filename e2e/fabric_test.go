//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// testFabricFaultTaintsTheClique: an unhealthy fabric on one GPU of
// gpu-node-0 (clique 0: gpu-node-0 to gpu-node-3) taints every node of that
// clique fabric-degraded, so no new multi-node job lands on the broken
// rack, without cordoning the healthy members; gpu-node-4, in clique 1, is
// left alone. The faulty node itself is quarantined and goes through its
// cycle. When the fabric is healthy again the taints go and every node is
// back in service.
func testFabricFaultTaintsTheClique(t *testing.T) {
	g := NewWithT(t)
	clique := []string{"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"}
	for _, n := range append(clique, "gpu-node-4") {
		g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	}
	fabric := func(health string) string {
		return fmt.Sprintf("fabric device=0 state=completed health=%s status=success clique=0 cluster=%s at=%s",
			health, strings.ReplaceAll(framework.ClusterUUID, "-", ""), fakenvml.At(time.Now()))
	}
	tainted := func(g Gomega) []string {
		var ns corev1.NodeList
		g.Expect(env.Cluster.Client.List(ctx, &ns)).To(Succeed())
		var out []string
		for _, n := range ns.Items {
			if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == gpuhealthv1alpha1.FabricDegradedTaintKey && t.Effect == corev1.TaintEffectNoSchedule
			}) {
				out = append(out, n.Name)
			}
		}
		return out
	}

	inject(t, "gpu-node-0", fabric("unhealthy"))
	finding := event("gpu-node-0", gpuhealthv1alpha1.CheckFabric, framework.GPUUUID(0, 0), "UNHEALTHY")
	g.Eventually(finding).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) gpuhealthv1alpha1.Severity { return e.Spec.Severity },
		Equal(gpuhealthv1alpha1.SeverityFatal)))
	g.Eventually(tainted).Should(ConsistOf(clique), "every node of the clique, and only those")
	g.Eventually(func(g Gomega) bool { return quarantined(g, "gpu-node-0") }).Should(BeTrue(), "the node that reported it is quarantined")
	for _, n := range clique[1:] {
		g.Expect(node(g, n).Spec.Unschedulable).To(BeFalse(), "%s keeps its running jobs: tainted, not cordoned", n)
	}
	g.Consistently(tainted, 2*time.Second).ShouldNot(ContainElement("gpu-node-4"))

	inject(t, "gpu-node-0", fabric("healthy"))
	g.Eventually(finding).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) bool { return e.Status.Resolved }, BeTrue()))
	g.Eventually(tainted).Should(BeEmpty(), "the taints go with the fault")
	g.Eventually(phase("gpu-node-0"), 5*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return node(g, "gpu-node-0").Spec.Unschedulable }).Should(BeFalse())

	// The finding is over: the operator's garbage collector deletes it once
	// it has been finished for the suite's --event-retention, through the
	// shipped RBAC, and the monitor does not bring it back.
	name := gpuhealthv1alpha1.EventName("gpu-node-0", gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckFabric, framework.GPUUUID(0, 0), "UNHEALTHY")
	gone := func() bool {
		return apierrors.IsNotFound(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &gpuhealthv1alpha1.NodeHealthEvent{}))
	}
	g.Eventually(gone, eventRetention+time.Minute).Should(BeTrue(), "collected after the retention")
	g.Consistently(gone, 2*time.Second).Should(BeTrue(), "not re-created")
}
