package job_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

var tmpl = gpuhealthv1alpha1.JobTemplate{Image: "dcgm", Command: []string{"dcgmi", "diag", "-r", "2"}, Privileged: true}

// namespace creates a namespace of its own for a test.
func namespace(t *testing.T, g *WithT) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "job-"}}
	g.Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
	return ns.Name
}

type state int

const (
	pending state = iota
	running
	succeeded
	failed
	podFailed // a failed pod counted, no condition yet
)

// create creates the Job Build makes and gives it the status the Job
// controller would write in that state.
func create(g *WithT, kind job.Kind, node, ns string, attempt int32, s state) *batchv1.Job {
	ctx := context.Background()
	j := job.Build(kind, node, ns, attempt, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), tmpl, 20*time.Minute, job.Env{ServiceAccount: job.DefaultServiceAccount})
	g.Expect(k8sClient.Create(ctx, j)).To(Succeed())
	setState(g, j, s)
	return j
}

func setState(g *WithT, j *batchv1.Job, s state) {
	start := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	if j.Status.StartTime != nil {
		// The apiserver keeps a running Job's start time: a second call a
		// second later must not move it.
		start = *j.Status.StartTime
	}
	end := metav1.NewTime(start.Add(30 * time.Second))
	cond := func(t batchv1.JobConditionType) batchv1.JobCondition {
		return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: "Test", LastTransitionTime: end, LastProbeTime: end}
	}
	switch s {
	case pending:
		return
	case running:
		j.Status = batchv1.JobStatus{StartTime: &start, Active: 1}
	case succeeded:
		j.Status = batchv1.JobStatus{StartTime: &start, CompletionTime: &end, Succeeded: 1,
			Conditions: []batchv1.JobCondition{cond(batchv1.JobSuccessCriteriaMet), cond(batchv1.JobComplete)}}
	case failed:
		j.Status = batchv1.JobStatus{StartTime: &start, Failed: 1,
			Conditions: []batchv1.JobCondition{cond(batchv1.JobFailureTarget), cond(batchv1.JobFailed)}}
	case podFailed:
		j.Status = batchv1.JobStatus{StartTime: &start, Failed: 1}
	}
	g.Expect(k8sClient.Status().Update(context.Background(), j)).To(Succeed())
}

func exists(g *WithT, j *batchv1.Job) bool {
	err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(j), &batchv1.Job{})
	if apierrors.IsNotFound(err) {
		return false
	}
	g.Expect(err).NotTo(HaveOccurred())
	return true
}

func TestDeleteUnfinished(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns, other := namespace(t, g), namespace(t, g)
	reset := create(g, job.ResetGPU, "node-1", ns, 1, pending)
	recert := create(g, job.Recertification, "node-1", ns, 2, running)
	passed := create(g, job.Recertification, "node-1", ns, 1, succeeded)
	rebooted := create(g, job.RebootNode, "node-1", ns, 1, failed)
	podFail := create(g, job.Recertification, "node-1", ns, 3, podFailed)
	otherNode := create(g, job.Recertification, "node-10", ns, 1, running)
	otherNS := create(g, job.Recertification, "node-1", other, 1, running)
	notOurs := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "not-built-by-gpuhealth", Namespace: ns, Labels: map[string]string{job.NodeLabel: "node-1"}},
		Spec:       recert.Spec,
	}
	notOurs.Spec.Selector, notOurs.Spec.Template.Labels = nil, nil
	g.Expect(k8sClient.Create(ctx, notOurs)).To(Succeed())

	var policies []metav1.DeletionPropagation
	spy := interceptor.NewClient(watchClient, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			o := client.DeleteOptions{}
			o.ApplyOptions(opts)
			if o.PropagationPolicy != nil {
				policies = append(policies, *o.PropagationPolicy)
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	deleted, err := job.DeleteUnfinished(ctx, spy, ns, "node-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(deleted).To(Equal([]string{recert.Name, reset.Name}), "the pending and the running Job, sorted")
	g.Expect(policies).To(Equal([]metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationBackground}))
	g.Expect(exists(g, reset)).To(BeFalse(), "gone at once: no orphan or foregroundDeletion finalizer waits for a garbage collector")
	g.Expect(exists(g, recert)).To(BeFalse())
	for _, kept := range []*batchv1.Job{passed, rebooted, podFail, otherNode, otherNS, notOurs} {
		g.Expect(exists(g, kept)).To(BeTrue(), "%s/%s stays", kept.Namespace, kept.Name)
	}

	deleted, err = job.DeleteUnfinished(ctx, k8sClient, ns, "node-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(deleted).To(BeEmpty(), "nothing left to delete")
}

func TestDeleteUnfinishedRaces(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := namespace(t, g)
	gone := create(g, job.ResetGPU, "node-1", ns, 1, running)
	finishes := create(g, job.Recertification, "node-1", ns, 1, running)
	changes := create(g, job.Recertification, "node-1", ns, 2, running)
	deleting := create(g, job.RebootNode, "node-1", ns, 1, running)
	deleting.Finalizers = []string{"test.gpuhealth.dev/hold"}
	g.Expect(k8sClient.Update(ctx, deleting)).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, deleting)).To(Succeed())
	t.Cleanup(func() {
		_ = k8sClient.Patch(ctx, deleting, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
	})

	// Between DeleteUnfinished's list and its deletes, someone else deletes
	// one Job, another finishes, and a third changes but still runs.
	raced := map[string]bool{}
	c := interceptor.NewClient(watchClient, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if !raced[obj.GetName()] {
				raced[obj.GetName()] = true
				switch obj.GetName() {
				case gone.Name:
					g.Expect(c.Delete(ctx, gone, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
				case finishes.Name:
					setState(g, finishes, succeeded)
				case changes.Name:
					changes.Status.Ready = new(int32(1))
					g.Expect(c.Status().Update(ctx, changes)).To(Succeed())
				}
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	deleted, err := job.DeleteUnfinished(ctx, c, ns, "node-1")
	g.Expect(err).NotTo(HaveOccurred(), "NotFound is not an error")
	g.Expect(deleted).To(Equal([]string{changes.Name}), "the one that changed but runs is read again and deleted")
	g.Expect(raced).To(HaveKey(finishes.Name), "the delete of the finishing Job was tried")
	g.Expect(exists(g, finishes)).To(BeTrue(), "finished between the list and the delete: the precondition kept it")
	g.Expect(exists(g, changes)).To(BeFalse())
	g.Expect(raced).NotTo(HaveKey(deleting.Name), "a Job being deleted is left to finish going")
}

func TestDeleteUnfinishedErrors(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := namespace(t, g)
	j := create(g, job.Recertification, "node-1", ns, 1, running)
	forbidden := apierrors.NewForbidden(batchv1.Resource("jobs"), j.Name, errors.New("test"))
	c := interceptor.NewClient(watchClient, interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error { return forbidden },
	})
	_, err := job.DeleteUnfinished(ctx, c, ns, "node-1")
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "wrapped with %%w: %v", err)
	g.Expect(err.Error()).To(ContainSubstring(j.Name))

	// A Job that keeps conflicting (a cache that stays behind) is an error
	// to retry on, not a delete without the precondition.
	conflict := apierrors.NewConflict(batchv1.Resource("jobs"), j.Name, errors.New("test"))
	tries := 0
	c = interceptor.NewClient(watchClient, interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			tries++
			return conflict
		},
	})
	_, err = job.DeleteUnfinished(ctx, c, ns, "node-1")
	g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
	g.Expect(tries).To(Equal(2), "one read again, one more try")
	g.Expect(exists(g, j)).To(BeTrue())
}
