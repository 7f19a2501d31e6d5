package jobs_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// policyLoadTimeout bounds the wait for the apiserver to load the policy,
// its binding and its parameters; it does so from informers, within about
// a second.
const policyLoadTimeout = time.Minute

var policySeq atomic.Int64

// sample is config/samples' RemediationPolicy (the chart's default policy)
// under a name unique in the suite.
func sample(t *testing.T) *gpuhealthv1alpha1.RemediationPolicy {
	t.Helper()
	b, err := os.ReadFile(samplePolicy)
	if err != nil {
		t.Fatal(err)
	}
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	if err := yaml.UnmarshalStrict(b, p); err != nil {
		t.Fatalf("decoding %s: %v", samplePolicy, err)
	}
	p.Name = fmt.Sprintf("sample-%d", policySeq.Add(1))
	return p
}

func TestPolicyEditorKeepsTheJobRules(t *testing.T) {
	awaitPolicy(t)
	secretEnv := corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "gpuhealth-operator-token"}, Key: "token"}}}
	cases := []struct {
		name    string
		change  func(*gpuhealthv1alpha1.RemediationPolicySpec)
		wantErr string // "": admitted
	}{
		{name: "the shipped sample policy is admitted"},
		{name: "the shipped sample policy in dry-run is admitted (the default install's)", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.DryRun = true }},
		{name: "a policy without Jobs is admitted", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
			s.Remediation, s.Certification.Steps, s.Recertification.Steps = gpuhealthv1alpha1.RemediationSpec{}, nil, nil
		}},
		{name: "a Job may name the install's Job account", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
			s.Remediation.ResetGPU.Job.ServiceAccountName = "gpuhealth-job"
		}},
		{name: "an image from the install's own registry is admitted", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
			s.Recertification.Steps[0].Job.Image = "ghcr.io/gpuhealth/gpuhealth-operator:0.1.0"
		}},
		{
			name:    "a privileged suite step is refused",
			change:  func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Certification.Steps[0].Job.Privileged = true },
			wantErr: "spec.certification.steps[dcgm-diag].job: privileged is allowed only for steps reset, reboot, diag, devreset, not cert (chart value jobs.privilegedSteps)",
		},
		{
			name:    "hostPID in a recertification step is refused",
			change:  func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.Steps[1].Job.HostPID = true },
			wantErr: "spec.recertification.steps[nccl-allreduce].job: hostPID is allowed only for steps reset, reboot, diag, devreset, not recert",
		},
		{
			name: "a privileged clique test is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.ComputeDomain.CliqueCertification = &gpuhealthv1alpha1.CliqueCertificationSpec{Job: gpuhealthv1alpha1.JobTemplate{
					Image: "nvcr.io/nvidia/pytorch:26.01-py3", Privileged: true, HostPID: true}}
			},
			wantErr: "spec.computeDomain.cliqueCertification.job: privileged is allowed only for steps reset, reboot, diag, devreset, not clique (chart value jobs.privilegedSteps); spec.computeDomain.cliqueCertification.job: hostPID is allowed only for steps reset, reboot, diag, devreset, not clique",
		},
		{
			name: "diagnostics from an image outside the install's registries, with a Secret, are refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.Diagnostics.Job.Image = "quay.io/attacker/diag:1"
				s.Remediation.Diagnostics.Job.Env = []corev1.EnvVar{secretEnv}
			},
			wantErr: `spec.remediation.diagnostics.job: image "quay.io/attacker/diag:1" is not from an allowed registry`,
		},
		{
			name: "the operator's service account is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.RebootNode.Job.ServiceAccountName = "gpuhealth-operator"
			},
			wantErr: `spec.remediation.rebootNode.job: serviceAccountName "gpuhealth-operator" is gpuhealth's own identity and never a Job's`,
		},
		{
			name: "the agent's service account is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Steps[0].Job.ServiceAccountName = "gpuhealth-monitor"
			},
			wantErr: `spec.recertification.steps[dcgm-diag].job: serviceAccountName "gpuhealth-monitor" is gpuhealth's own identity and never a Job's`,
		},
		{
			name: "an account the install does not allow is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.ResetGPU.Job.ServiceAccountName = "default"
			},
			wantErr: `spec.remediation.resetGPU.job: serviceAccountName "default" is not allowed (allowed: none; chart value jobs.allowedServiceAccounts)`,
		},
		{
			name: "an environment variable from a Secret is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.ResetGPU.Job.Env = []corev1.EnvVar{{Name: "A", Value: "1"}, secretEnv}
			},
			wantErr: "spec.remediation.resetGPU.job: env TOKEN takes its value from valueFrom; a Job's environment is literal values only",
		},
		{
			name: "an environment variable from the pod's fields is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Certification.Steps[1].Job.Env = []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
			},
			wantErr: "spec.certification.steps[nccl-allreduce].job: env NODE takes its value from valueFrom",
		},
		{
			name: "an image outside the prefixes is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Steps[0].Job.Image = "docker.io/library/busybox:1.36"
			},
			wantErr: `the install's rules for RemediationPolicy Jobs refuse this policy: spec.recertification.steps[dcgm-diag].job: image "docker.io/library/busybox:1.36" is not from an allowed registry (nvcr.io/nvidia/, registry.k8s.io/e2e-test-images/agnhost:, ghcr.io/gpuhealth/; chart value jobs.allowedImagePrefixes)`,
		},
		{
			name: "a registry whose name merely starts like an allowed one is refused",
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.RebootNode.Job.Image = "registry.k8s.io/e2e-test-images/agnhost-evil:2.53"
			},
			wantErr: `spec.remediation.rebootNode.job: image "registry.k8s.io/e2e-test-images/agnhost-evil:2.53" is not from an allowed registry`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := sample(t)
			if tc.change != nil {
				tc.change(&p.Spec)
			}
			err := editor.Create(context.Background(), p)
			t.Cleanup(func() { _ = admin.Delete(context.Background(), p) })
			stored := admin.Get(context.Background(), client.ObjectKeyFromObject(p), &gpuhealthv1alpha1.RemediationPolicy{})
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(stored).To(Succeed())
				return
			}
			g.Expect(err).To(Satisfy(apierrors.IsForbidden), "want Forbidden, got %v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
			g.Expect(apierrors.IsNotFound(stored)).To(BeTrue(), "refused, yet stored")
		})
	}
}

