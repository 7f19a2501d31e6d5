//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
)

// operatorSamples scrapes the operator and returns the value of every
// sample of the metric whose labels include all of match.
func operatorSamples(g Gomega, metric string, match ...string) []float64 {
	body, err := scrape(env.Operator.Metrics)
	g.Expect(err).NotTo(HaveOccurred())
	var out []float64
	for _, line := range strings.Split(body, "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, _ := strings.Cut(series, "{")
		if name != metric {
			continue
		}
		all := true
		for _, m := range match {
			all = all && strings.Contains(labels, m)
		}
		if !all {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		g.Expect(err).NotTo(HaveOccurred(), line)
		out = append(out, v)
	}
	return out
}

func sum(vs []float64) float64 {
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s
}

// goodput is the fleet's infrastructure goodput now, from the operator's
// GPU gauges: in-service GPUs over managed GPUs (the instantaneous value
// of the gpuhealth:goodput recording rules).
func goodput(g Gomega) float64 {
	managed := sum(operatorSamples(g, "gpuhealth_node_gpus"))
	g.Expect(managed).To(BeNumerically(">", 0))
	return 1 - sum(operatorSamples(g, "gpuhealth_node_gpus_out_of_service"))/managed
}

// request writes a manual request with kubectl patch, in the name of the
// suite's user, as the admission policy on requests wants.
func request(t *testing.T, node, action, id, reason string) {
	t.Helper()
	kubectl(t, "patch", "nodehealth", node, "--type", "merge", "-p",
		fmt.Sprintf(`{"spec":{"request":{"action":%q,"id":%q,"reason":%q,"requestedBy":%q}}}`, action, id, reason, whoami(t)))
}

// testMaintenanceDrainedUnderBudgetAndReturned: two nodes asked into
// planned maintenance at once under the default budget (maxUnavailable
// 10% of 5 nodes = 1): one drains and is held in Maintenance, the other
// waits for the budget; goodput counts both as planned downtime. The first
// returns through recertification, the second then drains and is released.
func testMaintenanceDrainedUnderBudgetAndReturned(t *testing.T) {
	g := NewWithT(t)
	g.Eventually(goodput).Should(Equal(1.0), "every node in service before")
	repairs := sum(operatorSamples(g, "gpuhealth_node_repair_duration_seconds_count"))

	request(t, "gpu-node-1", "Maintenance", "e2e-maint-1", "firmware update")
	g.Eventually(phase("gpu-node-1")).Should(Equal(gpuhealthv1alpha1.PhaseMaintenance))
	request(t, "gpu-node-2", "Maintenance", "e2e-maint-2", "firmware update")
	g.Eventually(func(g Gomega) string { return nodeHealth(g, "gpu-node-2").Status.Reason }).Should(Equal(gpuhealthv1alpha1.ReasonWaitingForBudget))
	g.Consistently(phase("gpu-node-2"), 2*time.Second).Should(Equal(gpuhealthv1alpha1.PhaseQuarantined), "the node in Maintenance holds the budget")

	nh := nodeHealth(g, "gpu-node-1")
	g.Expect(nh.Status.Outage.Cause).To(Equal(gpuhealthv1alpha1.OutageMaintenance))
	g.Expect(nh.Status.LastRequest.By).To(HavePrefix(whoami(t)), "audited like a Release, in the name of who asked")
	g.Expect(node(g, "gpu-node-1").Spec.Unschedulable).To(BeTrue())
	g.Expect(operatorSamples(g, "gpuhealth_node_gpus_out_of_service", `node="gpu-node-1"`, `cause="maintenance"`, `phase="Maintenance"`)).To(Equal([]float64{8}))
	g.Expect(operatorSamples(g, "gpuhealth_node_gpus_out_of_service", `node="gpu-node-2"`, `cause="maintenance"`, `phase="Quarantined"`)).To(Equal([]float64{8}))
	gp := goodput(g)
	g.Expect(gp).To(BeNumerically("<", 1))
	t.Logf("goodput with two of five nodes in maintenance: %.3f", gp)

	request(t, "gpu-node-1", "Recertify", "e2e-maint-1-back", "firmware updated")
	g.Eventually(phase("gpu-node-1")).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Expect(historyPhases(nodeHealth(g, "gpu-node-1"))).To(ContainElements(gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.PhaseDraining,
		gpuhealthv1alpha1.PhaseMaintenance, gpuhealthv1alpha1.PhaseRecertifying, gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(phase("gpu-node-2")).Should(Equal(gpuhealthv1alpha1.PhaseMaintenance), "the budget freed")

	request(t, "gpu-node-2", "Release", "e2e-maint-2-back", "nothing changed after all")
	g.Eventually(phase("gpu-node-2")).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return node(g, "gpu-node-2").Spec.Unschedulable }).Should(BeFalse())
	g.Eventually(goodput).Should(Equal(1.0), "back to 1 once every node is in service")
	g.Expect(sum(operatorSamples(g, "gpuhealth_node_repair_duration_seconds_count"))).To(Equal(repairs), "maintenance is no repair")
	out := kubectl(t, "get", "nodehealth", "gpu-node-1", "gpu-node-2")
	t.Logf("kubectl get nodehealth:\n%s", out)
}

var (
	machineGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"}
	repairGVK  = schema.GroupVersionKind{Group: "repair.e2e.gpuhealth.dev", Version: "v1", Kind: "RepairRequest"}
)

// standInCRD is a CRD that accepts any object of the kind, with a status
// subresource: enough to stand in for Cluster API's Machine and a
// provider's repair request.
func standInCRD(gvk schema.GroupVersionKind, plural string) string {
	return fmt.Sprintf(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"%[1]s.%[2]s"},
"spec":{"group":%[2]q,"scope":"Namespaced","names":{"plural":%[1]q,"singular":%[3]q,"kind":%[4]q},
"versions":[{"name":%[5]q,"served":true,"storage":true,"subresources":{"status":{}},
"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`,
		plural, gvk.Group, strings.ToLower(gvk.Kind), gvk.Kind, gvk.Version)
}

// applyJSON applies one object, written as JSON.
func applyJSON(manifest string) error {
	f, err := os.CreateTemp("", "gpuhealth-e2e-*.json")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.WriteString(manifest); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = env.Cluster.Kubectl(ctx, "apply", "-f", f.Name())
	return err
}

// helmSet upgrades the suite's release with its values and these settings.
func helmSet(t *testing.T, set ...string) {
	t.Helper()
	args := []string{"upgrade", framework.ReleaseName, "charts/gpuhealth", "--namespace", framework.Namespace, "--reuse-values", "--wait", "--timeout", "2m"}
	for _, s := range set {
		args = append(args, "--set-json", s)
	}
	if _, err := env.Cluster.Helm(ctx, args...); err != nil {
		t.Fatal(err)
	}
}

// testHandOffs: a node whose recertification attempts are exhausted is
// handed off — to Cluster API (its Machine annotated for a
// MachineHealthCheck, against a stand-in Machine CRD), then, retried and
// failing again, through a template (a repair request created, owned by the
// NodeHealth, its status shown). All the while the node's GPUHealthy
// condition keeps the lastTransitionTime of when it turned False, as tools
// that act on conditions (Karpenter's node repair) need.
func testHandOffs(t *testing.T) {
	g := NewWithT(t)
	const name = "gpu-node-2"
	g.Expect(applyJSON(standInCRD(machineGVK, "machines"))).To(Succeed())
	g.Expect(applyJSON(standInCRD(repairGVK, "repairrequests"))).To(Succeed())
	// The RBAC each hand-off needs, granted through the chart as a user would.
	helmSet(t, "operator.handOff.clusterAPI=true",
		`operator.handOff.rules=[{"apiGroups":["repair.e2e.gpuhealth.dev"],"resources":["repairrequests"],"verbs":["get","create","delete"]}]`)
	defer helmSet(t, "operator.handOff.clusterAPI=false", "operator.handOff.rules=[]")
	defer kubectl(t, "delete", "crd", "machines.cluster.x-k8s.io", "repairrequests.repair.e2e.gpuhealth.dev", "--ignore-not-found")
	kubectl(t, "create", "namespace", "capi-e2e")
	defer kubectl(t, "delete", "namespace", "capi-e2e", "--ignore-not-found", "--wait=false")
	g.Eventually(func() error {
		return applyJSON(`{"apiVersion":"cluster.x-k8s.io/v1beta1","kind":"Machine","metadata":{"name":"m-2","namespace":"capi-e2e"},"spec":{"clusterName":"e2e"}}`)
	}).Should(Succeed(), "the stand-in CRD is served")
	// Cluster API's Machine controller writes the Machine's status.nodeRef;
	// the operator hands off only a Machine whose nodeRef is the node.
	kubectl(t, "patch", "machine", "-n", "capi-e2e", "m-2", "--subresource", "status", "--type", "merge",
		"-p", `{"status":{"nodeRef":{"kind":"Node","name":"`+name+`","uid":"`+string(node(g, name).UID)+`"}}}`)
	kubectl(t, "annotate", "node", name, handoff.MachineAnnotation+"=m-2", handoff.ClusterNamespaceAnnotation+"=capi-e2e")
	defer kubectl(t, "annotate", "node", name, handoff.MachineAnnotation+"-", handoff.ClusterNamespaceAnnotation+"-")

	failing := `{"spec":{"recertification":{"steps":[{"name":"recertify","job":{"image":"registry.invalid/recertify:kwok","labels":{"gpuhealth.dev/e2e-fail":"true"}},"timeout":"2m","parser":{"type":"exit-code"}}]},` +
		`"remediation":{"handOff":{"type":"ClusterAPI"}}}}`
	patchPolicy(t, failing)
	defer patchPolicy(t, `{"spec":{"recertification":{"steps":`+kwokStep+`},"remediation":{"handOff":null}}}`)

	injectXID(t, name, 0, 79)
	var ltt time.Time
	var firstMessage string
	g.Eventually(func(g Gomega) {
		c := gpuHealthy(g, name)
		g.Expect(c.Status).To(Equal(corev1.ConditionFalse))
		ltt, firstMessage = c.LastTransitionTime.Time, c.Message
	}).Should(Succeed())
	g.Eventually(phase(name)).Should(Equal(gpuhealthv1alpha1.PhaseFailed))
	g.Eventually(func(g Gomega) *gpuhealthv1alpha1.HandOffStatus { return nodeHealth(g, name).Status.HandOff }).Should(And(
		Not(BeNil()),
		WithTransform(func(h *gpuhealthv1alpha1.HandOffStatus) string {
			return string(h.State) + " " + h.Target + " " + h.Reason
		},
			Equal("HandedOff Machine capi-e2e/m-2 RecertificationExhausted"))))
	m := &unstructured.Unstructured{}
	m.SetGroupVersionKind(machineGVK)
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: "capi-e2e", Name: "m-2"}, m)).To(Succeed())
	g.Expect(m.GetAnnotations()).To(HaveKeyWithValue(handoff.RemediateMachineAnnotation, ""))
	g.Expect(m.GetAnnotations()).To(HaveKeyWithValue(handoff.RequestedAnnotation, gpuhealthv1alpha1.ReasonRecertificationExhausted))
	nh := nodeHealth(g, name)
	last := nh.Status.History[len(nh.Status.History)-1]
	g.Expect([]string{string(last.To), last.Reason}).To(Equal([]string{"Failed", gpuhealthv1alpha1.ReasonHandedOff}), "recorded in history")
	c := gpuHealthy(g, name)
	g.Expect(c.Message).NotTo(Equal(firstMessage), "the condition's message followed the phases")
	g.Expect(c.LastTransitionTime.Time).To(Equal(ltt), "but its lastTransitionTime did not move")
	g.Consistently(func(g Gomega) int {
		return len(nodeHealth(g, name).Status.History)
	}, 2*time.Second).Should(Equal(len(nh.Status.History)), "handed off once")

	// Retried and failing again: a template hand-off this time.
	patchPolicy(t, `{"spec":{"remediation":{"handOff":{"type":"Template","template":{"apiVersion":"repair.e2e.gpuhealth.dev/v1","kind":"RepairRequest",`+
		`"metadata":{"name":"repair-{{.NodeName}}","namespace":"capi-e2e"},"spec":{"node":"{{.NodeName}}","reason":"{{.Reason}}"}}}}}}`)
	request(t, name, "Recertify", "e2e-handoff-retry", "try once more")
	g.Eventually(func(g Gomega) string {
		h := nodeHealth(g, name).Status.HandOff
		g.Expect(h).NotTo(BeNil())
		return string(h.Type) + " " + string(h.State) + " " + h.Target
	}).Should(Equal("Template HandedOff RepairRequest capi-e2e/repair-" + name))
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: "capi-e2e", Name: "m-2"}, m)).To(Succeed())
	g.Expect(m.GetAnnotations()).NotTo(HaveKey(handoff.RemediateMachineAnnotation), "the retry took the Machine's remediation back")
	rr := &unstructured.Unstructured{}
	rr.SetGroupVersionKind(repairGVK)
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: "capi-e2e", Name: "repair-" + name}, rr)).To(Succeed())
	g.Expect(rr.Object["spec"]).To(Equal(map[string]any{"node": name, "reason": gpuhealthv1alpha1.ReasonRecertificationExhausted}))
	g.Expect(rr.GetOwnerReferences()).To(ContainElement(WithTransform(func(o any) string {
		return fmt.Sprint(o)
	}, ContainSubstring("NodeHealth"))))
	kubectl(t, "patch", "repairrequest", "-n", "capi-e2e", "repair-"+name, "--subresource", "status", "--type", "merge",
		"-p", `{"status":{"conditions":[{"type":"Repaired","status":"False","reason":"TechnicianDispatched"}]}}`)
	// Any pass reads the target again; a label on the NodeHealth makes one now.
	kubectl(t, "label", "nodehealth", name, "e2e-poke=1", "--overwrite")
	g.Eventually(func(g Gomega) string { return nodeHealth(g, name).Status.HandOff.TargetStatus }).Should(Equal("Repaired=False (TechnicianDispatched)"))
	g.Expect(gpuHealthy(g, name).LastTransitionTime.Time).To(Equal(ltt), "still the time it turned False")
	g.Expect(sum(operatorSamples(g, "gpuhealth_nodehealth_handoffs_total", `result="HandedOff"`))).To(BeNumerically(">=", 2))

	patchPolicy(t, `{"spec":{"recertification":{"steps":`+kwokStep+`}}}`)
	request(t, name, "Release", "e2e-handoff-release", "replaced by the e2e suite")
	g.Eventually(phase(name)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return quarantined(g, name) }).Should(BeFalse())
	g.Expect(nodeHealth(g, name).Status.HandOff).To(BeNil(), "cleared on return")
	g.Expect(apierrors.IsNotFound(env.Cluster.Client.Get(ctx, client.ObjectKeyFromObject(rr), rr.DeepCopy()))).To(BeTrue(), "the repair request it created is taken back")
	kubectl(t, "label", "nodehealth", name, "e2e-poke-")
}

