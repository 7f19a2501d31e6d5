// Package cachetrim says what the operator's informer cache holds: every
// object without its managedFields, and Pods, Nodes and NodeHealths cut
// down to the fields some controller reads. The composition root passes
// CacheOptions to the manager; the tests that run a manager pass the same.
//
// What is kept is what the code reads, found by reading it:
//
//   - Pods: only the ComputeDomain daemon pods (those labelled with the
//     domain, in the DRA driver's namespace; the drain lists and watches a
//     node's pods on the apiserver, so that the 50,000 pods of a 5,000-node
//     cluster stay out of memory, and a tenant's pod that carries the label
//     is not even cached: computedomain.IsDaemonPod judges the rest):
//     name, namespace, UID, resourceVersion, labels (the Job
//     kind, the ComputeDomain labels, PodDisruptionBudget selectors),
//     ownerReferences (DaemonSet pods), deletionTimestamp and the rest of the
//     small metadata; of the annotations only the mirror-pod and the Job
//     completion-index ones; spec.nodeName and the containers' names;
//     status.phase, status.podIP and status.conditions.
//   - Nodes: all metadata (labels and annotations are read and compared in
//     full); managedFields without their fieldsV1, since the uncordon's
//     author is named from the entries' manager, operation, subresource and
//     time; the whole spec; status.conditions, capacity, allocatable and
//     nodeInfo.bootID. Images, addresses, volumes, daemon endpoints and the
//     rest of nodeInfo go.
//   - NodeHealths: everything but the status subresource's managedFields
//     entries; the main resource's entries say who asked for a manual request.
//
// A trimmed object must never be written back whole: the operator writes
// Pods and Nodes only with merge patches computed between two copies of the
// same cached object (and deletes and evictions by name and UID), so the
// fields the cache dropped are in neither copy and never in the patch. A
// JSON merge patch replaces a list whole, so a list the operator patches
// (node taints, node conditions) is kept whole.
package cachetrim

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
)

// podAnnotations are the only Pod annotations kept: the drain leaves mirror
// pods alone, and a Job's output is read from the pod of completion index 0.
var podAnnotations = []string{corev1.MirrorPodAnnotationKey, batchv1.JobCompletionIndexAnnotation}

// daemonPods selects the ComputeDomain daemon pods, the only pods cached.
var daemonPods = func() labels.Selector {
	req, err := labels.NewRequirement(computedomain.NodeLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant key: cannot fail
	}
	return labels.NewSelector().Add(*req)
}()

// CacheOptions returns the options of the operator's manager cache. Jobs
// are watched only in namespace, the operator's own, so its RBAC for them
// is a namespaced Role; Pods only in driverNamespace, the DRA driver's,
// where the ComputeDomain daemon pods run. Scheme and Mapper are left for
// the manager to fill in.
func CacheOptions(namespace, driverNamespace string) cache.Options {
	return cache.Options{
		// A ByObject Transform replaces DefaultTransform rather than running
		// after it, so each of those strips managedFields itself.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&batchv1.Job{}:                  {Namespaces: map[string]cache.Config{namespace: {}}},
			&corev1.Pod{}:                   {Namespaces: map[string]cache.Config{driverNamespace: {}}, Label: daemonPods, Transform: TrimPod},
			&corev1.Node{}:                  {Transform: TrimNode},
			&gpuhealthv1alpha1.NodeHealth{}: {Transform: TrimNodeHealth},
		},
	}
}

// TrimPod is the cache transform of Pods: a new Pod with only the fields
// the package comment lists. Anything but a *corev1.Pod is returned as it is.
func TrimPod(in any) (any, error) {
	p, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	out := &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: p.ObjectMeta}
	out.ManagedFields = nil
	out.Annotations = nil
	for _, k := range podAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.NodeName = p.Spec.NodeName
	if len(p.Spec.Containers) > 0 {
		out.Spec.Containers = make([]corev1.Container, len(p.Spec.Containers))
		for i := range p.Spec.Containers {
			out.Spec.Containers[i].Name = p.Spec.Containers[i].Name
		}
	}
	out.Status.Phase = p.Status.Phase
	out.Status.PodIP = p.Status.PodIP
	out.Status.Conditions = p.Status.Conditions
	return out, nil
}

// TrimNode is the cache transform of Nodes: status keeps conditions,
// capacity, allocatable and the boot ID, managedFields keep their entries
// without fieldsV1. Anything but a *corev1.Node is returned as it is.
func TrimNode(in any) (any, error) {
	n, ok := in.(*corev1.Node)
	if !ok {
		return in, nil
	}
	out := &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: n.ObjectMeta, Spec: n.Spec}
	out.ManagedFields = nil
	for _, e := range n.ManagedFields {
		e.FieldsV1 = nil
		out.ManagedFields = append(out.ManagedFields, e)
	}
	out.Status = corev1.NodeStatus{
		Capacity:    n.Status.Capacity,
		Allocatable: n.Status.Allocatable,
		Conditions:  n.Status.Conditions,
		NodeInfo:    corev1.NodeSystemInfo{BootID: n.Status.NodeInfo.BootID},
	}
	return out, nil
}

// TrimNodeHealth is the cache transform of NodeHealths: it drops the
// managedFields entries of subresources (the operator's status writes) and
// keeps the rest of the object. Anything but a *NodeHealth is returned as it is.
func TrimNodeHealth(in any) (any, error) {
	nh, ok := in.(*gpuhealthv1alpha1.NodeHealth)
	if !ok {
		return in, nil
	}
	var kept []metav1.ManagedFieldsEntry
	for _, e := range nh.ManagedFields {
		if e.Subresource == "" {
			kept = append(kept, e)
		}
	}
	nh.ManagedFields = kept
	return nh, nil
}
