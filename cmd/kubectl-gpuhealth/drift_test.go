package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/nodefindings"
)

func TestDriftPools(t *testing.T) {
	node := func(name string, labels map[string]string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	h100 := map[string]string{nodefindings.ProductLabel: "H100"}
	report := func(name, driver string) gpuhealthv1alpha1.NodeInventory {
		return gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gpuhealthv1alpha1.NodeInventorySpec{NodeName: name, ObservedAt: ago(time.Hour), Driver: gpuhealthv1alpha1.DriverInventory{Version: driver}}}
	}
	reports := func(drivers map[string]string) []gpuhealthv1alpha1.NodeInventory {
		var out []gpuhealthv1alpha1.NodeInventory
		for n, d := range drivers {
			out = append(out, report(n, d))
		}
		return out
	}
	gpus := gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{NodeSelector: &metav1.LabelSelector{MatchLabels: h100}}}
	withDrift := func(p gpuhealthv1alpha1.RemediationPolicy, d *gpuhealthv1alpha1.DriftSpec) []gpuhealthv1alpha1.RemediationPolicy {
		p.Spec.Drift = d
		return []gpuhealthv1alpha1.RemediationPolicy{p}
	}
	pool := []metav1.PartialObjectMetadata{node("a", h100), node("b", h100), node("c", h100), node("d", h100), node("cpu", nil)}

	for _, tc := range []struct {
		name     string
		policies []gpuhealthv1alpha1.RemediationPolicy
		nodes    []metav1.PartialObjectMetadata
		invs     []gpuhealthv1alpha1.NodeInventory
		want     []DriftPool
		// table and wide are what printDrift writes without and with -o wide.
		table, wide string
	}{{
		name:     "the odd node out, by the policy's verdict; a node the policy does not select is in no pool",
		policies: withDrift(gpus, &gpuhealthv1alpha1.DriftSpec{Verdict: gpuhealthv1alpha1.VerdictQuarantine}),
		nodes:    pool,
		invs:     reports(map[string]string{"a": "570", "b": "550", "c": "570", "d": "570", "cpu": "1"}),
		want: []DriftPool{{Pool: "gpus/H100", Policy: "gpus", Findings: "Quarantine", Nodes: 4, Properties: []DriftedProperty{
			{Property: "driver", Majority: "570", Agree: 3, Reporting: 4, Outliers: []DriftOutlier{{Node: "b", Value: "550"}}}}}},
		table: "DRIFT POOL   NODES   NOT REPORTING   PROPERTY   MAJORITY        OUTLIERS\n" +
			"gpus/H100    4       0               driver     570 on 3 of 4   b (550)\n",
	}, {
		name:     "without spec.drift the plugin compares all the same, and says the operator does not",
		policies: withDrift(gpus, nil),
		nodes:    pool,
		invs:     reports(map[string]string{"a": "570", "b": "550", "c": "570", "d": "570"}),
		want: []DriftPool{{Pool: "gpus/H100", Policy: "gpus", Findings: "off", Nodes: 4, Properties: []DriftedProperty{
			{Property: "driver", Majority: "570", Agree: 3, Reporting: 4, Outliers: []DriftOutlier{{Node: "b", Value: "550"}}}}}},
		wide: "DRIFT POOL   NODES   NOT REPORTING   PROPERTY   MAJORITY        OUTLIERS   FINDINGS\n" +
			"gpus/H100    4       0               driver     570 on 3 of 4   b (550)    off\n" +
			"Policy gpus does not compare stacks (spec.drift): the operator opens no Drift finding and exports no gpuhealth_node_drift for its nodes.\n",
	}, {
		name:     "a node without a report, with one about another node or with one over an hour old is not reporting; two is too few",
		policies: withDrift(gpus, &gpuhealthv1alpha1.DriftSpec{Enabled: ptr.To(false)}),
		nodes:    pool,
		invs: func() []gpuhealthv1alpha1.NodeInventory {
			stale := report("d", "550")
			stale.Spec.ObservedAt = ago(time.Hour + time.Second)
			return []gpuhealthv1alpha1.NodeInventory{report("a", "570"), report("b", "550"), stale,
				{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: gpuhealthv1alpha1.NodeInventorySpec{NodeName: "a", ObservedAt: ago(0)}}}
		}(),
		want: []DriftPool{{Pool: "gpus/H100", Policy: "gpus", Findings: "off", Nodes: 4, NotReporting: 2, Properties: []DriftedProperty{}}},
		table: "DRIFT POOL   NODES   NOT REPORTING   PROPERTY   MAJORITY   OUTLIERS\n" +
			"gpus/H100    4       2               <none>     no drift   <none>\n",
	}, {
		name:     "pools by the policy's label keys; the table lists three outliers, -o wide all",
		policies: withDrift(gpus, &gpuhealthv1alpha1.DriftSpec{PoolLabelKeys: []string{"rack"}, MinPoolSize: 2}),
		nodes: func() []metav1.PartialObjectMetadata {
			var out []metav1.PartialObjectMetadata
			for _, n := range []string{"r1-a", "r1-b", "r1-c", "r1-d", "r1-e", "r1-f", "r1-g", "r1-h", "r1-i"} {
				out = append(out, node(n, map[string]string{nodefindings.ProductLabel: "H100", "rack": n[:2]}))
			}
			return append(out, node("r2-a", map[string]string{nodefindings.ProductLabel: "H100", "rack": "r2"}),
				node("r2-b", map[string]string{nodefindings.ProductLabel: "H100", "rack": "r2"}))
		}(),
		invs: reports(map[string]string{"r1-a": "570", "r1-b": "550", "r1-c": "570", "r1-d": "551", "r1-e": "570",
			"r1-f": "552", "r1-g": "570", "r1-h": "553", "r1-i": "570", "r2-a": "570", "r2-b": "570"}),
		want: []DriftPool{{Pool: "gpus/r1", Policy: "gpus", Findings: "Observe", Nodes: 9, Properties: []DriftedProperty{
			{Property: "driver", Majority: "570", Agree: 5, Reporting: 9, Outliers: []DriftOutlier{
				{Node: "r1-b", Value: "550"}, {Node: "r1-d", Value: "551"}, {Node: "r1-f", Value: "552"}, {Node: "r1-h", Value: "553"}}}}},
			{Pool: "gpus/r2", Policy: "gpus", Findings: "Observe", Nodes: 2, Properties: []DriftedProperty{}}},
		table: "DRIFT POOL   NODES   NOT REPORTING   PROPERTY   MAJORITY        OUTLIERS\n" +
			"gpus/r1      9       0               driver     570 on 5 of 9   r1-b (550), r1-d (551), r1-f (552), and 1 more (-o wide lists them)\n" +
			"gpus/r2      2       0               <none>     no drift        <none>\n",
		wide: "DRIFT POOL   NODES   NOT REPORTING   PROPERTY   MAJORITY        OUTLIERS                                         FINDINGS\n" +
			"gpus/r1      9       0               driver     570 on 5 of 9   r1-b (550), r1-d (551), r1-f (552), r1-h (553)   Observe\n" +
			"gpus/r2      2       0               <none>     no drift        <none>                                           Observe\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got := driftPools(tc.policies, tc.nodes, tc.invs, now)
			g.Expect(got).To(Equal(tc.want))
			for _, out := range []struct {
				wide bool
				want string
			}{{false, tc.table}, {true, tc.wide}} {
				if out.want == "" {
					continue
				}
				var b bytes.Buffer
				g.Expect(printDrift(&b, &FleetStatus{Drift: got}, out.wide)).To(Succeed())
				g.Expect(b.String()).To(Equal(out.want), "wide %t:\n%s", out.wide, b.String())
			}
		})
	}
}

// TestStatusWithoutInventoryAccess: a user whose role predates
// NodeInventories still gets the status, and learns why drift is missing.
func TestStatusWithoutInventoryAccess(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "status-without-inventories"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{gpuhealthv1alpha1.GroupVersion.Group}, Resources: []string{"nodehealths", "nodehealthevents", "remediationpolicies"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}
	g.Expect(env.Client.Create(ctx, role)).To(Succeed())
	g.Expect(env.Client.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
	bob, err := env.Environment.AddUser(envtest.User{Name: "bob"}, nil)
	g.Expect(err).NotTo(HaveOccurred())

	out, errOut, code := pluginAs(t, bob.Config(), "status")
	g.Expect(code).To(Equal(0), errOut)
	g.Expect(out).To(ContainSubstring("\nDrift unknown: you may not list nodeinventories (the chart's gpuhealth-view role grants it).\n"))
	g.Expect(out).To(ContainSubstring("FAILED NODE"), "the rest of the status is there")
}
