//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// testKubectlPlugin runs kubectl gpuhealth the way users do: the plugin
// binary on PATH, found and run by a real kubectl, against the suite's
// cluster and running operator.
func testKubectlPlugin(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "kubectl-gpuhealth"), "./cmd/kubectl-gpuhealth")
	build.Dir = env.Cluster.Root
	b, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(b))

	bin := env.Cluster.KubectlBin
	if bin == "" {
		bin = "kubectl"
	}
	run := func(args ...string) (string, error) {
		// kubectl takes no flag before a plugin's name: the kubeconfig
		// comes from the environment, as for most users.
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+env.Cluster.Kubeconfig)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}

	out, err := run("plugin", "list")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring(filepath.Join(dir, "kubectl-gpuhealth")))

	out, err = run("gpuhealth", "status")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("POLICY"))
	g.Expect(out).To(MatchRegexp(`(?m)^default\s+\d+\s`), "the default policy is listed with its node count")

	const node = "gpu-node-4"
	out, err = run("gpuhealth", "story", node)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(MatchRegexp(`(?m)^Node:\s+` + node + `$`))
	g.Expect(out).To(ContainSubstring("Timeline:"))

	// The real operator acknowledges a spec change by its observedGeneration.
	out, err = run("gpuhealth", "hold", node, "--wait", "--timeout", "60s")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("observed by the operator"))
	out, err = run("gpuhealth", "unhold", node, "--wait", "--timeout", "60s")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(kubectl(t, "get", "nodehealth", node, "-o", "jsonpath={.spec.hold}")).To(Equal("false"))

	out, err = run("gpuhealth", "story", "no-such-node")
	g.Expect(err).To(HaveOccurred())
	g.Expect(strings.TrimSpace(out)).To(ContainSubstring(`nodehealth "no-such-node" not found`))
}
