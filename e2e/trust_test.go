//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// testPolicyEditorCannotEscalate: someone who may only edit
// RemediationPolicies (the chart's gpuhealth-policy-admin, bound to a
// service account) tries, through kubectl, to make gpuhealth run a
// privileged suite step as the operator's service account, with a Secret
// in its environment. The chart's admission policy refuses it, naming each
// breach; the same policy within the install's rules is admitted; and the
// editor cannot read the operator's Secrets or create a Job directly.
func testPolicyEditorCannotEscalate(t *testing.T) {
	g := NewWithT(t)
	const ns, sa = "policy-editors", "editor"
	kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = env.Cluster.Kubectl(ctx, "delete", "namespace", ns, "--wait=false") })
	kubectl(t, "create", "serviceaccount", sa, "-n", ns)
	kubectl(t, "create", "clusterrolebinding", "e2e-policy-editor", "--clusterrole=gpuhealth-policy-admin", "--serviceaccount="+ns+":"+sa)
	t.Cleanup(func() { _, _ = env.Cluster.Kubectl(ctx, "delete", "clusterrolebinding", "e2e-policy-editor") })
	as := "--as=system:serviceaccount:" + ns + ":" + sa

	policy := func(step string) string {
		p := filepath.Join(t.TempDir(), "policy.yaml")
		g.Expect(os.WriteFile(p, []byte(`apiVersion: gpuhealth.dev/v1alpha1
kind: RemediationPolicy
metadata:
  name: e2e-escalation
spec:
  nodeSelector:
    matchLabels: {e2e.gpuhealth.dev/no-such-node: "true"}
  recertification:
    steps:
    - name: recertify
      parser: {type: exit-code}
      job:
`+step), 0o600)).To(Succeed())
		return p
	}
	t.Cleanup(func() {
		_, _ = env.Cluster.Kubectl(ctx, "delete", "remediationpolicy", "e2e-escalation", "--ignore-not-found")
	})

	_, err := env.Cluster.Kubectl(ctx, "apply", as, "-f", policy(`        image: docker.io/attacker/tools:1
        privileged: true
        hostPID: true
        serviceAccountName: gpuhealth-operator
        env:
        - name: TOKEN
          valueFrom: {secretKeyRef: {name: gpuhealth-operator-token, key: token}}
`))
	g.Expect(err).To(HaveOccurred(), "the escalation is refused at admission")
	for _, breach := range []string{"install's rules for RemediationPolicy Jobs", "privileged", "gpuhealth-operator", "valueFrom", "docker.io/attacker/tools:1"} {
		g.Expect(err.Error()).To(ContainSubstring(breach))
	}

	out, err := env.Cluster.Kubectl(ctx, "apply", as, "-f", policy(`        image: registry.invalid/recertify:kwok
`))
	g.Expect(err).NotTo(HaveOccurred(), "within the rules the editor may write policies: %s", out)

	for _, can := range [][]string{{"get", "secrets", "-n", framework.Namespace}, {"create", "jobs", "-n", framework.Namespace}} {
		out, _ := env.Cluster.Kubectl(ctx, append([]string{"auth", "can-i", as}, can...)...)
		g.Expect(out).To(HavePrefix("no"), "the editor may not %v", can)
	}
}
