package member

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete

// OutOfServiceTaint is the standard taint an administrator (or a fencing
// agent) puts on a node known to be shut down; with it Kubernetes
// force-deletes the node's pods and detaches its volumes.
// https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#non-graceful-node-shutdown
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// NotReadySince returns when the node's Ready condition last turned False
// or Unknown, and false when it is Ready or has no Ready condition (a node
// the kubelet never reported on is not known to be dead).
func NotReadySince(n *corev1.Node) (time.Time, bool) {
	c := readiness.NodeCondition(n)
	if c == nil || c.Status == corev1.ConditionTrue {
		return time.Time{}, false
	}
	return c.LastTransitionTime.Time, true
}

// OutOfService says whether the node carries the out-of-service taint.
func OutOfService(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfServiceTaint {
			return true
		}
	}
	return false
}

// DeleteStalePod deletes a daemon pod object of a dead node at once (grace
// period 0): the node's kubelet is gone and would never confirm a graceful
// deletion, and while the object exists the DRA driver keeps the node in
// its clique, so the surviving IMEX daemons keep a dead peer. The UID
// precondition makes sure a replacement pod with the same name is never
// deleted by mistake. It refuses a pod on a Ready node: the caller checks,
// and this is the last line of that rule.
func DeleteStalePod(ctx context.Context, c client.Client, n *corev1.Node, pod *corev1.Pod) error {
	if readiness.Node(n) {
		return fmt.Errorf("refusing to delete pod %s/%s: node %s is Ready", pod.Namespace, pod.Name, n.Name)
	}
	if pod.Spec.NodeName != n.Name {
		return fmt.Errorf("refusing to delete pod %s/%s: it runs on %s, not %s", pod.Namespace, pod.Name, pod.Spec.NodeName, n.Name)
	}
	err := c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(pod.UID)})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting stale daemon pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// RemoveLabel removes label key from a node that is not Ready, with an
// optimistic lock on the node's resourceVersion: a node that changed since
// it was read (it came back, or was relabelled) is left alone and the next
// reconcile looks again. n is updated in place on success.
func RemoveLabel(ctx context.Context, c client.Client, n *corev1.Node, key string) error {
	if readiness.Node(n) {
		return fmt.Errorf("refusing to remove label %s from node %s: it is Ready", key, n.Name)
	}
	if _, ok := n.Labels[key]; !ok {
		return nil
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(n.Labels, key)
	if err := c.Patch(ctx, n, patch); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing label %s from node %s: %w", key, n.Name, err)
	}
	return nil
}