func gpuHealthy(g Gomega, name string) corev1.NodeCondition {
	for _, c := range node(g, name).Status.Conditions {
		if c.Type == gpuhealthv1alpha1.GPUHealthyNodeCondition {
			return c
		}
	}
	g.Expect("no GPUHealthy condition").To(BeEmpty())
	return corev1.NodeCondition{}
}

// testRepairMetricsAfterTheCycles: the repairs since the operator's last
// start (OperatorKilledMidDrain restarts it) are in the
// repair-duration histogram with their action and outcome — the cycle the
// restarted operator finished recertified, HandOffs' failed — the phases
// they passed through in the phase-duration histogram, and maintenance is
// no repair.
func testRepairMetricsAfterTheCycles(t *testing.T) {
	g := NewWithT(t)
	const repair = "gpuhealth_node_repair_duration_seconds_count"
	g.Expect(sum(operatorSamples(g, repair, `action="RebootNode"`, `outcome="recertified"`))).To(BeNumerically(">=", 1), "the cycle OperatorKilledMidDrain finished after the restart")
	g.Expect(sum(operatorSamples(g, repair, `action="RebootNode"`, `outcome="failed"`))).To(BeNumerically(">=", 1), "the recertification HandOffs exhausted")
	for _, p := range []string{"Quarantined", "Draining", "Recertifying", "Maintenance"} {
		g.Expect(sum(operatorSamples(g, "gpuhealth_node_phase_duration_seconds_count", `phase="`+p+`"`))).To(BeNumerically(">=", 1), p)
	}
	g.Expect(sum(operatorSamples(g, "gpuhealth_nodehealth_time_between_faults_seconds_count", `check="XID"`))).To(BeNumerically(">=", 1), "XIDs on a node twice")
	sums := operatorSamples(g, "gpuhealth_node_repair_duration_seconds_sum", `outcome="recertified"`)
	counts := operatorSamples(g, repair, `outcome="recertified"`)
	t.Logf("MTTR (recertified) over the suite: %.1f s over %.0f repairs", sum(sums)/sum(counts), sum(counts))
}
