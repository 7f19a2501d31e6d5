package nodehealth

import (
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// TestUncordonDuringRecertificationEndsItsJobs: a human who uncordons a
// recertifying node gets it back without the recertification Job still
// running on it, and the history names them from the node's managedFields.
func TestUncordonDuringRecertificationEndsItsJobs(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.Job = jobTemplate() })
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	recert := h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(recert)).To(BeTrue(), "the recertification Job runs")

	// An admin tool uncordons and notes why, under its own field manager.
	node := h.getNode(n.Name)
	node.Spec.Unschedulable = false
	node.Annotations["example.com/uncordoned-for"] = "INC-7"
	h.g.Expect(client.WithFieldOwner(k8sClient, "node-admin-tool").Update(h.ctx, node)).To(Succeed())
	h.reconcile(n.Name)

	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	last := nh.Status.History[len(nh.Status.History)-1]
	h.g.Expect(last.Reason).To(Equal(gpuhealthv1alpha1.ReasonHumanUncordon))
	h.g.Expect(last.By).To(ContainSubstring("node-admin-tool"))
	h.g.Expect(last.Message).To(ContainSubstring("deleting unfinished jobs " + recert))
	h.g.Expect(h.jobExists(recert)).To(BeFalse(), "the Job is gone with the workflow")
	h.g.Expect(h.events()).To(ContainElements(
		HavePrefix("Normal "+gpuhealthv1alpha1.ReasonJobsDeleted),
		SatisfyAll(HavePrefix("Normal "+gpuhealthv1alpha1.ReasonHumanUncordon), ContainSubstring("node-admin-tool"))))
}
