package framework

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// TestKwokctlConfig: Create hands kwokctl the suite's stages file as it is,
// or a file of the cluster's own with the components' flags added, grouped
// per component, and no stages with DefaultStages.
func TestKwokctlConfig(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	stagesFile := filepath.Join(root, "e2e", "testdata", "kwok-stages.yaml")
	stagesBytes, err := os.ReadFile(stagesFile)
	if err != nil {
		t.Fatal(err)
	}
	stages := string(stagesBytes)
	const anchor = "componentsPatches:\n"
	qps := []ComponentArg{
		{Component: "kube-controller-manager", Key: "kube-api-qps", Value: "1000"},
		{Component: "kube-scheduler", Key: "kube-api-qps", Value: "1000"},
		{Component: "kube-controller-manager", Key: "kube-api-burst", Value: "1000"},
		{Component: "kube-scheduler", Key: "kube-api-burst", Value: "1000"},
	}
	tests := []struct {
		name    string
		cluster Cluster
		// want is the configuration's text; empty: the stages file itself.
		want string
	}{
		{
			name: "the suite's cluster gets the stages file itself",
		},
		{
			name:    "without leader election, both controllers get the flag before the stages' own patches",
			cluster: Cluster{NoControllerLeaderElection: true},
			want: strings.Replace(stages, anchor, anchor+
				"- name: kube-controller-manager\n  extraArgs:\n  - {key: leader-elect, value: \"false\"}\n"+
				"- name: kube-scheduler\n  extraArgs:\n  - {key: leader-elect, value: \"false\"}\n", 1),
		},
		{
			name:    "with kwok's default stages, only the flags, one entry per component",
			cluster: Cluster{DefaultStages: true, ComponentArgs: qps},
			want: `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - {key: kube-api-qps, value: "1000"}
  - {key: kube-api-burst, value: "1000"}
- name: kube-scheduler
  extraArgs:
  - {key: kube-api-qps, value: "1000"}
  - {key: kube-api-burst, value: "1000"}
`,
		},
		{
			name:    "with kwok's default stages and no flags, a configuration that names no stages",
			cluster: Cluster{DefaultStages: true},
			want:    "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\ncomponentsPatches:\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := tt.cluster
			c.Name, c.Root, c.WorkDir = "test-cluster", root, t.TempDir()
			path, written, err := c.kwokctlConfig()
			g.Expect(err).NotTo(HaveOccurred())
			if tt.want == "" {
				g.Expect(written).To(BeFalse())
				g.Expect(path).To(Equal(stagesFile))
				return
			}
			g.Expect(written).To(BeTrue())
			g.Expect(path).To(Equal(filepath.Join(c.WorkDir, "test-cluster-kwokctl.yaml")))
			got, err := os.ReadFile(path)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(got)).To(Equal(tt.want))
		})
	}
}
