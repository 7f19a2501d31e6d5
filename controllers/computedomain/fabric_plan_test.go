package computedomain

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// TestPlanClique checks the pure plan of a clique: when it is degraded,
// which certification action it takes, and which nodes gain or lose the
// taint.
func TestPlanClique(t *testing.T) {
	node := func(name, label, taintedBy string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
		if label != "" {
			n.Labels[CliqueNodeLabel] = label
		}
		if taintedBy != "" {
			n.Annotations[nodepkg.FabricAnnotation] = taintedBy
		}
		return n
	}
	spec := &gpuhealthv1alpha1.CliqueCertificationSpec{}
	byDriver := func(node string) fabricFault { return fabricFault{node: node, what: "IMEXDomain DOWN", byDriver: true} }
	byLabel := func(node, what string) fabricFault { return fabricFault{node: node, what: what} }
	cases := []struct {
		name        string
		c           clique
		hold        bool
		degraded    bool
		unconfirmed bool
		cert        certAction
		add         []string
		lift        []string
	}{{
		name: "a fault taints every eligible member, not an ineligible one or a node of another clique",
		c: clique{name: "c1", faults: []fabricFault{byDriver("a")},
			nodes:    []corev1.Node{node("a", "c1", ""), node("b", "c1", ""), node("dry", "c1", ""), node("moved", "c2", "")},
			eligible: map[string]bool{"a": true, "b": true}},
		degraded: true, cert: certNone, add: []string{"a", "b"},
	}, {
		name: "a node that moved away keeps no taint of this clique",
		c: clique{name: "c1", faults: []fabricFault{byDriver("a")}, certSpec: spec,
			nodes:    []corev1.Node{node("a", "c1", "c1"), node("moved", "c2", "c1")},
			eligible: map[string]bool{"a": true}},
		degraded: true, cert: certStopEpisode, add: []string{"a"}, lift: []string{"moved"},
	}, {
		name: "one member's report, its clique known from its own label only: not enough to taint",
		c: clique{name: "c1", faults: []fabricFault{byLabel("a", "Fabric NOT_STARTED"), byLabel("a", "NVSwitch FATAL")},
			nodes:    []corev1.Node{node("a", "c1", ""), node("b", "c1", "")},
			eligible: map[string]bool{"a": true, "b": true}},
		unconfirmed: true, cert: certNone,
	}, {
		name: "two members report from their labels: the clique is tainted",
		c: clique{name: "c1", faults: []fabricFault{byLabel("a", "Fabric NOT_STARTED"), byLabel("b", "Fabric NOT_STARTED")},
			nodes:    []corev1.Node{node("a", "c1", ""), node("b", "c1", ""), node("c", "c1", "")},
			eligible: map[string]bool{"a": true, "b": true, "c": true}},
		degraded: true, cert: certNone, add: []string{"a", "b", "c"},
	}, {
		name: "one label-only report where the policy says one suffices",
		c: clique{name: "c1", faults: []fabricFault{byLabel("a", "Fabric NOT_STARTED")}, singleReport: true,
			nodes:    []corev1.Node{node("a", "c1", ""), node("b", "c1", "")},
			eligible: map[string]bool{"a": true, "b": true}},
		degraded: true, cert: certNone, add: []string{"a", "b"},
	}, {
		name: "an unconfirmed report lifts a taint from an earlier episode",
		c: clique{name: "c1", faults: []fabricFault{byLabel("a", "Fabric NOT_STARTED")},
			nodes:    []corev1.Node{node("a", "c1", "c1"), node("b", "c1", "c1")},
			eligible: map[string]bool{"a": true, "b": true}},
		unconfirmed: true, cert: certStopAll, lift: []string{"a", "b"},
	}, {
		name: "resolved without a certification: the taint goes",
		c: clique{name: "c1", nodes: []corev1.Node{node("a", "c1", "c1"), node("b", "c1", "")},
			eligible: map[string]bool{"a": true, "b": true}},
		cert: certStopAll, lift: []string{"a"},
	}, {
		name: "resolved with a certification that holds: the taint stays",
		c: clique{name: "c1", certSpec: spec, nodes: []corev1.Node{node("a", "c1", "c1")},
			eligible: map[string]bool{"a": true}},
		hold: true, cert: certRun,
	}, {
		name: "resolved with a certification that passed: the taint goes",
		c: clique{name: "c1", certSpec: spec, nodes: []corev1.Node{node("a", "c1", "c1")},
			eligible: map[string]bool{"a": true}},
		cert: certRun, lift: []string{"a"},
	}, {
		name: "healthy and untainted: nothing to do",
		c:    clique{name: "c1", certSpec: spec, nodes: []corev1.Node{node("a", "c1", "")}, eligible: map[string]bool{"a": true}},
		cert: certNone,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := planClique(&tc.c)
			g.Expect(p.degraded).To(Equal(tc.degraded))
			g.Expect(p.unconfirmed).To(Equal(tc.unconfirmed))
			g.Expect(p.cert).To(Equal(tc.cert))
			var add, lift []string
			for _, ch := range planTaints(&tc.c, p.degraded, tc.hold) {
				if ch.add {
					add = append(add, ch.node.Name)
				} else {
					lift = append(lift, ch.node.Name)
				}
			}
			g.Expect(add).To(Equal(tc.add))
			g.Expect(lift).To(Equal(tc.lift))
		})
	}
}
