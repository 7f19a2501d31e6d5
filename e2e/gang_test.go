//go:build e2e

package e2e

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// rank is one pod of a multi-node job on node, asking for one GPU, marked
// as its gang's kind marks it.
func rank(ns, name, node string, labels map[string]string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	gpu := corev1.ResourceList{framework.GPUResource: resource.MustParse("1")}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "train", Image: "trainer:fake", Command: []string{"torchrun", "train.py"},
				Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu}}},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

// podsLeft lists the pods of ns not terminating, by name.
func podsLeft(g Gomega, ns string) []string {
	var list corev1.PodList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// testGangDrainStopsTheJob: three multi-node jobs have a rank on
// gpu-node-1 when an XID 79 takes it out. Under drain.gangs Gang, the
// JobSet-shaped job of four ranks on gpu-node-0 to -3 and the core
// scheduling.k8s.io/v1beta1 PodGroup of two (placed by the real
// scheduler's gang scheduling) are stopped whole, each in one wave; the
// namespace whose entry says Pods loses only its rank on gpu-node-1, as
// before. Only gpu-node-1 is quarantined: its peers stay Healthy and
// schedulable, and its NodeHealth and the JobSet's Events name the gangs.
func testGangDrainStopsTheJob(t *testing.T) {
	g := NewWithT(t)
	const (
		gangNS, podsNS, groupNS = "gang-jobset", "gang-pods", "gang-podgroup"
		faulty                  = "gpu-node-1"
	)
	nodes := []string{"gpu-node-0", faulty, "gpu-node-2", "gpu-node-3"}
	for _, n := range nodes {
		g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	}
	patchPolicy(t, `{"spec":{"drain":{"gangs":"Gang","gangGracePeriod":"2m","namespaces":[{"namespace":"`+podsNS+`","mode":"Evict","gangs":"Pods"}]}}}`)
	defer patchPolicy(t, `{"spec":{"drain":{"gangs":null,"gangGracePeriod":null,"namespaces":[`+
		`{"namespace":"batch-jobs","mode":"WaitForCompletion","timeout":"4h"},`+
		`{"namespaceSelector":{"matchLabels":{"gpuhealth.dev/drain":"delete-after-timeout"}},"mode":"DeleteAfterTimeout"}]}}}`)
	for _, ns := range []string{gangNS, podsNS, groupNS} {
		g.Expect(env.Cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		defer func() { _ = env.Cluster.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}) }()
	}
	for _, ns := range []string{gangNS, podsNS} {
		for i, n := range nodes {
			labels := map[string]string{"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "0",
				"jobset.sigs.k8s.io/jobset-uid": "8a9f0c52-uid-" + ns}
			g.Expect(env.Cluster.Client.Create(ctx, rank(ns, fmt.Sprintf("llama-node-%d", i), n, labels))).To(Succeed())
		}
	}
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: groupNS, Name: "pg"},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}}},
	}
	g.Expect(env.Cluster.Client.Create(ctx, pg)).To(Succeed())
	for i, n := range nodes[:2] {
		g.Expect(env.Cluster.Client.Create(ctx, rank(groupNS, fmt.Sprintf("pg-%d", i), n, nil, func(p *corev1.Pod) {
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("pg")}
		}))).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		var list corev1.PodList
		for _, ns := range []string{gangNS, podsNS, groupNS} {
			g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			for _, p := range list.Items {
				g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning), "%s/%s", ns, p.Name)
			}
		}
	}).Should(Succeed(), "every rank scheduled and running, the PodGroup's by gang scheduling")

	injectXID(t, faulty, 2, 79)
	g.Eventually(func(g Gomega) []gpuhealthv1alpha1.GangWave {
		ds := nodeHealth(g, faulty).Status.Drain
		g.Expect(ds).NotTo(BeNil())
		return ds.Gangs
	}).Should(ConsistOf(
		MatchFields(IgnoreExtras, Fields{"Kind": Equal("JobSet"), "Namespace": Equal(gangNS), "Name": Equal("llama"), "Owner": Equal("JobSet llama"),
			"Size": BeEquivalentTo(4), "SpannedNodes": BeEquivalentTo(4), "Nodes": Equal(nodes), "EvictedAt": Not(BeNil())}),
		MatchFields(IgnoreExtras, Fields{"Kind": Equal("PodGroup"), "Namespace": Equal(groupNS), "Name": Equal("pg"), "Owner": Equal("PodGroup pg"),
			"Size": BeEquivalentTo(2), "SpannedNodes": BeEquivalentTo(2), "EvictedAt": Not(BeNil())}),
	), "one wave per gang, and none in the Pods namespace")
	g.Eventually(func(g Gomega) []string { return podsLeft(g, gangNS) }).Should(BeEmpty(), "every rank of the JobSet stopped")
	g.Eventually(func(g Gomega) []string { return podsLeft(g, groupNS) }).Should(BeEmpty(), "both ranks of the PodGroup stopped")
	g.Eventually(func(g Gomega) []string { return podsLeft(g, podsNS) }).Should(ConsistOf("llama-node-0", "llama-node-2", "llama-node-3"),
		"Pods mode: only the rank on the faulty node")
	for _, n := range []string{"gpu-node-0", "gpu-node-2", "gpu-node-3"} {
		g.Expect(phase(n)(g)).To(Equal(gpuhealthv1alpha1.PhaseHealthy), "a peer of the gang is no fault")
		g.Expect(node(g, n).Spec.Unschedulable).To(BeFalse())
	}
	g.Eventually(func(g Gomega) []string {
		var list eventsv1.EventList
		g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(gangNS))).To(Succeed())
		var notes []string
		for _, e := range list.Items {
			if e.Reason == gpuhealthv1alpha1.ReasonGangStopped && e.Regarding.Kind == "JobSet" && e.Regarding.Name == "llama" {
				notes = append(notes, e.Note)
			}
		}
		return notes
	}).Should(ContainElement(ContainSubstring("node "+faulty)), "the JobSet is told why it was stopped")
	// gpu-node-1's return overlaps the next cases (each waits for the
	// nodes it uses to be Healthy).
}
