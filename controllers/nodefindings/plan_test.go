package nodefindings

import (
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

var now = metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))

func policy(mut func(*gpuhealthv1alpha1.RemediationPolicySpec)) *gpuhealthv1alpha1.RemediationPolicy {
	p := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}}
	if mut != nil {
		mut(&p.Spec)
	}
	return p
}

func node(name, product string, conds ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{ProductLabel: product}},
		Status:     corev1.NodeStatus{Conditions: conds},
	}
}

// inventory is a report of n GPUs with driver and VBIOS; mut changes it.
func inventory(name string, n int, driver, vbios string, mut func(*gpuhealthv1alpha1.NodeInventorySpec)) *gpuhealthv1alpha1.NodeInventory {
	s := gpuhealthv1alpha1.NodeInventorySpec{NodeName: name, Driver: gpuhealthv1alpha1.DriverInventory{Version: driver, CUDAVersion: "12.8"}, GPUCount: ptr.To(int32(n))}
	for i := range n {
		s.GPUs = append(s.GPUs, gpuhealthv1alpha1.GPUInventory{Index: int32(i), Product: "NVIDIA H200", VBIOS: vbios, ECC: "Enabled", MIG: "Disabled"})
	}
	s.PCI.GPUs = int32(n)
	if mut != nil {
		mut(&s)
	}
	return &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: s}
}

func keys(w wanted) []string {
	var out []string
	for _, f := range w.open {
		out = append(out, f.spec.NodeName+"/"+string(f.spec.Check)+"/"+f.spec.Code+"/"+string(f.spec.Severity))
	}
	sort.Strings(out)
	return out
}

func TestPlanDrift(t *testing.T) {
	drift := policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Drift = &gpuhealthv1alpha1.DriftSpec{} })
	quarantine := policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Drift = &gpuhealthv1alpha1.DriftSpec{Verdict: gpuhealthv1alpha1.VerdictQuarantine, Properties: []gpuhealthv1alpha1.DriftProperty{"driver"}}
	})
	pool := func(p *gpuhealthv1alpha1.RemediationPolicy, drivers ...string) []nodeInput {
		var out []nodeInput
		for i, d := range drivers {
			name := string(rune('a' + i))
			out = append(out, nodeInput{node: node(name, "H200"), policy: p, inventory: inventory(name, 8, d, "96.00.74", nil)})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		in    []nodeInput
		want  []string
		table []Drift
	}{{
		name:  "the one node of four with another driver drifts, Degraded by default",
		in:    pool(drift, "570.133.20", "570.133.20", "570.86.15", "570.133.20"),
		want:  []string{"c/Drift/driver/Degraded"},
		table: []Drift{{Node: "c", Pool: "gpus/H200", Property: "driver", Value: "570.86.15", Majority: "570.133.20", Agree: 3, Reporting: 4}},
	}, {
		name: "a tie is no majority: nothing drifts",
		in:   pool(drift, "570.133.20", "570.133.20", "570.86.15", "570.86.15"),
	}, {
		name: "fewer nodes than minPoolSize: nothing to drift from",
		in:   pool(drift, "570.133.20", "570.86.15"),
	}, {
		name: "without drift in the policy nothing drifts",
		in:   pool(policy(nil), "570.133.20", "570.133.20", "570.86.15"),
	}, {
		name:  "verdict Quarantine makes the finding Fatal; only the listed properties are compared",
		in:    append(pool(quarantine, "570.133.20", "570.133.20", "570.86.15"), nodeInput{node: node("z", "H200"), policy: quarantine, inventory: inventory("z", 8, "570.133.20", "OTHER", nil)}),
		want:  []string{"c/Drift/driver/Fatal"},
		table: []Drift{{Node: "c", Pool: "gpus/H200", Property: "driver", Value: "570.86.15", Majority: "570.133.20", Agree: 3, Reporting: 4}},
	}, {
		name: "pools are apart: one H100 among H200s is not drift",
		in: append(pool(drift, "570.133.20", "570.133.20", "570.133.20"),
			nodeInput{node: node("h100", "H100"), policy: drift, inventory: inventory("h100", 8, "550.54.15", "96.00.74", nil)}),
	}, {
		name: "a node without a report, or NVML unavailable, does not drift",
		in: append(pool(drift, "570.133.20", "570.133.20", "570.133.20"),
			nodeInput{node: node("noreport", "H200"), policy: drift},
			nodeInput{node: node("nonvml", "H200"), policy: drift, inventory: &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: "nonvml"}, Spec: gpuhealthv1alpha1.NodeInventorySpec{NodeName: "nonvml"}}}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			w := plan(tc.in)
			g.Expect(keys(w)).To(Equal(tc.want))
			g.Expect(w.drifts).To(Equal(tc.table))
		})
	}
}

