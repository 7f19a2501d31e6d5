package computedomain

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

func TestIsFabricFault(t *testing.T) {
	ev := func(check gpuhealthv1alpha1.Check, code string, sev gpuhealthv1alpha1.Severity, mutate func(*gpuhealthv1alpha1.NodeHealthEventStatus)) *gpuhealthv1alpha1.NodeHealthEvent {
		e := &gpuhealthv1alpha1.NodeHealthEvent{Spec: gpuhealthv1alpha1.NodeHealthEventSpec{Check: check, Code: code, Severity: sev}}
		if mutate != nil {
			mutate(&e.Status)
		}
		return e
	}
	fatal, degraded := gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.SeverityDegraded
	cases := []struct {
		name string
		ev   *gpuhealthv1alpha1.NodeHealthEvent
		want bool
	}{
		{name: "an IMEX domain DOWN is fabric-scoped", ev: ev(gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", fatal, nil), want: true},
		{name: "an IMEX domain DEGRADED is not", ev: ev(gpuhealthv1alpha1.CheckIMEXDomain, "DEGRADED", degraded, nil)},
		{name: "a fatal NVSwitch fault is fabric-scoped", ev: ev(gpuhealthv1alpha1.CheckNVSwitch, "DCGM_FR_NVSWITCH_FATAL_ERROR", fatal, nil), want: true},
		{name: "a fatal SXid is fabric-scoped", ev: ev(gpuhealthv1alpha1.CheckSXID, "20034", fatal, nil), want: true},
		{name: "fabric not COMPLETED is fabric-scoped", ev: ev(gpuhealthv1alpha1.CheckFabric, "NOT_STARTED", fatal, nil), want: true},
		{name: "fabric LIMITED_CAPACITY is a node matter", ev: ev(gpuhealthv1alpha1.CheckFabric, "LIMITED_CAPACITY", degraded, nil)},
		{name: "an XID is a node matter", ev: ev(gpuhealthv1alpha1.CheckXID, "79", fatal, nil)},
		{name: "an IMEX daemon not READY is a node matter", ev: ev(gpuhealthv1alpha1.CheckIMEXDaemon, "NOT_READY", fatal, nil)},
		{name: "a resolved fault no longer counts", ev: ev(gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", fatal, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved = true })},
		{name: "a fault the operator ignored does not count", ev: ev(gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", fatal, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Phase = gpuhealthv1alpha1.EventIgnored })},
		{name: "a superseded fault does not count", ev: ev(gpuhealthv1alpha1.CheckNVSwitch, "X", fatal, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Phase = gpuhealthv1alpha1.EventSuperseded })},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(IsFabricFault(tc.ev)).To(Equal(tc.want))
		})
	}
}

// startFabric runs the fabric controller in a real manager until the test ends.
func startFabric(t *testing.T, g *WithT) {
	t.Helper()
	startFabricWith(t, g, &FabricReconciler{})
}

// startFabricWith runs r, given its Client and Recorder, in a real manager.
func startFabricWith(t *testing.T, g *WithT, r *FabricReconciler) {
	t.Helper()
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{
		Scheme:     testScheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	r.Client, r.Recorder = mgr.GetClient(), mgr.GetEventRecorder("gpuhealth-test")
	// The operator registers these through controllers/index, which imports
	// this package; here the two this controller lists by.
	g.Expect(mgr.GetFieldIndexer().IndexField(ctx, &corev1.Node{}, gpuhealthv1alpha1.NodeCliqueField, NodeCliques)).To(Succeed())
	g.Expect(mgr.GetFieldIndexer().IndexField(ctx, &gpuhealthv1alpha1.NodeHealthEvent{}, gpuhealthv1alpha1.EventNodeNameField, func(o client.Object) []string {
		return []string{o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName}
	})).To(Succeed())
	g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		g.Expect(<-done).To(Succeed())
	})
}

// TestFabricFaultTaintsItsCliqueOnly: an IMEX domain DOWN on one member of
// clique A taints every node of clique A and no node of clique B (whose
// degraded fabric finding and non-member IMEX report are no rack fault); a taint
// someone else put on a node of A stays after recovery, and recovery
// removes exactly what gpuhealth added.
func TestFabricFaultTaintsItsCliqueOnly(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	label := "fabric-test"
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: label},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label}},
			// One member's report, known from its label, taints the clique.
			ComputeDomain: gpuhealthv1alpha1.ComputeDomainSpec{SingleReportTaintsClique: true},
		},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	cliqueA, cliqueB := "cluster-x.1", "cluster-x.2"
	var nodes []string
	for _, c := range []string{cliqueA, cliqueB} {
		for i := range 4 {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
				Name:   fmt.Sprintf("fab-%s-%d", strings.ReplaceAll(c, ".", "-"), i),
				Labels: map[string]string{"test": label, CliqueNodeLabel: c},
			}}
			if c == cliqueA && i == 1 {
				n.Labels[NodeLabel] = "domain-uid" // a ComputeDomain member runs IMEX
			}
			if c == cliqueA && i == 3 {
				// Someone else's taint, before any fault.
				n.Spec.Taints = []corev1.Taint{nodepkg.FabricTaint}
			}
			g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
			t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
			nodes = append(nodes, n.Name)
		}
	}
	// A node of clique A outside the policy is not ours to taint.
	unmanaged := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "fab-unmanaged", Labels: map[string]string{CliqueNodeLabel: cliqueA}}}
	g.Expect(k8sClient.Create(ctx, unmanaged)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), unmanaged) })

	startFabric(t, g)

	// A degraded fabric finding on clique B is a node matter: no taint.
	newFinding(ctx, t, g, nodes[5], gpuhealthv1alpha1.CheckFabric, "LIMITED_CAPACITY", gpuhealthv1alpha1.SeverityDegraded)
	// A stale IMEX report from a node of clique B that is no member: no taint.
	newFinding(ctx, t, g, nodes[4], gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", gpuhealthv1alpha1.SeverityFatal)
	// The IMEX domain of clique A goes DOWN.
	down := newFinding(ctx, t, g, nodes[1], gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", gpuhealthv1alpha1.SeverityFatal)

	tainted := func() map[string]string {
		out := map[string]string{}
		for _, name := range append(nodes, unmanaged.Name) {
			n := &corev1.Node{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, n)).To(Succeed())
			for _, tt := range n.Spec.Taints {
				if tt.Key == gpuhealthv1alpha1.FabricDegradedTaintKey {
					out[name] = n.Annotations[nodepkg.FabricAnnotation]
				}
			}
		}
		return out
	}
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(map[string]string{
		nodes[0]: cliqueA, nodes[1]: cliqueA, nodes[2]: cliqueA,
		nodes[3]: "", // tainted before, not by us
	}), "every managed node of clique A, none of clique B")
	g.Expect(testutil.ToFloat64(degradedCliques)).To(Equal(1.0))

	// The fault resolves: exactly our taints go.
	down.Status.Resolved = true
	down.Status.ResolvedAt = ptr.To(metav1.Now())
	g.Expect(k8sClient.Status().Update(ctx, down)).To(Succeed())
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(map[string]string{nodes[3]: ""}),
		"the taint that was there before stays")
	g.Expect(testutil.ToFloat64(degradedCliques)).To(BeZero())
}

