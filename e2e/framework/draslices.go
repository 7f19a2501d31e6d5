package framework

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// GPUDriver is NVIDIA's DRA driver name, which the stand-in publishes as.
const GPUDriver = "gpu.nvidia.com"

// PublishGPUs is the suite's stand-in for NVIDIA's DRA kubelet plugin on a
// kwok node: the DeviceClass gpu.nvidia.com (its chart's: every device of
// type gpu) and one ResourceSlice for the node, as the driver writes it —
// pool = node name, devices gpu-0…7 with the attributes type and uuid,
// the UUIDs the node's fake NVML reports (GPUUUID) — created straight
// through the API, as Kubernetes' own DRA integration tests do. It returns
// a func that deletes the slice.
func PublishGPUs(ctx context.Context, c *Cluster, node string, index int) (func(context.Context) error, error) {
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: GPUDriver},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: `device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"`,
		}}}},
	}
	if err := c.Client.Create(ctx, class); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating deviceclass %s: %w", class.Name, err)
	}
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + GPUDriver},
		Spec: resourcev1.ResourceSliceSpec{Driver: GPUDriver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}
	for d := range 8 {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", d),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":        {StringValue: ptr.To("gpu")},
				"uuid":        {StringValue: ptr.To(GPUUUID(index, d))},
				"productName": {StringValue: ptr.To("NVIDIA H200")},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse("141Gi")}},
		})
	}
	if err := c.Client.Create(ctx, s); err != nil {
		return nil, fmt.Errorf("creating resourceslice %s: %w", s.Name, err)
	}
	return func(ctx context.Context) error {
		if err := c.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}, nil
}

// OneGPUClaimTemplate is a ResourceClaimTemplate in namespace for one GPU
// of the class gpu.nvidia.com, named name.
func OneGPUClaimTemplate(ctx context.Context, c *Cluster, namespace, name string) error {
	t := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: GPUDriver}}},
		}}},
	}
	if err := c.Client.Create(ctx, t); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating resourceclaimtemplate %s/%s: %w", namespace, name, err)
	}
	return nil
}

// CreateRanks creates namespace (if need be), the ResourceClaimTemplate
// one-gpu in it and a Deployment named name of n ranks on node, each
// claiming one GPU through the template, labelled app=<name>.
func CreateRanks(ctx context.Context, c *Cluster, namespace, name, node string, n int32) (*appsv1.Deployment, error) {
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	if err := OneGPUClaimTemplate(ctx, c, namespace, "one-gpu"); err != nil {
		return nil, err
	}
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(n), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				NodeSelector:   map[string]string{"kubernetes.io/hostname": node},
				Tolerations:    []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
				Containers: []corev1.Container{{Name: "rank", Image: "registry.invalid/rank:kwok",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			}}},
	}
	if err := c.Client.Create(ctx, d); err != nil {
		return nil, fmt.Errorf("creating deployment %s/%s: %w", namespace, name, err)
	}
	return d, nil
}