func TestPoolDrift(t *testing.T) {
	members := func(drivers ...string) []PoolMember {
		var out []PoolMember
		for i, d := range drivers {
			props := map[gpuhealthv1alpha1.DriftProperty]string{"cudaDriver": "12.8"}
			if d != "" {
				props["driver"] = d
			}
			out = append(out, PoolMember{Node: string(rune('a' + i)), Properties: props})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		members []PoolMember
		spec    *gpuhealthv1alpha1.DriftSpec
		want    []Drift
	}{{
		name:    "without a spec every property is compared, among at least three nodes",
		members: members("570.133.20", "570.86.15", "570.133.20"),
		want:    []Drift{{Node: "b", Pool: "p", Property: "driver", Value: "570.86.15", Majority: "570.133.20", Agree: 2, Reporting: 3}},
	}, {
		name:    "a node that does not report the property is neither counted nor drifts",
		members: members("570.133.20", "", "570.86.15", "570.133.20"),
		want:    []Drift{{Node: "c", Pool: "p", Property: "driver", Value: "570.86.15", Majority: "570.133.20", Agree: 2, Reporting: 3}},
	}, {
		name:    "half is no majority",
		members: members("570.133.20", "570.86.15", "570.133.20", "570.86.15"),
	}, {
		name:    "fewer reporting than minPoolSize",
		members: members("570.133.20", "570.86.15", "570.133.20"),
		spec:    &gpuhealthv1alpha1.DriftSpec{MinPoolSize: 4},
	}, {
		name:    "only the spec's properties are compared",
		members: members("570.133.20", "570.86.15", "570.133.20"),
		spec:    &gpuhealthv1alpha1.DriftSpec{Properties: []gpuhealthv1alpha1.DriftProperty{"cudaDriver"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(PoolDrift("p", tc.members, tc.spec)).To(Equal(tc.want))
		})
	}
}

func TestProperties(t *testing.T) {
	g := NewWithT(t)
	inv := inventory("n", 2, "570.133.20", "96.00.74", func(s *gpuhealthv1alpha1.NodeInventorySpec) {
		s.GPUs[1].VBIOS = "96.00.61"
		s.GPUs[0].PowerLimitWatts, s.GPUs[1].PowerLimitWatts = 700, 700
		s.Services = []gpuhealthv1alpha1.ServiceInventory{{Name: "nvidia-fabricmanager", Installed: true, Running: true, Version: "570.133.20-1"}, {Name: "nvidia-imex"}}
		s.NICs = []gpuhealthv1alpha1.NICInventory{
			{Device: "mlx5_0", Port: 1, Firmware: "28.39.1002", Rate: "400 Gb/sec (4X NDR)", Up: true, Compute: true},
			{Device: "mlx5_1", Port: 1, Firmware: "28.39.1002", Rate: "200 Gb/sec (4X HDR)", Up: true, Compute: true},
			{Device: "mlx5_2", Port: 1, Firmware: "28.39.1002", Compute: true},                        // down: no rate
			{Device: "mlx5_9", Port: 1, Firmware: "22.41.1000", Rate: "25 Gb/sec (1X EDR)", Up: true}, // management
		}
	})
	g.Expect(Properties(&inv.Spec)).To(Equal(map[gpuhealthv1alpha1.DriftProperty]string{
		"driver": "570.133.20", "cudaDriver": "12.8", "vbios": "96.00.61, 96.00.74", "ecc": "Enabled", "mig": "Disabled",
		"product": "NVIDIA H200", "powerLimit": "700 W", "fabricManager": "570.133.20-1",
		"nicFirmware": "28.39.1002", "nicRate": "200 Gb/sec (4X HDR), 400 Gb/sec (4X NDR)",
	}), "a GPU or NIC property is the node's distinct values (compute ports only, rates of those up); what is not reported is absent")
}

func TestPlanConditions(t *testing.T) {
	p := policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Conditions = []gpuhealthv1alpha1.NodeConditionRule{
			{Type: "ReadonlyFilesystem", Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionRebootNode},
			{Type: "KernelDeadlock", Status: corev1.ConditionTrue},
			{Type: "NetworkReady", Status: corev1.ConditionFalse, Verdict: gpuhealthv1alpha1.VerdictObserve},
			// The schema refuses it; the planner does not depend on that.
			{Type: ownCondition, Status: corev1.ConditionFalse, Verdict: gpuhealthv1alpha1.VerdictQuarantine},
		}
	})
	n := node("n", "H200",
		corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "FilesystemIsReadOnly", Message: "/dev/sda1 remounted read-only"},
		corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse},
		corev1.NodeCondition{Type: "NetworkReady", Status: corev1.ConditionFalse, Reason: "NoRoute"},
		corev1.NodeCondition{Type: ownCondition, Status: corev1.ConditionFalse},
	)
	g := NewWithT(t)
	w := plan([]nodeInput{{node: n, policy: p}, {node: node("unmanaged", "H200", n.Status.Conditions...)}})
	g.Expect(keys(w)).To(Equal([]string{"n/NodeCondition/NetworkReady/Degraded", "n/NodeCondition/ReadonlyFilesystem/Fatal"}))
	ro := w.open[gpuhealthv1alpha1.EventName("n", gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, "", "ReadonlyFilesystem")]
	g.Expect(ro.spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
	g.Expect(ro.spec.Message).To(Equal("Node condition ReadonlyFilesystem is True: FilesystemIsReadOnly: /dev/sda1 remounted read-only"))
}