// TestPolicyEditorCannotEscalateByUpdate: an admitted policy cannot be
// changed into one that breaks the rules; several breaches are named at once.
func TestPolicyEditorCannotEscalateByUpdate(t *testing.T) {
	awaitPolicy(t)
	g := NewWithT(t)
	ctx := context.Background()
	p := sample(t)
	g.Expect(editor.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = admin.Delete(context.Background(), p) })
	p.Spec.Certification.Steps[0].Job.Privileged = true
	p.Spec.Certification.Steps[0].Job.ServiceAccountName = "gpuhealth-operator"
	p.Spec.Remediation.ResetGPU.Job.Image = "quay.io/attacker/reset:1"
	err := editor.Update(ctx, p)
	g.Expect(err).To(Satisfy(apierrors.IsForbidden))
	for _, want := range []string{`image "quay.io/attacker/reset:1"`, `serviceAccountName "gpuhealth-operator"`, "privileged is allowed only for steps reset, reboot, diag, devreset, not cert"} {
		g.Expect(err).To(MatchError(ContainSubstring(want)))
	}
	got := &gpuhealthv1alpha1.RemediationPolicy{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	g.Expect(got.Spec.Certification.Steps[0].Job.Privileged).To(BeFalse(), "the refused update left the policy as it was")
}

// TestPolicyIsEnforcedForAdminsToo: the rules are the install's; a cluster
// admin changes them through the chart's values, not by writing a policy.
func TestPolicyIsEnforcedForAdminsToo(t *testing.T) {
	awaitPolicy(t)
	g := NewWithT(t)
	p := sample(t)
	p.Spec.Remediation.ResetGPU.Job.ServiceAccountName = "gpuhealth-operator"
	err := admin.Create(context.Background(), p)
	t.Cleanup(func() { _ = admin.Delete(context.Background(), p) })
	g.Expect(err).To(Satisfy(apierrors.IsForbidden))
}

// awaitPolicy waits until the apiserver enforces the policy: it loads
// policies, bindings and parameters from informers, so a request right
// after the apply may not see them yet.
func awaitPolicy(t *testing.T) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		p := sample(t)
		p.Spec.Remediation.ResetGPU.Job.Image = "docker.io/library/busybox:1.36"
		err := editor.Create(context.Background(), p)
		if err == nil {
			g.Expect(admin.Delete(context.Background(), p)).To(Succeed())
		}
		g.Expect(err).To(MatchError(ContainSubstring("is not from an allowed registry")))
	}).WithTimeout(policyLoadTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
}
