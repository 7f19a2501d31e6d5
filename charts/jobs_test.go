package charts_test

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestJobRulesAreOneSource: the operator's --job-* flags and the admission
// policy's parameters say the same rules, from the same values, with the
// registry of the install's own images added to the allowed prefixes.
func TestJobRulesAreOneSource(t *testing.T) {
	cases := []struct {
		name                              string
		args                              []string
		accounts, steps, prefixes, policy string
	}{
		{
			name: "defaults", steps: "reset,reboot,diag,devreset",
			prefixes: "nvcr.io/nvidia/,registry.k8s.io/e2e-test-images/agnhost:,ghcr.io/gpuhealth/", policy: "gpuhealth-policy-jobs",
		},
		{
			name: "an install's own rules, and its own registry",
			args: []string{"--set-json", `jobs={"allowedServiceAccounts":["dcgm","nccl"],"privilegedSteps":["reboot"],"allowedImagePrefixes":["registry.example.com/gpu/"],"admissionPolicy":false}`,
				"--set", "operator.image.repository=registry.example.com/mirror/gpuhealth-operator"},
			accounts: "dcgm,nccl", steps: "reboot", prefixes: "registry.example.com/gpu/,registry.example.com/mirror/",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			objs := render(t, tc.args...)
			cm := find(objs, "ConfigMap", "gpuhealth-job-rules")
			g.Expect(cm).NotTo(BeNil())
			data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			g.Expect(data).To(Equal(map[string]string{
				"serviceAccount": "gpuhealth-job", "reservedServiceAccounts": "gpuhealth-operator,gpuhealth-monitor",
				"allowedServiceAccounts": tc.accounts, "privilegedSteps": tc.steps, "allowedImagePrefixes": tc.prefixes,
			}))
			d := find(objs, "Deployment", "gpuhealth-operator")
			g.Expect(d).NotTo(BeNil())
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			args := map[string]string{}
			for _, a := range containers[0].(map[string]any)["args"].([]any) {
				if k, v, ok := strings.Cut(a.(string), "="); ok && strings.HasPrefix(k, "--job-") {
					args[k] = v
				}
			}
			g.Expect(args).To(Equal(map[string]string{
				"--job-service-account": data["serviceAccount"], "--job-allowed-service-accounts": data["allowedServiceAccounts"],
				"--job-privileged-steps": data["privilegedSteps"], "--job-image-prefixes": data["allowedImagePrefixes"],
			}))
			sa := find(objs, "ServiceAccount", "gpuhealth-job")
			g.Expect(sa).NotTo(BeNil())
			g.Expect(sa.Object).To(HaveKeyWithValue("automountServiceAccountToken", false))
			g.Expect(find(objs, "ClusterRoleBinding", "gpuhealth-job")).To(BeNil(), "the Job account is bound to nothing")
			g.Expect(find(objs, "RoleBinding", "gpuhealth-job")).To(BeNil())
			vap, binding := find(objs, "ValidatingAdmissionPolicy", "gpuhealth-policy-jobs"), find(objs, "ValidatingAdmissionPolicyBinding", "gpuhealth-policy-jobs")
			if tc.policy == "" {
				g.Expect(vap).To(BeNil())
				g.Expect(binding).To(BeNil())
				return
			}
			g.Expect(vap).NotTo(BeNil())
			g.Expect(binding).NotTo(BeNil())
			ref, _, _ := unstructured.NestedStringMap(binding.Object, "spec", "paramRef")
			g.Expect(ref).To(Equal(map[string]string{"name": "gpuhealth-job-rules", "namespace": "gpuhealth-system", "parameterNotFoundAction": "Deny"}))
		})
	}
}
