package job

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A try after one that never ran gets a name of its own, within 63
// characters; try 0 keeps the step's name.
func TestStepTryName(t *testing.T) {
	g := NewWithT(t)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	g.Expect(StepTryName(Certification, "dcgm", "n", 1, at, 0)).To(Equal(StepName(Certification, "dcgm", "n", 1, at)))
	g.Expect(StepTryName(Certification, "", "n", 1, at, 0)).To(Equal(Name(Certification, "n", 1, at)), "recertification.job keeps Build's name")
	tried := StepTryName(Certification, "dcgm", "n", 1, at, 2)
	g.Expect(tried).To(HavePrefix("gpuhealth-cert-dcgm-n-1t2-"))
	g.Expect(tried).NotTo(Equal(StepName(Certification, "dcgm", "n", 1, at)))
	g.Expect(StepTryName(Certification, "a", "n", 1, at, 1)).NotTo(Equal(StepName(Certification, "a-t1", "n", 1, at)), "a step named like another's try")
	long := StepTryName(Recertification, "sixteen-chars-ab", strings.Repeat("n", 63), 20, at, 19)
	g.Expect(len(long)).To(BeNumerically("<=", 63))
}

func TestRanAndDeadline(t *testing.T) {
	g := NewWithT(t)
	deadline := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonDeadlineExceeded}
	backoff := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded}
	g.Expect(Ran(&batchv1.Job{Status: batchv1.JobStatus{Active: 1, Ready: ptr.To[int32](0)}})).To(BeFalse(), "active is not running: it may be pending")
	g.Expect(Ran(&batchv1.Job{Status: batchv1.JobStatus{Active: 1, Ready: ptr.To[int32](1)}})).To(BeTrue())
	g.Expect(Ran(&batchv1.Job{Status: batchv1.JobStatus{Succeeded: 1}})).To(BeTrue())
	g.Expect(Ran(&batchv1.Job{Status: batchv1.JobStatus{Failed: 1, Conditions: []batchv1.JobCondition{deadline}}})).To(BeFalse(), "a pod killed by the deadline counts as failed, ran or not")
	g.Expect(DeadlineExceeded(&batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{deadline}}})).To(BeTrue())
	g.Expect(DeadlineExceeded(&batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{backoff}}})).To(BeFalse(), "a pod that failed ran")
}

func TestNotRunning(t *testing.T) {
	pod := func(name string, age time.Duration, mutate func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(-age))},
			Status: corev1.PodStatus{Phase: corev1.PodPending}}
		if mutate != nil {
			mutate(&p)
		}
		return p
	}
	unscheduled := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			Message: "0/1 nodes are available: 1 Insufficient example.com/gpu."}}
	}
	pulling := func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "test", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "dcgm:4"`}}}}
	}
	creating := func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "test", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
	}
	cases := []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"no pod yet", nil, "no pod made yet"},
		{"not schedulable", []corev1.Pod{pod("a", 0, unscheduled)}, "pod a not scheduled (Unschedulable): 0/1 nodes are available: 1 Insufficient example.com/gpu."},
		{"image not pulled", []corev1.Pod{pod("a", 0, pulling)}, `pod a container test waiting (ImagePullBackOff): Back-off pulling image "dcgm:4"`},
		{"being created", []corev1.Pod{pod("a", 0, creating)}, "pod a pending"},
		{"running", []corev1.Pod{pod("a", 0, func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning })}, ""},
		{"the newest pod speaks", []corev1.Pod{pod("old", time.Hour, unscheduled), pod("new", 0, pulling)}, `pod new container test waiting (ImagePullBackOff): Back-off pulling image "dcgm:4"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { NewWithT(t).Expect(notRunning(tc.pods)).To(Equal(tc.want)) })
	}
}
