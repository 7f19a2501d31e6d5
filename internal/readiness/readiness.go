package readiness

import (
	corev1 "k8s.io/api/core/v1"
)

// Node says whether the node's Ready condition is True. The kubelet posts
// the condition, and the node lifecycle controller turns it Unknown when
// the kubelet stops posting for node-monitor-grace-period; a node without
// the condition (the kubelet never reported) is not Ready.
// https://kubernetes.io/docs/reference/node/node-status/#condition
func Node(n *corev1.Node) bool {
	c := NodeCondition(n)
	return c != nil && c.Status == corev1.ConditionTrue
}

// NodeCondition returns the node's Ready condition, nil when the node has
// none, for a caller that needs its status or when it last changed. It
// points into n's conditions: writing through it changes n.
func NodeCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// Pod says whether the pod's Ready condition is True: the kubelet sets it
// when every container passes its readiness probe and every readiness gate
// is True, and a Ready pod counts as healthy for its PodDisruptionBudget
// and as an endpoint for its Services. A pod without the condition (not
// yet started) is not Ready.
// https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions
func Pod(p *corev1.Pod) bool {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			return p.Status.Conditions[i].Status == corev1.ConditionTrue
		}
	}
	return false
}
