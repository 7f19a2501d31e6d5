package job

import (
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// installRules are the chart's default rules, with one allowed account.
var installRules = Rules{
	ServiceAccount:         DefaultServiceAccount,
	Reserved:               []string{"gpuhealth-operator", "gpuhealth-monitor"},
	AllowedServiceAccounts: []string{"dcgm-exporter"},
	PrivilegedKinds:        []Kind{ResetGPU, RebootNode, Diagnostics},
	ImagePrefixes:          []string{"nvcr.io/nvidia/", "registry.k8s.io/e2e-test-images/agnhost:", "ghcr.io/gpuhealth/"},
}

// samplePolicy is the shape of config/samples' policy: privileged
// diagnostics, reset and reboot, and a two-step suite from NVIDIA's registry.
func samplePolicy() *gpuhealthv1alpha1.RemediationPolicySpec {
	suite := []gpuhealthv1alpha1.SuiteStep{
		{Name: "dcgm-diag", Job: gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"}},
		{Name: "nccl-allreduce", Job: gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/pytorch:26.01-py3"}},
	}
	s := &gpuhealthv1alpha1.RemediationPolicySpec{}
	s.Remediation.Diagnostics = &gpuhealthv1alpha1.DiagnosticsStep{Job: gpuhealthv1alpha1.JobTemplate{
		Image: "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04", Privileged: true}}
	s.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{
		Image: "registry.k8s.io/e2e-test-images/agnhost:2.53", Privileged: true, HostPID: true}}
	s.Remediation.ResetGPU = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{
		Image: "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04", Privileged: true}}
	s.Certification.Steps = suite
	s.Recertification.Steps = slices.Clone(suite)
	return s
}

func TestBreaches(t *testing.T) {
	secret := corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "gpuhealth-operator-token"}, Key: "token"}}}
	cases := []struct {
		name   string
		rules  Rules
		change func(*gpuhealthv1alpha1.RemediationPolicySpec)
		want   []string
	}{
		{name: "the sample policy keeps the default rules", rules: installRules},
		{name: "a policy without Jobs keeps even the zero rules", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) { *s = gpuhealthv1alpha1.RemediationPolicySpec{} }},
		{
			name: "the zero rules allow no image", change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation, s.Certification.Steps = gpuhealthv1alpha1.RemediationSpec{}, nil
			},
			want: []string{
				`spec.recertification.steps[dcgm-diag].job: image "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04" is not from an allowed registry (none)`,
				`spec.recertification.steps[nccl-allreduce].job: image "nvcr.io/nvidia/pytorch:26.01-py3" is not from an allowed registry (none)`,
			},
		},
		{
			name:  "a privileged suite step is refused",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Certification.Steps[0].Job.Privileged = true },
			want: []string{"spec.certification.steps[dcgm-diag].job: privileged is allowed only for steps reset, reboot, diag, not cert"},
		},
		{
			name:  "hostPID on the recertification job is refused",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Steps = nil
				s.Recertification.Job = &gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/cuda:12", HostPID: true}
			},
			want: []string{"spec.recertification.job: hostPID is allowed only for steps reset, reboot, diag, not recert"},
		},
		{
			name:  "a privileged clique test is refused unless the install allows clique",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.ComputeDomain.CliqueCertification = &gpuhealthv1alpha1.CliqueCertificationSpec{Job: gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/pytorch:26.01-py3", Privileged: true}}
			},
			want: []string{"spec.computeDomain.cliqueCertification.job: privileged is allowed only for steps reset, reboot, diag, not clique"},
		},
		{
			name:  "an install that allows no privileged step refuses the sample's diagnostics, reset and reboot",
			rules: func() Rules { r := installRules; r.PrivilegedKinds = nil; return r }(),
			want: []string{
				"spec.remediation.diagnostics.job: privileged is allowed only for steps none, not diag",
				"spec.remediation.resetGPU.job: privileged is allowed only for steps none, not reset",
				"spec.remediation.rebootNode.job: privileged is allowed only for steps none, not reboot",
				"spec.remediation.rebootNode.job: hostPID is allowed only for steps none, not reboot",
			},
		},
		{
			name:  "privileged diagnostics are refused where the install allows only reset and reboot",
			rules: func() Rules { r := installRules; r.PrivilegedKinds = []Kind{ResetGPU, RebootNode}; return r }(),
			want:  []string{"spec.remediation.diagnostics.job: privileged is allowed only for steps reset, reboot, not diag"},
		},
		{
			name:  "the operator's service account is refused even when the install lists it",
			rules: func() Rules { r := installRules; r.AllowedServiceAccounts = []string{"gpuhealth-operator"}; return r }(),
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.ResetGPU.Job.ServiceAccountName = "gpuhealth-operator"
			},
			want: []string{`spec.remediation.resetGPU.job: serviceAccountName "gpuhealth-operator" is gpuhealth's own identity and never a Job's`},
		},
		{
			name:  "the agent's service account is refused",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Steps[1].Job.ServiceAccountName = "gpuhealth-monitor"
			},
			want: []string{`spec.recertification.steps[nccl-allreduce].job: serviceAccountName "gpuhealth-monitor" is gpuhealth's own identity and never a Job's`},
		},
		{
			name:  "an account the install did not list is refused",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.RebootNode.Job.ServiceAccountName = "default"
			},
			want: []string{`spec.remediation.rebootNode.job: serviceAccountName "default" is not allowed (allowed: dcgm-exporter)`},
		},
		{
			name:  "the install's Job account and a listed account may be named",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.RebootNode.Job.ServiceAccountName = DefaultServiceAccount
				s.Remediation.ResetGPU.Job.ServiceAccountName = "dcgm-exporter"
			},
		},
		{
			name:  "an image outside the prefixes is refused, and a prefix is not a mere string prefix of the registry",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Certification.Steps[0].Job.Image = "docker.io/library/busybox:1.36"
				s.Certification.Steps[1].Job.Image = "nvcr.io/nvidia-mirror.example/pytorch:26.01-py3"
				s.Remediation.RebootNode.Job.Image = "registry.k8s.io/e2e-test-images/agnhost-evil:2.53"
			},
			want: []string{
				`spec.remediation.rebootNode.job: image "registry.k8s.io/e2e-test-images/agnhost-evil:2.53" is not from an allowed registry (nvcr.io/nvidia/, registry.k8s.io/e2e-test-images/agnhost:, ghcr.io/gpuhealth/)`,
				`spec.certification.steps[dcgm-diag].job: image "docker.io/library/busybox:1.36" is not from an allowed registry (nvcr.io/nvidia/, registry.k8s.io/e2e-test-images/agnhost:, ghcr.io/gpuhealth/)`,
				`spec.certification.steps[nccl-allreduce].job: image "nvcr.io/nvidia-mirror.example/pytorch:26.01-py3" is not from an allowed registry (nvcr.io/nvidia/, registry.k8s.io/e2e-test-images/agnhost:, ghcr.io/gpuhealth/)`,
			},
		},
		{
			name:  "an empty prefix allows nothing",
			rules: func() Rules { r := installRules; r.ImagePrefixes = []string{""}; return r }(),
			change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				*s = gpuhealthv1alpha1.RemediationPolicySpec{}
				s.Recertification.Job = &gpuhealthv1alpha1.JobTemplate{Image: "busybox"}
			},
			want: []string{`spec.recertification.job: image "busybox" is not from an allowed registry ()`},
		},
		{
			name:  "env from a Secret is refused; a literal value is not",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.ResetGPU.Job.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, secret}
			},
			want: []string{`spec.remediation.resetGPU.job: env "TOKEN" takes its value from valueFrom; a Job's environment is literal values only`},
		},
		{
			name:  "env from a field of the pod is refused too",
			rules: installRules, change: func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Steps[0].Job.Env = []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
			},
			want: []string{`spec.recertification.steps[dcgm-diag].job: env "NODE" takes its value from valueFrom; a Job's environment is literal values only`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := samplePolicy()
			if tc.change != nil {
				tc.change(spec)
			}
			NewWithT(t).Expect(tc.rules.Breaches(spec)).To(Equal(tc.want))
		})
	}
}

func TestRulesValidate(t *testing.T) {
	cases := []struct {
		name    string
		rules   Rules
		wantErr string
	}{
		{name: "the install's default rules are valid", rules: installRules},
		{name: "a prefix ending inside a registry name is refused", rules: Rules{ImagePrefixes: []string{"nvcr.io"}}, wantErr: `image prefix "nvcr.io" must end in '/', ':' or '@'`},
		{name: "a digest prefix is valid", rules: Rules{ImagePrefixes: []string{"nvcr.io/nvidia/cuda@"}}},
		{name: "an unknown step is refused", rules: Rules{PrivilegedKinds: []Kind{"resetGPU"}}, wantErr: `step "resetGPU" is not one of cert, recert, reset, reboot, clique`},
		{name: "an allowed account without a name is refused", rules: Rules{AllowedServiceAccounts: []string{""}}, wantErr: "an allowed service account has no name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.rules.Validate()
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
		})
	}
}
