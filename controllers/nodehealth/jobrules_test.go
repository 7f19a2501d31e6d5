package nodehealth

import (
	"testing"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// TestBreachingPolicyIsNotActedOn: a node whose policy breaks the
// install's Job rules is neither fenced nor drained and gets no Job; its
// NodeHealth says why. Once the policy is fixed the node is quarantined.
func TestBreachingPolicyIsNotActedOn(t *testing.T) {
	cases := []struct {
		name   string
		breach func(*gpuhealthv1alpha1.JobTemplate)
		want   string
	}{
		{
			name:   "the reboot Job asks for the operator's service account",
			breach: func(j *gpuhealthv1alpha1.JobTemplate) { j.ServiceAccountName = FieldManager },
			want:   `spec.remediation.rebootNode.job: serviceAccountName "gpuhealth-operator" is gpuhealth's own identity and never a Job's`,
		},
		{
			name:   "the reboot Job's image is from a registry the install does not allow",
			breach: func(j *gpuhealthv1alpha1.JobTemplate) { j.Image = "docker.io/attacker/reboot:1" },
			want:   `spec.remediation.rebootNode.job: image "docker.io/attacker/reboot:1" is not from an allowed registry`,
		},
		{
			name: "the reboot Job reads a Secret into its environment",
			breach: func(j *gpuhealthv1alpha1.JobTemplate) {
				j.Env = []corev1.EnvVar{{Name: "T", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "gpuhealth-operator-token"}, Key: "token"}}}}
			},
			want: `spec.remediation.rebootNode.job: env "T" takes its value from valueFrom`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Recertification.Job = jobTemplate()
				s.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reboot"}}
				tc.breach(&s.Remediation.RebootNode.Job)
			})
			n := h.node("a", nil)
			h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
			for range 3 {
				h.reconcile(n.Name)
			}
			node := h.getNode(n.Name)
			h.g.Expect(node.Spec.Unschedulable).To(BeFalse(), "not cordoned")
			h.g.Expect(hasQuarantineTaint(node)).To(BeFalse(), "not tainted")
			h.g.Expect(h.nodeJobs(n.Name)).To(BeEmpty(), "no Job")
			nh := h.nodeHealth(n.Name)
			h.g.Expect(nh.Status.Phase).To(BeEmpty(), "no transition")
			managed := meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
			h.g.Expect(managed).NotTo(BeNil())
			h.g.Expect(managed.Status).To(Equal(metav1.ConditionFalse))
			h.g.Expect(managed.Reason).To(Equal(gpuhealthv1alpha1.ReasonJobRulesBreached))
			h.g.Expect(managed.Message).To(ContainSubstring(tc.want))

			// Fixed: the node is quarantined and fenced.
			h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Name: p.Name}, p)).To(Succeed())
			p.Spec.Remediation.RebootNode.Job = gpuhealthv1alpha1.JobTemplate{Image: "reboot"}
			h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())
			h.reconcile(n.Name)
			h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue(), "acted on once the policy keeps the rules")
			h.g.Expect(meta.IsStatusConditionTrue(h.nodeHealth(n.Name).Status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)).To(BeTrue())
		})
	}
}

// TestJobsRunAsTheJobAccount: the Jobs the reconciler creates run as the
// install's Job service account without its token, and tolerate only the
// taints they must, each by key.
func TestJobsRunAsTheJobAccount(t *testing.T) {
	h := newHarness(t)
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Remediation.RebootNode = &gpuhealthv1alpha1.RemediationStep{Job: gpuhealthv1alpha1.JobTemplate{Image: "reboot", Privileged: true, HostPID: true}}
	})
	n := h.node("a", nil)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	for range 4 {
		h.reconcile(n.Name)
	}
	j := &batchv1.Job{}
	h.g.Expect(k8sClient.Get(h.ctx, types.NamespacedName{Namespace: jobNamespace, Name: h.jobName(job.RebootNode, n.Name, 1)}, j)).To(Succeed())
	pod := j.Spec.Template.Spec
	h.g.Expect(pod.ServiceAccountName).To(Equal(job.DefaultServiceAccount))
	h.g.Expect(pod.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
	h.g.Expect(pod.Tolerations).NotTo(BeEmpty())
	for _, tol := range pod.Tolerations {
		h.g.Expect(tol.Key).NotTo(BeEmpty(), "no toleration of every taint")
	}
	h.g.Expect(pod.Tolerations).To(ContainElement(corev1.Toleration{Key: "gpuhealth.dev/quarantined", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}),
		"the policy's quarantine taint (the schema's default)")
}

// nodeJobs are the names of the Jobs of a node in the Jobs' namespace.
func (h *harness) nodeJobs(node string) []string {
	h.t.Helper()
	list := &batchv1.JobList{}
	h.g.Expect(k8sClient.List(h.ctx, list, &client.ListOptions{Namespace: jobNamespace}, client.MatchingLabels{job.NodeLabel: node})).To(Succeed())
	var out []string
	for _, j := range list.Items {
		out = append(out, j.Name)
	}
	return out
}

// TestNoInputsForABreachingPolicy: a node whose policy breaks the Job rules
// reads none of its phase's costly inputs, so nothing acts before deciding
// either (a draining node's drain pass, a breaker reset).
func TestNoInputsForABreachingPolicy(t *testing.T) {
	g := NewWithT(t)
	o := obs(inPhase(draining), fenced)
	g.Expect(inputsFor(o).drain).To(BeTrue(), "the control: a draining node drains")
	o.breaches = []string{"spec.remediation.rebootNode.job: image \"x\" is not from an allowed registry (none)"}
	g.Expect(inputsFor(o)).To(Equal(inputs{}))
}
