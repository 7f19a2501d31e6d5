//go:build e2e

package e2e

// The release cases are the disruptive ones, after every other in the
// suite's list (cases_test.go): the image case restarts the suite's
// operator, whose counters the metric cases read, and the last one
// uninstalls.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// imageTagEnv names the tag of the images `make image` built; make e2e
// sets it.
const imageTagEnv = "GPUHEALTH_IMAGE_TAG"

// podman runs podman with runc (crun refuses these machines' hybrid cgroup
// hierarchy), as hack/image.sh does.
func podman(args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "podman", append([]string{"--runtime", "runc"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// readableCopy copies a 0600 file into a fresh folder others may read, for a
// container user that is not root.
func readableCopy(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o644); err != nil { //nolint:gosec // read by the container's user
		t.Fatal(err)
	}
	return dir
}

// runContainer starts a detached container by a name unique to this run and
// removes it when the test ends, also on failure.
func runContainer(t *testing.T, name string, args ...string) {
	t.Helper()
	name = name + "-" + env.Cluster.Name
	_, _ = podman("rm", "-f", name)
	if _, err := podman(append([]string{"run", "-d", "--name", name, "--network", "host"}, args...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := podman("logs", name)
			t.Logf("logs of %s:\n%s", name, logs)
		}
		_, _ = podman("rm", "-f", name)
	})
}

// testImagesRun starts the images `make image` built as the chart runs
// them: the operator's as its nonroot user on a read-only root, with a
// token-only kubeconfig (it takes the leader Lease over from the suite's
// operator, which stops meanwhile, and reconciles a new node); the
// monitor's with the fake NVML library mounted (its dlopen inside the
// image's glibc base), whose finding arrives.
func testImagesRun(t *testing.T) {
	tag := os.Getenv(imageTagEnv)
	if tag == "" {
		t.Skipf("%s is not set: make e2e builds the images (make image) and sets it", imageTagEnv)
	}
	operatorImage, monitorImage := "localhost/gpuhealth-operator:"+tag, "localhost/gpuhealth-monitor:"+tag
	for _, image := range []string{operatorImage, monitorImage} {
		if _, err := podman("image", "exists", image); err != nil {
			t.Fatalf("image %s is missing (run make image): %v", image, err)
		}
	}

	t.Run("operator", func(t *testing.T) {
		g := NewWithT(t)
		lease := func(g Gomega) string {
			var l coordinationv1.Lease
			err := env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: framework.Namespace, Name: "gpuhealth-operator.gpuhealth.dev"}, &l)
			if apierrors.IsNotFound(err) || l.Spec.HolderIdentity == nil {
				return ""
			}
			g.Expect(err).NotTo(HaveOccurred())
			return *l.Spec.HolderIdentity
		}
		var hostLeader string
		g.Eventually(func(g Gomega) string { hostLeader = lease(g); return hostLeader }, time.Minute).ShouldNot(BeEmpty(), "the suite's operator leads")
		env.Operator.Stop() // it releases the Lease
		t.Cleanup(func() {
			if err := env.Operator.Start(ctx); err != nil {
				t.Errorf("restarting the suite's operator: %v", err)
			}
		})
		health, err := framework.FreeAddr()
		g.Expect(err).NotTo(HaveOccurred())
		kc := readableCopy(t, filepath.Join(env.Dir, "operator.kubeconfig"))
		runContainer(t, "gpuhealth-e2e-operator",
			"--read-only", "--user", "65532:65532", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
			"-v", kc+":/config:ro", operatorImage,
			"--kubeconfig=/config/operator.kubeconfig", "--namespace="+framework.Namespace, "--leader-elect=true",
			"--health-probe-bind-address="+health, "--metrics-bind-address=0",
			// The Job rules the chart would give it (the suites' images).
			"--job-image-prefixes="+strings.Join(append(slices.Clone(framework.JobImagePrefixes), "ghcr.io/gpuhealth/"), ","))
		g.Eventually(lease, time.Minute).ShouldNot(Or(BeEmpty(), Equal(hostLeader)), "the image's operator leads")

		const name = "gpu-node-image"
		g.Expect(env.Cluster.AddFakeNode(ctx, name, 1)).To(Succeed())
		t.Cleanup(func() { _ = env.Cluster.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
		g.Eventually(phase(name), time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy), "it reconciles the new node")
	})

	t.Run("monitor", func(t *testing.T) {
		g := NewWithT(t)
		const node = "gpu-node-4"
		// GPUs of their own, so the finding is this container's.
		uuid := framework.GPUUUID(9, 0)
		scenarioDir := t.TempDir()
		scenario := filepath.Join(scenarioDir, "scenario.txt")
		g.Expect(os.WriteFile(scenario, []byte(framework.Scenario(9)), 0o600)).To(Succeed())
		health, err := framework.FreeAddr()
		g.Expect(err).NotTo(HaveOccurred())
		kc := readableCopy(t, monitorKubeconfig(node))
		runContainer(t, "gpuhealth-e2e-monitor",
			"--read-only", "--cap-drop", "ALL", "--cap-add", "SYSLOG", "--security-opt", "no-new-privileges", "--tmpfs", "/spool",
			"-v", kc+":/config:ro", "-v", filepath.Dir(env.Bins.FakeNVML)+":/fakenvml:ro", "-v", scenarioDir+":/scenario",
			"-e", fakenvml.ScenarioEnv+"=/scenario/scenario.txt", monitorImage,
			"--kubeconfig=/config/monitor.kubeconfig", "--node-name="+node, "--sources=nvml",
			"--nvml-library=/fakenvml/"+filepath.Base(env.Bins.FakeNVML), "--spool-dir=/spool",
			"--health-probe-bind-address="+health, "--metrics-bind-address=0")
		g.Eventually(func() bool { ok, _ := framework.Ready(health); return ok }, time.Minute).Should(BeTrue(),
			"the agent in the image is ready: NVML loaded through the mounted library")
		// XID 45 (preemptive cleanup): the default policy ignores it.
		g.Expect(framework.AppendScenario(scenario, "xid device=0 code=45 at="+fakenvml.At(time.Now().Add(200*time.Millisecond)))).To(Succeed())
		g.Eventually(func(g Gomega) []string {
			var list gpuhealthv1alpha1.NodeHealthEventList
			g.Expect(env.Cluster.Client.List(ctx, &list)).To(Succeed())
			var found []string
			for _, e := range list.Items {
				if e.Spec.NodeName == node && e.Spec.Component.ID == uuid {
					found = append(found, e.Spec.Code)
				}
			}
			return found
		}, time.Minute).Should(ContainElement("45"), "the finding of the agent in the image arrives")
	})
}

