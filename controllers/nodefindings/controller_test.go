package nodefindings

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

var testEnv *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testEnv = e
		return nil
	}))
}

// start runs the controller in a manager against the envtest apiserver.
func start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{Scheme: testEnv.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect((&Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Resync: 2 * time.Second}).SetupWithManager(mgr)).To(Succeed())
	go func() { _ = mgr.Start(ctx) }()
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	NewWithT(t).Expect(testEnv.Client.Create(context.Background(), obj)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(context.Background(), obj) })
}

func findingOf(g Gomega, node string, source gpuhealthv1alpha1.Source, check gpuhealthv1alpha1.Check, code string) *gpuhealthv1alpha1.NodeHealthEvent {
	ev := &gpuhealthv1alpha1.NodeHealthEvent{}
	err := testEnv.Client.Get(context.Background(), client.ObjectKey{Name: gpuhealthv1alpha1.EventName(node, source, check, "", code)}, ev)
	g.Expect(err).NotTo(HaveOccurred())
	return ev
}

// TestAConditionOpensAndResolvesOneFinding: node-problem-detector sets
// ReadonlyFilesystem on a node and clears it; the node gets one finding,
// active then resolved, and gpuhealth's own GPUHealthy is never an input.
func TestAConditionOpensAndResolvesOneFinding(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	bad := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "own-condition"}, Spec: gpuhealthv1alpha1.RemediationPolicySpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "cond"}},
		Conditions:   []gpuhealthv1alpha1.NodeConditionRule{{Type: "GPUHealthy", Status: corev1.ConditionFalse}},
	}}
	err := testEnv.Client.Create(ctx, bad)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("GPUHealthy is gpuhealth's own condition"))

	create(t, &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "conditions"}, Spec: gpuhealthv1alpha1.RemediationPolicySpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "cond"}},
		Conditions:   []gpuhealthv1alpha1.NodeConditionRule{{Type: "ReadonlyFilesystem", Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionRebootNode}},
	}})
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cond-node", Labels: map[string]string{"pool": "cond"}}}
	create(t, n)
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "FilesystemIsReadOnly", Message: "Filesystem is read-only"},
		{Type: "GPUHealthy", Status: corev1.ConditionFalse, Reason: "Quarantined"},
	}
	g.Expect(testEnv.Client.Status().Update(ctx, n)).To(Succeed())
	start(t)

	g.Eventually(func(g Gomega) {
		ev := findingOf(g, "cond-node", gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, "ReadonlyFilesystem")
		g.Expect(ev.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
		g.Expect(ev.Spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
		g.Expect(ev.Spec.Message).To(ContainSubstring("FilesystemIsReadOnly: Filesystem is read-only"))
		g.Expect(ev.Status.Count).To(Equal(int64(1)))
		g.Expect(ev.Status.Resolved).To(BeFalse())
	}).WithTimeout(20 * time.Second).Should(Succeed())

	g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(n), n)).To(Succeed())
	n.Status.Conditions[0].Status = corev1.ConditionFalse
	g.Expect(testEnv.Client.Status().Update(ctx, n)).To(Succeed())
	g.Eventually(func(g Gomega) {
		ev := findingOf(g, "cond-node", gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, "ReadonlyFilesystem")
		g.Expect(ev.Status.Resolved).To(BeTrue())
		g.Expect(ev.Status.ResolvedAt).NotTo(BeNil())
		g.Expect(ev.Status.Count).To(Equal(int64(1)))
	}).WithTimeout(20 * time.Second).Should(Succeed())

	var all gpuhealthv1alpha1.NodeHealthEventList
	g.Expect(testEnv.Client.List(ctx, &all)).To(Succeed())
	var mine []string
	for _, ev := range all.Items {
		if ev.Spec.NodeName == "cond-node" {
			mine = append(mine, ev.Spec.Code)
			_ = testEnv.Client.Delete(ctx, &ev)
		}
	}
	g.Expect(mine).To(Equal([]string{"ReadonlyFilesystem"}), "one finding, and none for GPUHealthy")
}

// TestADriftedNodeGetsAFinding: three nodes of one pool report their
// stacks; the one with another driver has a Drift finding naming both
// versions, resolved once it reports the pool's driver.
func TestADriftedNodeGetsAFinding(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	create(t, &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "drift"}, Spec: gpuhealthv1alpha1.RemediationPolicySpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "drift"}},
		Drift:        &gpuhealthv1alpha1.DriftSpec{},
	}})
	for i, driver := range []string{"570.133.20", "570.133.20", "570.86.15"} {
		name := []string{"drift-a", "drift-b", "drift-c"}[i]
		create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "drift", ProductLabel: "NVIDIA-H200"}}})
		create(t, &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: gpuhealthv1alpha1.NodeInventorySpec{
			NodeName: name, ObservedAt: metav1.Now(), Driver: gpuhealthv1alpha1.DriverInventory{Version: driver}, GPUCount: ptr.To(int32(8)),
		}})
	}
	start(t)
	g.Eventually(func(g Gomega) {
		ev := findingOf(g, "drift-c", gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, "driver")
		g.Expect(ev.Spec.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
		g.Expect(ev.Spec.Message).To(Equal(`driver is "570.86.15"; 2 of the 3 nodes of pool drift/NVIDIA-H200 reporting it have "570.133.20"`))
	}).WithTimeout(20 * time.Second).Should(Succeed())

	inv := &gpuhealthv1alpha1.NodeInventory{}
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "drift-c"}, inv)).To(Succeed())
	inv.Spec.Driver.Version = "570.133.20"
	g.Expect(testEnv.Client.Update(ctx, inv)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(findingOf(g, "drift-c", gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, "driver").Status.Resolved).To(BeTrue())
	}).WithTimeout(20 * time.Second).Should(Succeed())

	// A report an hour old is a monitor that stopped: it no longer counts.
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "drift-c"}, inv)).To(Succeed())
	inv.Spec.Driver.Version, inv.Spec.ObservedAt = "570.86.15", metav1.NewTime(time.Now().Add(-2*time.Hour))
	g.Expect(testEnv.Client.Update(ctx, inv)).To(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(findingOf(g, "drift-c", gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, "driver").Status.Resolved).To(BeTrue())
	}).WithTimeout(4 * time.Second).Should(Succeed())

	bad := &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "drift-a-other"}, Spec: gpuhealthv1alpha1.NodeInventorySpec{NodeName: "drift-a", ObservedAt: metav1.Now()}}
	err := testEnv.Client.Create(ctx, bad)
	g.Expect(err).To(HaveOccurred(), "a report is named after its node")
}
