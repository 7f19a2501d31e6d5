package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Leftovers lists the chart's objects that still exist after helm
// uninstall ("Kind namespace/name"): service accounts, RBAC, the
// workloads, the monitor's ConfigMap, the admission policies and the
// agents' flow control. The CRDs,
// their objects and the default policy are meant to stay and are not
// listed.
func Leftovers(ctx context.Context, c client.Client) ([]string, error) {
	type ref struct {
		obj             client.Object
		namespace, name string
	}
	refs := []ref{
		{&appsv1.Deployment{}, Namespace, "gpuhealth-operator"},
		{&appsv1.DaemonSet{}, Namespace, "gpuhealth-monitor"},
		{&corev1.ConfigMap{}, Namespace, "gpuhealth-monitor"},
		{&rbacv1.Role{}, Namespace, "gpuhealth-operator"},
		{&rbacv1.RoleBinding{}, Namespace, "gpuhealth-operator"},
		{&admissionregistrationv1.ValidatingAdmissionPolicy{}, "", "gpuhealth-monitor-own-node"},
		{&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, "", "gpuhealth-monitor-own-node"},
		{&admissionregistrationv1.ValidatingAdmissionPolicy{}, "", "gpuhealth-request-requester"},
		{&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, "", "gpuhealth-request-requester"},
		{&flowcontrolv1.FlowSchema{}, "", "gpuhealth-monitor"},
		{&flowcontrolv1.PriorityLevelConfiguration{}, "", "gpuhealth-monitor"},
	}
	for _, name := range []string{"gpuhealth-view", "gpuhealth-request", "gpuhealth-policy-admin", "gpuhealth-metrics-reader"} {
		refs = append(refs, ref{&rbacv1.ClusterRole{}, "", name})
	}
	for _, name := range []string{"gpuhealth-operator", "gpuhealth-monitor"} {
		refs = append(refs, ref{&corev1.ServiceAccount{}, Namespace, name}, ref{&rbacv1.ClusterRole{}, "", name}, ref{&rbacv1.ClusterRoleBinding{}, "", name})
	}
	var left []string
	for _, r := range refs {
		err := c.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: r.name}, r.obj)
		switch {
		case err == nil:
			left = append(left, fmt.Sprintf("%T %s/%s", r.obj, r.namespace, r.name))
		case !apierrors.IsNotFound(err):
			return nil, err
		}
	}
	return left, nil
}

// QuarantineTaint is the default policy's quarantine taint.
const QuarantineTaint = "gpuhealth.dev/quarantined"

// Quarantined reports whether a node is cordoned and carries the
// quarantine taint.
func Quarantined(n *corev1.Node) bool {
	if !n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == QuarantineTaint {
			return true
		}
	}
	return false
}

// AppendScenario appends lines to a file a case drives: a fake NVML
// scenario (the library reads it within 100 ms) or a kernel-log file.
func AppendScenario(path string, lines ...string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	return errors.Join(err, f.Close())
}
