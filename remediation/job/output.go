package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Listing the Job's pods needs no rule of its own: the drain's ClusterRole
// rule reads pods everywhere (remediation/drain/rbac.go).
// +kubebuilder:rbac:groups="",resources=pods/log,verbs=get,namespace=gpuhealth-system

// OutputLimit bounds how much of a Job's output is read: a DCGM level 4
// JSON report or an nccl-tests report is far smaller.
const OutputLimit = 4 << 20

// ErrNoOutput says a finished Job's output can no longer be read: its pod
// is gone, or the kubelet has no log for it.
var ErrNoOutput = errors.New("no output: the job's pod or its log is gone")

// OutputReader reads what a finished Job's pod printed.
type OutputReader interface {
	// Output returns the output of the Job's pod (of completion index 0 for
	// an Indexed Job). An error wrapping ErrNoOutput is final; any other is
	// worth retrying.
	Output(ctx context.Context, namespace, job string) ([]byte, error)
}

// LogReader reads Job output from the pod's log through the apiserver.
type LogReader struct {
	Clientset kubernetes.Interface
}

// Output implements OutputReader.
func (r LogReader) Output(ctx context.Context, namespace, job string) ([]byte, error) {
	pods, err := r.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, fmt.Errorf("listing pods of job %s/%s: %w", namespace, job, err)
	}
	pod := outputPod(pods.Items)
	if pod == nil {
		return nil, fmt.Errorf("job %s/%s: %w", namespace, job, ErrNoOutput)
	}
	opts := &corev1.PodLogOptions{Container: pod.Spec.Containers[0].Name, LimitBytes: ptr.To[int64](OutputLimit)}
	out, err := r.Clientset.CoreV1().Pods(namespace).GetLogs(pod.Name, opts).DoRaw(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("log of pod %s/%s: %w", namespace, pod.Name, ErrNoOutput)
		}
		return nil, fmt.Errorf("reading log of pod %s/%s: %w", namespace, pod.Name, err)
	}
	return out, nil
}

// outputPod picks the pod whose output judges the Job: completion index 0
// for an Indexed Job, else the most recently created pod that finished.
func outputPod(pods []corev1.Pod) *corev1.Pod {
	var done []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if len(p.Spec.Containers) == 0 {
			continue
		}
		if idx, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
			if idx == "0" && finished(p) {
				return p
			}
			continue
		}
		if finished(p) {
			done = append(done, p)
		}
	}
	if len(done) == 0 {
		return nil
	}
	sort.Slice(done, func(i, j int) bool { return done[i].CreationTimestamp.After(done[j].CreationTimestamp.Time) })
	return done[0]
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// FinishedAt is when a finished Job finished: its completion time, else
// when its Complete or Failed condition turned True, else its creation.
func FinishedAt(j *batchv1.Job) time.Time {
	if j.Status.CompletionTime != nil {
		return j.Status.CompletionTime.Time
	}
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobFailed || c.Type == batchv1.JobComplete) {
			return c.LastTransitionTime.Time
		}
	}
	return j.CreationTimestamp.Time
}
