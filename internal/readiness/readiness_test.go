package readiness_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

func TestNode(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	pressure := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue}
	cases := []struct {
		name       string
		conditions []corev1.NodeCondition
		wantReady  bool
		wantStatus corev1.ConditionStatus
	}{
		{name: "a node whose Ready condition is True is Ready", conditions: []corev1.NodeCondition{pressure, {Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: t0}}, wantReady: true, wantStatus: corev1.ConditionTrue},
		{name: "a node reported NotReady is not Ready", conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: t0}}, wantStatus: corev1.ConditionFalse},
		{name: "a node whose kubelet stopped posting is not Ready", conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: t0}}, wantStatus: corev1.ConditionUnknown},
		{name: "a node the kubelet never reported on has no Ready condition", conditions: []corev1.NodeCondition{pressure}},
		{name: "a node without conditions is not Ready", conditions: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			n := &corev1.Node{Status: corev1.NodeStatus{Conditions: tc.conditions}}
			g.Expect(readiness.Node(n)).To(Equal(tc.wantReady))
			c := readiness.NodeCondition(n)
			if tc.wantStatus == "" {
				g.Expect(c).To(BeNil())
				return
			}
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tc.wantStatus))
			g.Expect(c.LastTransitionTime).To(Equal(t0))
		})
	}
}

func TestPod(t *testing.T) {
	scheduled := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}
	cases := []struct {
		name       string
		conditions []corev1.PodCondition
		want       bool
	}{
		{name: "a pod whose Ready condition is True is Ready", conditions: []corev1.PodCondition{scheduled, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}, want: true},
		{name: "a pod failing its readiness probe is not Ready", conditions: []corev1.PodCondition{scheduled, {Type: corev1.PodReady, Status: corev1.ConditionFalse}}},
		{name: "a pod that has not started has no Ready condition", conditions: []corev1.PodCondition{scheduled}},
		{name: "a pod without conditions is not Ready", conditions: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(readiness.Pod(&corev1.Pod{Status: corev1.PodStatus{Conditions: tc.conditions}})).To(Equal(tc.want))
		})
	}
}