// testHelmUpgradeAndUninstall runs last (it removes the installation):
// helm upgrade with a changed value rolls the operator's Deployment, adopts
// the default policy (a post-install hook on the first install) into the
// release, and keeps every NodeHealth and finding; helm uninstall leaves
// nothing of gpuhealth but its CRDs, their objects (the NodeHealths) and
// the policy.
func testHelmUpgradeAndUninstall(t *testing.T) {
	g := NewWithT(t)
	c := env.Cluster.Client
	// The suite's nodes' NodeHealths (a node another case added and
	// deleted may lose its own to the garbage collector meanwhile).
	nodeHealths := func(g Gomega) []string {
		var list gpuhealthv1alpha1.NodeHealthList
		g.Expect(c.List(ctx, &list)).To(Succeed())
		var out []string
		for _, nh := range list.Items {
			if slices.Contains(env.Nodes, nh.Name) {
				out = append(out, nh.Name)
			}
		}
		return out
	}
	g.Expect(nodeHealths(g)).To(ConsistOf(env.Nodes))
	deployment := func(g Gomega) *appsv1.Deployment {
		d := &appsv1.Deployment{}
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: framework.Namespace, Name: "gpuhealth-operator"}, d)).To(Succeed())
		return d
	}
	before := deployment(g)

	start := time.Now()
	_, err := env.Cluster.Helm(ctx, append([]string{"upgrade", framework.ReleaseName, "charts/gpuhealth", "--namespace", framework.Namespace,
		"-f", "charts/gpuhealth/values-remediation.yaml", "--set", "operator.replicas=0", "--set", "operator.workers=8", "--wait", "--timeout", "2m"},
		framework.JobValues()...)...)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm upgrade took %s", time.Since(start).Round(time.Millisecond))
	after := deployment(g)
	g.Expect(after.Generation).To(BeNumerically(">", before.Generation), "the changed value rolls the Deployment")
	g.Expect(after.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--workers=8"))
	g.Eventually(func(g Gomega) int64 { return deployment(g).Status.ObservedGeneration }).Should(Equal(after.Generation))
	manifest, err := env.Cluster.Helm(ctx, "get", "manifest", framework.ReleaseName, "--namespace", framework.Namespace)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(manifest).To(ContainSubstring("kind: RemediationPolicy"), "the upgrade adopted the default policy into the release")
	g.Expect(nodeHealths(g)).To(ConsistOf(env.Nodes), "the upgrade keeps every NodeHealth")

	start = time.Now()
	_, err = env.Cluster.Helm(ctx, "uninstall", framework.ReleaseName, "--namespace", framework.Namespace, "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm uninstall took %s", time.Since(start).Round(time.Millisecond))

	// Nothing of ours is left but the CRDs, their objects and the policy.
	left, err := framework.Leftovers(ctx, c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(left).To(BeEmpty())
	for _, crd := range []string{"nodehealthevents", "nodehealths", "remediationpolicies"} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		g.Expect(c.Get(ctx, client.ObjectKey{Name: crd + ".gpuhealth.dev"}, u)).To(Succeed(), "the CRD %s stays", crd)
		g.Expect(u.GetDeletionTimestamp()).To(BeNil())
	}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "default"}, &gpuhealthv1alpha1.RemediationPolicy{})).To(Succeed(), "the policy stays")
	g.Expect(nodeHealths(g)).To(ConsistOf(env.Nodes), "every NodeHealth stays")
}