func TestPlanGPUCount(t *testing.T) {
	gc := policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.GPUCount = &gpuhealthv1alpha1.GPUCountSpec{Expected: []gpuhealthv1alpha1.ExpectedGPUs{{Product: "H200", Count: 8}}}
	})
	withGPUs := func(n *corev1.Node, capacity, alloc int64) *corev1.Node {
		n.Status.Capacity = corev1.ResourceList{GPUResource: *resource.NewQuantity(capacity, resource.DecimalSI)}
		n.Status.Allocatable = corev1.ResourceList{GPUResource: *resource.NewQuantity(alloc, resource.DecimalSI)}
		return n
	}
	for _, tc := range []struct {
		name string
		in   nodeInput
		want []string
	}{{
		name: "all eight everywhere: nothing",
		in:   nodeInput{node: withGPUs(node("n", "H200"), 8, 8), policy: gc, inventory: inventory("n", 8, "570", "v", nil), sliceGPUs: ptr.To(8)},
	}, {
		name: "NVML lists 7 of the policy's 8: Fatal; the scheduler sees 7 too: observed",
		in:   nodeInput{node: withGPUs(node("n", "H200"), 7, 7), policy: gc, inventory: inventory("n", 7, "570", "v", nil), sliceGPUs: ptr.To(7)},
		want: []string{"n/GPUMissing/Allocatable/Degraded", "n/GPUMissing/Expected/Fatal", "n/GPUMissing/ResourceSlice/Degraded"},
	}, {
		name: "the device plugin hides one GPU: only the scheduler's view is short",
		in:   nodeInput{node: withGPUs(node("n", "H200"), 8, 7), policy: gc, inventory: inventory("n", 8, "570", "v", nil)},
		want: []string{"n/GPUMissing/Allocatable/Degraded"},
	}, {
		name: "a product the policy does not list is held to its PCI bus",
		in:   nodeInput{node: withGPUs(node("n", "B200"), 8, 6), policy: gc, inventory: inventory("n", 8, "570", "v", func(s *gpuhealthv1alpha1.NodeInventorySpec) { s.PCI.GPUs = 8 })},
		want: []string{"n/GPUMissing/Allocatable/Degraded"},
	}, {
		name: "with MIG on, allocatable is not whole GPUs: not compared",
		in: nodeInput{node: withGPUs(node("n", "H200"), 8, 0), policy: gc, inventory: inventory("n", 8, "570", "v", func(s *gpuhealthv1alpha1.NodeInventorySpec) {
			for i := range s.GPUs {
				s.GPUs[i].MIG = "Enabled"
			}
		})},
	}, {
		name: "without gpuCount in the policy nothing is compared",
		in:   nodeInput{node: withGPUs(node("n", "H200"), 8, 2), policy: policy(nil), inventory: inventory("n", 2, "570", "v", nil)},
	}, {
		name: "the label is the last word when nothing else says",
		in: nodeInput{node: func() *corev1.Node {
			n := withGPUs(node("n", "B200"), 4, 3)
			n.Labels[CountLabel] = "4"
			return n
		}(), policy: gc},
		want: []string{"n/GPUMissing/Allocatable/Degraded"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(keys(plan([]nodeInput{tc.in}))).To(Equal(tc.want))
		})
	}
}

