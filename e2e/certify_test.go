//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// kwokSuite is a suite of exit-code steps; the steps named in failing carry
// the label that makes kwok fail their pods.
func kwokSuite(failing ...string) string {
	var steps []string
	for _, name := range []string{"dcgm-diag", "nccl-allreduce"} {
		labels := "{}"
		if slices.Contains(failing, name) {
			labels = `{"gpuhealth.dev/e2e-fail":"true"}`
		}
		steps = append(steps, fmt.Sprintf(`{"name":%q,"job":{"image":"registry.invalid/%s:kwok","labels":%s},"timeout":"2m","parser":{"type":"exit-code"}}`, name, name, labels))
	}
	return "[" + strings.Join(steps, ",") + "]"
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// testNewNodeHeldOutUntilCertified: a node that joins the managed set with
// no workload is tainted gpuhealth.dev/uncertified (not cordoned) while its
// two-step suite runs; an attempt whose second step fails keeps it out, the
// next attempt passes, the taint goes and NodeHealth holds the certificate
// with both steps' results.
func testNewNodeHeldOutUntilCertified(t *testing.T) {
	g := NewWithT(t)
	patchPolicy(t, `{"spec":{"certification":{"newNodes":true,"maxAttempts":5,"steps":`+kwokSuite("nccl-allreduce")+`}}}`)
	defer patchPolicy(t, `{"spec":{"certification":{"newNodes":false,"steps":`+kwokStep+`}}}`)
	const name = "gpu-node-new"
	g.Expect(env.Cluster.AddFakeNode(ctx, name, 9)).To(Succeed())
	defer kubectl(t, "delete", "node", name, "--ignore-not-found")

	g.Eventually(phase(name)).Should(Equal(gpuhealthv1alpha1.PhaseCertifying))
	n := node(g, name)
	g.Expect(hasTaint(n, gpuhealthv1alpha1.UncertifiedTaintKey)).To(BeTrue(), "held out of service")
	g.Expect(n.Spec.Unschedulable).To(BeFalse(), "not cordoned: DaemonSets and the suite still run")

	g.Eventually(func(g Gomega) string {
		c := nodeHealth(g, name).Status.Certification
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
		return c.Message
	}).Should(ContainSubstring("step nccl-allreduce: job failed"), "the second step fails the attempt")
	g.Expect(nodeHealth(g, name).Status.Certification.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
	g.Expect(hasTaint(node(g, name), gpuhealthv1alpha1.UncertifiedTaintKey)).To(BeTrue(), "still held out after a failed attempt")

	patchPolicy(t, `{"spec":{"certification":{"steps":`+kwokSuite()+`}}}`)
	g.Eventually(phase(name)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	nh := nodeHealth(g, name)
	g.Expect(nh.Status.Certificate).NotTo(BeNil())
	g.Expect(nh.Status.Certificate.Suite).To(Equal(gpuhealthv1alpha1.SuiteCertification))
	g.Expect(nh.Status.Certificate.Attempt).To(BeNumerically(">=", 2))
	g.Expect(nh.Status.Certificate.Steps).To(HaveLen(2))
	for _, s := range nh.Status.Certificate.Steps {
		g.Expect(s.Result).To(Equal(gpuhealthv1alpha1.JobSucceeded), "step %s", s.Name)
	}
	g.Eventually(func(g Gomega) bool { return hasTaint(node(g, name), gpuhealthv1alpha1.UncertifiedTaintKey) }).Should(BeFalse(), "the taint goes")
	g.Expect(historyPhases(nh)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseHealthy, gpuhealthv1alpha1.PhaseCertifying, gpuhealthv1alpha1.PhaseHealthy}))
	t.Logf("kubectl get nodehealth %s:\n%s", name, kubectl(t, "get", "nodehealth", name))
	g.Expect(kubectl(t, "get", "nodehealth", name)).To(ContainSubstring("CERTIFIED"))
	g.Expect(len(jobs(g, name, job.Certification))).To(BeNumerically(">=", 4), "two steps per attempt")
}

// testCliqueCertificationGatesTheFabricTaint: with cliqueCertification
// set, the fabric-degraded taint of clique 0 outlives its fault until an
// Indexed Job across the clique's healthy nodes passes: the first attempt
// fails (kwok fails its pods) and the taint stays; the second passes and the
// taint goes.
func testCliqueCertificationGatesTheFabricTaint(t *testing.T) {
	g := NewWithT(t)
	cert := func(labels string) string {
		return `{"spec":{"computeDomain":{"cliqueCertification":{"job":{"image":"registry.invalid/nccl:kwok","labels":` + labels +
			`},"parser":{"type":"exit-code"},"backoff":"5s","maxAttempts":5,"timeout":"2m"}}}}`
	}
	patchPolicy(t, cert(`{"gpuhealth.dev/e2e-fail":"true"}`))
	defer patchPolicy(t, `{"spec":{"computeDomain":{"cliqueCertification":null}}}`)
	clique := []string{"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"}
	for _, n := range clique {
		g.Eventually(phase(n)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	}
	tainted := func(g Gomega) []string {
		var out []string
		for _, n := range clique {
			if hasTaint(node(g, n), gpuhealthv1alpha1.FabricDegradedTaintKey) {
				out = append(out, n)
			}
		}
		return out
	}
	cliqueJobs := func(g Gomega) []batchv1.Job {
		var list batchv1.JobList
		g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
			client.MatchingLabels{job.KindLabel: string(job.CliqueCertification)})).To(Succeed())
		return list.Items
	}
	fabric := func(health string) string {
		return fmt.Sprintf("fabric device=1 state=completed health=%s status=success clique=0 cluster=%s at=%s",
			health, strings.ReplaceAll(framework.ClusterUUID, "-", ""), fakenvml.At(time.Now()))
	}
	inject(t, "gpu-node-3", fabric("unhealthy"))
	g.Eventually(tainted).Should(ConsistOf(clique))
	g.Consistently(cliqueJobs, 2*time.Second).Should(BeEmpty(), "no test while the fault lasts")

	inject(t, "gpu-node-3", fabric("healthy"))
	g.Eventually(func(g Gomega) []batchv1.Job { return cliqueJobs(g) }).ShouldNot(BeEmpty())
	first := cliqueJobs(g)[0]
	g.Expect(*first.Spec.CompletionMode).To(Equal(batchv1.IndexedCompletion))
	g.Expect(*first.Spec.Completions).To(BeNumerically(">=", 1))
	g.Expect(*first.Spec.Completions).To(BeNumerically("<=", 3), "the healthy trays, not the one that faulted")
	g.Eventually(func(g Gomega) string {
		for _, j := range cliqueJobs(g) {
			if v := j.Annotations[job.VerdictAnnotation]; v != "" {
				return v
			}
		}
		return ""
	}).Should(HavePrefix("failed"))
	g.Expect(tainted(g)).To(ConsistOf(clique), "a failed test keeps the taint")

	patchPolicy(t, cert(`{"gpuhealth.dev/e2e-fail":null}`))
	g.Eventually(tainted, 3*time.Minute).Should(BeEmpty(), "a passing test lifts it")
	var verdicts []string
	for _, j := range cliqueJobs(g) {
		verdicts = append(verdicts, j.Name+" "+j.Annotations[job.VerdictAnnotation])
	}
	t.Logf("clique certification jobs: %v", verdicts)
	g.Expect(verdicts).To(ContainElement(HaveSuffix(" passed")))
	g.Eventually(phase("gpu-node-3"), 5*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
}