// cliqueDirectory is the DRA driver's clique listing as a test sets it.
type cliqueDirectory map[string]string // node → clique ID

func (d cliqueDirectory) Listed(node string) []Listing {
	if c, ok := d[node]; ok {
		return []Listing{{DomainUID: "domain-uid", CliqueID: c, Trace: gpuhealthv1alpha1.TraceCliqueEntry, Status: "Ready"}}
	}
	return nil
}

func (d cliqueDirectory) CliqueMembers(clique string) []string {
	var out []string
	for n, c := range d {
		if c == clique {
			out = append(out, n)
		}
	}
	return out
}

// TestOneNodeCannotTaintARackItNames: with the default policy, a clique
// known from node labels alone is tainted only when two of its members
// report; a node's own label cannot put it in another rack when the
// driver's ComputeDomainCliques say where it is, and one report of a node
// the driver lists taints that clique.
func TestOneNodeCannotTaintARackItNames(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	label := "fabric-trust-test"
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: label},
		Spec:       gpuhealthv1alpha1.RemediationPolicySpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label}}},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	// rack: four nodes by label. liar: labelled as a member of rack, but the
	// driver lists it in another clique, driverClique.
	rack, driverClique := "cluster-z.1", "cluster-z.2"
	mk := func(name, clique string) string {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test": label, CliqueNodeLabel: clique}}}
		g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
		return name
	}
	var members []string
	for i := range 4 {
		members = append(members, mk(fmt.Sprintf("ft-rack-%d", i), rack))
	}
	liar, peer := mk("ft-liar", rack), mk("ft-peer", driverClique)
	startFabricWith(t, g, &FabricReconciler{Cliques: cliqueDirectory{liar: driverClique, peer: driverClique}})
	tainted := func() map[string]string {
		out := map[string]string{}
		for _, name := range append(slices.Clone(members), liar, peer) {
			n := &corev1.Node{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, n)).To(Succeed())
			if slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == gpuhealthv1alpha1.FabricDegradedTaintKey }) {
				out[name] = n.Annotations[nodepkg.FabricAnnotation]
			}
		}
		return out
	}
	// A GPU's fabric state, as the monitor's NVML source reports it.
	notStarted := func(node string) *gpuhealthv1alpha1.NodeHealthEvent {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckFabric, Code: "NOT_STARTED",
			Severity: gpuhealthv1alpha1.SeverityFatal, Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0"}, Message: "test",
		}
		return createFinding(ctx, t, g, spec)
	}

	// One member of rack reports, known by its label only: no taint.
	first := notStarted(members[0])
	g.Consistently(tainted, 2*time.Second, 100*time.Millisecond).Should(BeEmpty(), "one label-only report taints no rack")
	// The liar's report counts for the clique the driver lists it in, not
	// for rack: rack still has one reporter, driverClique has a confirmed one.
	notStarted(liar)
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(map[string]string{liar: driverClique, peer: driverClique}),
		"the driver's clique is tainted on one report; the rack the label names is not")
	g.Consistently(tainted, time.Second, 100*time.Millisecond).Should(HaveLen(2))
	// A second member of rack reports: now rack is tainted.
	notStarted(members[1])
	want := map[string]string{liar: driverClique, peer: driverClique}
	for _, m := range members {
		want[m] = rack
	}
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(want), "two members' reports taint their rack")
	// One of the two resolves: back to one label-only report, the taint goes.
	first.Status.Resolved = true
	first.Status.ResolvedAt = ptr.To(metav1.Now())
	g.Expect(k8sClient.Status().Update(ctx, first)).To(Succeed())
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(map[string]string{liar: driverClique, peer: driverClique}))
}

func newFinding(ctx context.Context, t *testing.T, g *WithT, node string, check gpuhealthv1alpha1.Check, code string, sev gpuhealthv1alpha1.Severity) *gpuhealthv1alpha1.NodeHealthEvent {
	t.Helper()
	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceIMEX, Check: check, Code: code, Severity: sev,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "domain"}, Message: "test",
	}
	return createFinding(ctx, t, g, spec)
}

// createFinding creates a finding with spec, seen once now.
func createFinding(ctx context.Context, t *testing.T, g *WithT, spec gpuhealthv1alpha1.NodeHealthEventSpec) *gpuhealthv1alpha1.NodeHealthEvent {
	t.Helper()
	ev := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
	g.Expect(k8sClient.Create(ctx, ev)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ev) })
	now := metav1.Now()
	ev.Status = gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &now, LastSeen: &now}
	g.Expect(k8sClient.Status().Update(ctx, ev)).To(Succeed())
	return ev
}
