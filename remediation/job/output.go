package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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

// OutputLimit is how much of a Job's output is kept and judged: all of it
// when shorter, else its last OutputLimit bytes. A DCGM level 4 JSON report
// or an nccl-tests report is far smaller; a chatty run (NCCL_DEBUG=INFO)
// can print more, and nccl-tests prints its table and its "Out of bounds"
// line last, so the end is what is kept.
const OutputLimit = 4 << 20

// OutputReadLimit is how much of a Job's log is read at most, to find its
// end: a log longer than that is not judged (ErrOutputTooLong).
const OutputReadLimit = 64 << 20

// ErrNoOutput says a finished Job's output can no longer be read: its pod
// is gone, or the kubelet has no log for it.
var ErrNoOutput = errors.New("no output: the job's pod or its log is gone")

// ErrOutputTooLong says a Job printed more than OutputReadLimit: it is not
// read to its end, and is final (reading again will not shorten it).
var ErrOutputTooLong = fmt.Errorf("the job printed more than the %d MiB the operator reads", OutputReadLimit>>20)

// Final says whether an error of Output is final (ErrNoOutput,
// ErrOutputTooLong); any other is worth retrying.
func Final(err error) bool { return errors.Is(err, ErrNoOutput) || errors.Is(err, ErrOutputTooLong) }

// CutNote says that output of total bytes was cut to its last OutputLimit
// bytes, naming the limit; empty when total is within it.
func CutNote(total int64) string {
	if total <= OutputLimit {
		return ""
	}
	return fmt.Sprintf("the job printed %d bytes, over the %d MiB the operator keeps: only its last %d MiB was judged", total, OutputLimit>>20, OutputLimit>>20)
}

// OutputReader reads what a finished Job's pod printed.
type OutputReader interface {
	// Output returns the output of the Job's pod (of completion index 0 for
	// an Indexed Job): all of it, or its last OutputLimit bytes, and how
	// many bytes it printed in all (see CutNote). An error that is Final
	// will not go away; any other is worth retrying.
	Output(ctx context.Context, namespace, job string) (text []byte, total int64, err error)
}

// LogReader reads Job output from the pod's log through the apiserver.
type LogReader struct {
	Clientset kubernetes.Interface
}

// Output implements OutputReader: the log is streamed, keeping its end.
func (r LogReader) Output(ctx context.Context, namespace, job string) ([]byte, int64, error) {
	pods, err := r.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, 0, fmt.Errorf("listing pods of job %s/%s: %w", namespace, job, err)
	}
	pod := outputPod(pods.Items)
	if pod == nil {
		return nil, 0, fmt.Errorf("job %s/%s: %w", namespace, job, ErrNoOutput)
	}
	opts := &corev1.PodLogOptions{Container: pod.Spec.Containers[0].Name, LimitBytes: ptr.To[int64](OutputReadLimit + 1)}
	stream, err := r.Clientset.CoreV1().Pods(namespace).GetLogs(pod.Name, opts).Stream(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, 0, fmt.Errorf("log of pod %s/%s: %w", namespace, pod.Name, ErrNoOutput)
		}
		return nil, 0, fmt.Errorf("reading log of pod %s/%s: %w", namespace, pod.Name, err)
	}
	defer func() { _ = stream.Close() }()
	text, total, err := readTail(stream, OutputLimit, OutputReadLimit)
	if err != nil {
		return nil, total, fmt.Errorf("reading log of pod %s/%s: %w", namespace, pod.Name, err)
	}
	return text, total, nil
}

// readTail reads r to its end and returns its last keep bytes and how many
// it read; past limit bytes it stops with ErrOutputTooLong.
func readTail(r io.Reader, keep, limit int64) ([]byte, int64, error) {
	// Twice keep, shifted down when full: each byte is copied at most once
	// more, and the last keep bytes are always in one piece.
	buf := make([]byte, 0, min(2*keep, 64<<10))
	var total int64
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			total += int64(n)
			if total > limit {
				return nil, total, ErrOutputTooLong
			}
			buf = append(buf, chunk[:n]...)
			if int64(len(buf)) >= 2*keep {
				buf = append(buf[:0], buf[int64(len(buf))-keep:]...)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, total, err
		}
	}
	if int64(len(buf)) > keep {
		buf = buf[int64(len(buf))-keep:]
	}
	return buf, total, nil
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

// WaitReader says why a Job's pod is not running yet.
type WaitReader interface {
	// NotRunning returns why the Job's newest pod does not run yet, in the
	// scheduler's or kubelet's words ("" when it runs or has finished).
	NotRunning(ctx context.Context, namespace, job string) (string, error)
}

// NotRunning implements WaitReader from the Job's pods.
func (r LogReader) NotRunning(ctx context.Context, namespace, job string) (string, error) {
	pods, err := r.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return "", fmt.Errorf("listing pods of job %s/%s: %w", namespace, job, err)
	}
	return notRunning(pods.Items), nil
}

// notRunning says why the newest of a Job's pods does not run: not
// scheduled (the scheduler's message), or a container waiting for a
// reason other than being created (an image not pulled, a config error).
func notRunning(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "no pod made yet"
	}
	pod := slices.MaxFunc(pods, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	if pod.Status.Phase != corev1.PodPending {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("pod %s not scheduled (%s): %s", pod.Name, c.Reason, c.Message)
		}
	}
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return fmt.Sprintf("pod %s container %s waiting (%s): %s", pod.Name, cs.Name, w.Reason, w.Message)
		}
	}
	return fmt.Sprintf("pod %s pending", pod.Name)
}