func TestDiff(t *testing.T) {
	spec := nodeSpec("n", gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, "KernelDeadlock")
	spec.Severity = gpuhealthv1alpha1.SeverityDegraded
	want := wanted{open: map[string]finding{spec.EventName(): {spec: spec}}}
	existing := func(set func(*gpuhealthv1alpha1.NodeHealthEventStatus)) []gpuhealthv1alpha1.NodeHealthEvent {
		ev := gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec, Status: gpuhealthv1alpha1.NodeHealthEventStatus{Count: 2, FirstSeen: &now, LastSeen: &now}}
		if set != nil {
			set(&ev.Status)
		}
		return []gpuhealthv1alpha1.NodeHealthEvent{ev}
	}
	earlier := metav1.NewTime(now.Add(-time.Hour))
	later := metav1.NewTime(now.Add(time.Hour))
	monitors := existing(nil)
	monitors[0].Spec.Source = gpuhealthv1alpha1.SourceNVML
	g := NewWithT(t)

	c := diff(want, nil, later)
	g.Expect(c).To(HaveLen(1))
	g.Expect(c[0].create.Name).To(Equal(spec.EventName()))
	g.Expect(c[0].status).To(Equal(gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &later, LastSeen: &later}))

	g.Expect(diff(want, existing(nil), later)).To(BeEmpty(), "open and wanted: nothing to write")

	c = diff(wanted{}, existing(nil), later)
	g.Expect(c).To(HaveLen(1))
	g.Expect(c[0].resolved).To(BeTrue())
	g.Expect(c[0].status.Resolved).To(BeTrue())
	g.Expect(c[0].status.ResolvedAt).To(Equal(&later))

	g.Expect(diff(wanted{}, existing(func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved, s.ResolvedAt = true, &now }), later)).To(BeEmpty())

	c = diff(want, existing(func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved, s.ResolvedAt = true, &now }), later)
	g.Expect(c).To(HaveLen(1))
	g.Expect(c[0].opened).To(BeTrue())
	g.Expect(c[0].status.Resolved).To(BeFalse())
	g.Expect(c[0].status.ResolvedAt).To(BeNil())
	g.Expect(c[0].status.Count).To(Equal(int64(3)), "holding again is one more occurrence")
	g.Expect(c[0].status.LastSeen).To(Equal(&later))

	c = diff(want, existing(func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen, s.SupersededAt = &earlier, &now }), later)
	g.Expect(c).To(HaveLen(1), "a recertification closed it, it still holds: it opens again")
	g.Expect(c[0].status.LastSeen).To(Equal(&later))

	g.Expect(diff(wanted{}, monitors, later)).To(BeEmpty(), "a monitor's finding is never the operator's to resolve")

	c = diff(want, existing(func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { *s = gpuhealthv1alpha1.NodeHealthEventStatus{} }), later)
	g.Expect(c).To(HaveLen(1), "created, its first status lost: written now")
	g.Expect(c[0].status).To(Equal(gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &later, LastSeen: &later}))
}
