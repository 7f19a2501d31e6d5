package framework

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Workload describes a training Deployment: replicas that each take a whole
// node's GPUs, kept on the allowed nodes (preferring some), behind a PDB.
type Workload struct {
	Namespace, Name string
	Replicas        int32
	// Allowed nodes (required node affinity); Preferred among them.
	Allowed, Preferred []string
	// MinAvailable for the PDB; nil means no PDB.
	MinAvailable *int32
	// GPUs each replica requests (a whole node's 8 when zero; -1 for none).
	GPUs int64
	// PodLabels are added to the pods' labels.
	PodLabels map[string]string
	// Image and Command of the container (default: a fake image only kwok
	// can run).
	Image   string
	Command []string
}

// CreateWorkload creates the namespace, Deployment and PDB.
func CreateWorkload(ctx context.Context, c *Cluster, w Workload) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	labels := map[string]string{"app": w.Name}
	podLabels := map[string]string{"app": w.Name}
	for k, v := range w.PodLabels {
		podLabels[k] = v
	}
	res := corev1.ResourceList{}
	switch {
	case w.GPUs == 0:
		res[GPUResource] = resource.MustParse("8")
	case w.GPUs > 0:
		res[GPUResource] = *resource.NewQuantity(w.GPUs, resource.DecimalSI)
	}
	affinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: w.Allowed}},
		}}},
	}}
	if len(w.Preferred) > 0 {
		affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: w.Preferred,
			}}},
		}}
	}
	image, command := w.Image, w.Command
	if image == "" {
		image, command = "trainer:fake", []string{"python", "train.py"}
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(w.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					Affinity: affinity,
					Containers: []corev1.Container{{
						Name: "train", Image: image, Command: command,
						Resources: corev1.ResourceRequirements{Requests: res, Limits: res},
					}},
				},
			},
		},
	}
	if err := c.Client.Create(ctx, d); err != nil {
		return fmt.Errorf("creating deployment %s/%s: %w", w.Namespace, w.Name, err)
	}
	if w.MinAvailable != nil {
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MinAvailable: ptr.To(intstr.FromInt32(*w.MinAvailable)),
				Selector:     &metav1.LabelSelector{MatchLabels: labels},
			},
		}
		if err := c.Client.Create(ctx, pdb); err != nil {
			return fmt.Errorf("creating PDB %s/%s: %w", w.Namespace, w.Name, err)
		}
	}
	return nil
}

// PodsOf lists the running pods of a workload by node.
func PodsOf(ctx context.Context, c *Cluster, namespace, app string) (map[string][]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"app": app}); err != nil {
		return nil, err
	}
	out := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p)
	}
	return out, nil
}
