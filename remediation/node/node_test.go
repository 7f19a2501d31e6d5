package node

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAppliedAndPreexisting(t *testing.T) {
	taint := &corev1.Taint{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}
	node := func(unschedulable bool, applied string, taints ...corev1.Taint) *corev1.Node {
		n := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: unschedulable, Taints: taints}}
		if applied != "-" {
			n.ObjectMeta = metav1.ObjectMeta{Annotations: map[string]string{AppliedAnnotation: applied}}
		}
		return n
	}
	cases := []struct {
		name           string
		node           *corev1.Node
		wantApplied    Applied
		wantPreCordon  bool
		wantPreTaints  int
		wantUncordoned bool
	}{
		{name: "a fresh node has nothing of ours or anyone's", node: node(false, "-")},
		{name: "a human's cordon is preexisting", node: node(true, "-"), wantPreCordon: true},
		{name: "our cordon is not preexisting", node: node(true, "cordon,taint=gpuhealth.dev/quarantined:NoSchedule", *taint), wantApplied: Applied{Cordon: true, Taints: []corev1.Taint{*taint}}},
		{name: "an earlier operator's bare taint record stands for the policy's taint", node: node(true, "cordon,taint", *taint), wantApplied: Applied{Cordon: true, PolicyTaint: true}},
		{name: "a taint the node had before, under a key we once added another effect of", node: node(false, "taint=gpuhealth.dev/quarantined:NoExecute", *taint),
			wantApplied: Applied{Taints: []corev1.Taint{{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoExecute}}}, wantPreTaints: 1},
		{name: "a human's identical taint is preexisting", node: node(false, "cordon", *taint), wantApplied: Applied{Cordon: true}, wantPreTaints: 1, wantUncordoned: true},
		{name: "a human uncordoned our cordon", node: node(false, "cordon,taint=gpuhealth.dev/quarantined:NoSchedule", *taint), wantApplied: Applied{Cordon: true, Taints: []corev1.Taint{*taint}}, wantUncordoned: true},
		{name: "unknown words in the annotation are ignored", node: node(true, "taint=gpuhealth.dev/quarantined:NoSchedule,reboot,taint=nocolon", *taint), wantApplied: Applied{Taints: []corev1.Taint{*taint}}, wantPreCordon: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(AppliedOn(tc.node)).To(Equal(tc.wantApplied))
			pre := PreexistingOn(tc.node, taint)
			g.Expect(pre.Cordon).To(Equal(tc.wantPreCordon))
			g.Expect(pre.Taints).To(HaveLen(tc.wantPreTaints))
			g.Expect(HumanUncordoned(tc.node)).To(Equal(tc.wantUncordoned))
		})
	}
	a := Applied{Cordon: true, Taints: []corev1.Taint{*taint, {Key: "example.com/old", Effect: corev1.TaintEffectNoExecute}}}
	NewWithT(t).Expect(a.String()).To(Equal("cordon,taint=gpuhealth.dev/quarantined:NoSchedule,taint=example.com/old:NoExecute"))
	NewWithT(t).Expect(AppliedOn(node(true, a.String()))).To(Equal(a), "what is written reads back")
}
