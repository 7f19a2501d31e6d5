package job

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete,namespace=gpuhealth-system

// Kind is what a Job is for.
type Kind string

const (
	// Recertification proves a drained node fit to return.
	Recertification Kind = "recert"
	// ResetGPU resets the node's GPUs before recertification.
	ResetGPU Kind = "reset"
	// RebootNode reboots the node before recertification.
	RebootNode Kind = "reboot"
	// Certification proves a new node fit before it first takes work.
	Certification Kind = "cert"
	// CliqueCertification proves an NVLink clique's fabric after a fault.
	CliqueCertification Kind = "clique"
	// Diagnostics collects what the node knows before a reset or reboot.
	Diagnostics Kind = "diag"
	// DeviceReset resets one GPU out of service alone.
	DeviceReset Kind = "devreset"
	// DeviceRecertification tests one GPU out of service alone.
	DeviceRecertification Kind = "devcert"
)

const (
	// NodeLabel carries the node a Job runs for.
	NodeLabel = "gpuhealth.dev/node"
	// KindLabel carries the Job's Kind.
	KindLabel = "gpuhealth.dev/job-kind"
	// AttemptLabel carries the recertification attempt.
	AttemptLabel = "gpuhealth.dev/attempt"
	// DeviceLabel carries the device a per-GPU Job runs on (its name in
	// the driver's ResourceSlice, gpu-3).
	DeviceLabel = "gpuhealth.dev/device"
	// StepLabel carries the suite step a Job runs.
	StepLabel = "gpuhealth.dev/step"
	// ParserLabel carries how the Job's output is judged.
	ParserLabel = "gpuhealth.dev/parser"
	// AttemptStartedAnnotation holds when the attempt a Job belongs to
	// started (RFC 3339), for people; the name carries a hash of it.
	AttemptStartedAnnotation = "gpuhealth.dev/attempt-started"

	// finishedTTL keeps finished Jobs (and their pods' logs) for a day so a
	// human can read why a node failed recertification.
	finishedTTL = 24 * time.Hour
)

// Name is the deterministic name of the Job of a kind for a node and
// attempt, so a stale cache meets AlreadyExists instead of creating a second
// Job. It ends in the attempt number and a short hash of when the attempt
// started: a node's next remediation cycle counts attempts from 1 again, and
// the previous cycle's finished Jobs are kept a day for their logs, so
// without the start the next cycle would find them and read their result as
// its own (and the Job controller is slow to act on a Job recreated under a
// name it just saw deleted). Long node names are cut and hashed to keep the
// name within 63 characters (the Job controller copies it into a label).
func Name(kind Kind, node string, attempt int32, started time.Time) string {
	return nameOf(kind, node, strconv.Itoa(int(attempt)), started)
}

// nameOf is Name with the attempt's token as it is written in the name.
func nameOf(kind Kind, node, attempt string, started time.Time) string {
	prefix := "gpuhealth-" + string(kind) + "-"
	at := sha256.Sum256([]byte(started.UTC().Format(time.RFC3339)))
	suffix := "-" + attempt + "-" + hex.EncodeToString(at[:])[:5]
	if len(prefix)+len(node)+len(suffix) <= 63 {
		return prefix + node + suffix
	}
	sum := sha256.Sum256([]byte(node))
	hash := hex.EncodeToString(sum[:])[:8]
	keep := 63 - len(prefix) - len(suffix) - len(hash) - 1
	return prefix + strings.TrimRight(node[:keep], ".-") + "-" + hash + suffix
}

// Env is what a Job gets from the install and its policy besides its
// template.
type Env struct {
	// ServiceAccount is the pod's service account when the template names
	// none (Rules.ServiceAccount); its token is not mounted.
	ServiceAccount string
	// Quarantine is the policy's quarantine taint, which the pod
	// tolerates; nil: the policy taints nothing.
	Quarantine *gpuhealthv1alpha1.TaintSpec
	// NodeTaints are the taints the node carries when the Job is made,
	// which the pod tolerates exactly (key, value and effect): a GPU pool's
	// dedicated-node taint (nvidia.com/gpu:NoSchedule) must not keep the
	// node's own remediation and recertification off it, while a taint
	// put on later is not tolerated in advance.
	NodeTaints []corev1.Taint
}

// Build returns the Job of a kind for a node. The pod is pinned to the node
// with required node affinity on metadata.name (so the scheduler still
// checks resources such as nvidia.com/gpu), tolerates the taints gpuhealth
// and the node lifecycle put on a node it works on (Tolerations), never
// restarts, and the Job has no retries of its own: gpuhealth counts
// attempts. The caller has checked the template against the install's
// Rules and the node against the policy's nodeSelector.
func Build(kind Kind, node, namespace string, attempt int32, started time.Time, tmpl gpuhealthv1alpha1.JobTemplate, timeout time.Duration, env Env) *batchv1.Job {
	ours := map[string]string{NodeLabel: node, KindLabel: string(kind), AttemptLabel: strconv.Itoa(int(attempt))}
	affinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: onNodes(node)},
	}}
	return build(Name(kind, node, attempt, started), namespace, kind, ours, started.UTC().Format(time.RFC3339), tmpl, affinity, timeout, env)
}

// Tolerations are the taints a Job's pod tolerates, each by key and
// effect, never every taint: the policy's quarantine taint, gpuhealth's
// uncertified and fabric-degraded taints, and those the node lifecycle
// puts on a cordoned node (unschedulable) and on one that stops reporting
// during a reset or reboot (not-ready, unreachable; without
// tolerationSeconds, so the pod is not evicted while the node comes back).
// The node's own taints when the Job is made are added by Build (Env's
// NodeTaints), each exactly; nothing else is tolerated.
func Tolerations(quarantine *gpuhealthv1alpha1.TaintSpec) []corev1.Toleration {
	exists := func(key string, effect corev1.TaintEffect) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: effect}
	}
	out := []corev1.Toleration{}
	if quarantine != nil {
		out = append(out, exists(quarantine.Key, quarantine.Effect))
	}
	return append(out,
		exists(gpuhealthv1alpha1.UncertifiedTaintKey, corev1.TaintEffectNoSchedule),
		exists(gpuhealthv1alpha1.FabricDegradedTaintKey, corev1.TaintEffectNoSchedule),
		exists(corev1.TaintNodeUnschedulable, corev1.TaintEffectNoSchedule),
		exists(corev1.TaintNodeNotReady, corev1.TaintEffectNoExecute),
		exists(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute),
	)
}

// withNodeTaints adds an exact toleration of each of the node's taints
// that out does not tolerate yet.
func withNodeTaints(out []corev1.Toleration, taints []corev1.Taint) []corev1.Toleration {
	for i := range taints {
		t := &taints[i]
		if slices.ContainsFunc(out, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), t, false) }) {
			continue
		}
		out = append(out, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpEqual, Value: t.Value, Effect: t.Effect})
	}
	return out
}

// onNodes is one node-affinity term per node (terms are ORed; a field
// selector takes one value).
func onNodes(nodes ...string) []corev1.NodeSelectorTerm {
	terms := make([]corev1.NodeSelectorTerm, 0, len(nodes))
	for _, n := range nodes {
		terms = append(terms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n},
		}}})
	}
	return terms
}

// build is the Job every kind shares: our labels on the Job and its pod
// (over the template's), one container named for the kind, the taints of
// Tolerations tolerated, the service account of env unless the template
// names one (whose token alone is mounted), no restart and no retry of its
// own, the deadline and a day's TTL for the logs.
func build(name, namespace string, kind Kind, ours map[string]string, started string, tmpl gpuhealthv1alpha1.JobTemplate, affinity *corev1.Affinity, timeout time.Duration, env Env) *batchv1.Job {
	labels := map[string]string{}
	for k, v := range tmpl.Labels {
		labels[k] = v
	}
	for k, v := range ours {
		labels[k] = v
	}
	container := corev1.Container{
		Name:            string(kind),
		Image:           tmpl.Image,
		ImagePullPolicy: tmpl.ImagePullPolicy,
		Command:         tmpl.Command,
		Args:            tmpl.Args,
		Env:             tmpl.Env,
	}
	if tmpl.Resources != nil {
		container.Resources = *tmpl.Resources
	}
	if tmpl.Privileged {
		container.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	// A named account is one the install allowed (Rules) for its rights;
	// gpuhealth's own has none, so its token would only be something to steal.
	account, token := tmpl.ServiceAccountName, true
	if account == "" || account == env.ServiceAccount {
		account, token = env.ServiceAccount, false
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, Labels: ours,
			Annotations: map[string]string{AttemptStartedAnnotation: started},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](0),
			ActiveDeadlineSeconds:   ptr.To(deadlineSeconds(timeout)),
			TTLSecondsAfterFinished: ptr.To(int32(finishedTTL.Seconds())),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: tmpl.Annotations},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					ServiceAccountName:           account,
					AutomountServiceAccountToken: ptr.To(token),
					PriorityClassName:            tmpl.PriorityClassName,
					HostPID:                      tmpl.HostPID,
					Containers:                   []corev1.Container{container},
					Tolerations:                  withNodeTaints(Tolerations(env.Quarantine), env.NodeTaints),
					Affinity:                     affinity,
				},
			},
		},
	}
}

// Ensure creates the Job unless it exists, and returns the live one.
func Ensure(ctx context.Context, c client.Client, want *batchv1.Job) (*batchv1.Job, error) {
	got := &batchv1.Job{}
	err := c.Get(ctx, client.ObjectKeyFromObject(want), got)
	if err == nil {
		return got, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("getting job %s: %w", want.Name, err)
	}
	if err := c.Create(ctx, want); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Our cache was behind; the Job is there. Read it next time.
			return want, nil
		}
		return nil, fmt.Errorf("creating job %s: %w", want.Name, err)
	}
	return want, nil
}

// Result reads a Job's outcome from its conditions and counters.
func Result(j *batchv1.Job) (gpuhealthv1alpha1.JobResult, string) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
			return gpuhealthv1alpha1.JobSucceeded, "job completed"
		case batchv1.JobFailed, batchv1.JobFailureTarget:
			msg := c.Message
			if msg == "" {
				msg = c.Reason
			}
			return gpuhealthv1alpha1.JobFailed, fmt.Sprintf("job failed: %s", msg)
		}
	}
	if j.Status.Failed > 0 {
		return gpuhealthv1alpha1.JobFailed, "job pod failed"
	}
	if j.Status.Active > 0 {
		return gpuhealthv1alpha1.JobRunning, "job running"
	}
	return gpuhealthv1alpha1.JobPending, "job pending"
}

// DeleteUnfinished deletes the node's Jobs in namespace — every Kind, those
// labelled NodeLabel=node that Build made — whose Result is neither
// JobSucceeded nor JobFailed, and returns the names it deleted, sorted. It
// is for a workflow that ends early (a human's uncordon cancels it, a
// release returns the node) while a privileged reset, reboot or
// recertification Job of it may still run or wait to be scheduled.
//
// The delete propagates in the background, so the garbage collector removes
// the Jobs' pods too (orphaned, they would keep running on the node). Each
// delete is conditional on the UID and resourceVersion read, so a Job that
// finishes between the list and the delete is read again and kept:
// finished Jobs stay for their logs until their TTL (a day) removes them. A
// Job already gone (NotFound) or already being deleted is not an error and
// not in the result. c may read from a cache: a Job created moments ago may
// be missed, and a Job changed since it was cached costs one more read;
// a Job that still conflicts after that is an error to retry on.
func DeleteUnfinished(ctx context.Context, c client.Client, namespace, node string) ([]string, error) {
	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{NodeLabel: node}, client.HasLabels{KindLabel}); err != nil {
		return nil, fmt.Errorf("listing jobs of node %s: %w", node, err)
	}
	var deleted []string
	for i := range jobs.Items {
		j := &jobs.Items[i]
		ok, err := deleteIfUnfinished(ctx, c, j)
		if apierrors.IsConflict(err) {
			// Changed since it was read: read it again, it may have finished.
			if err = c.Get(ctx, client.ObjectKeyFromObject(j), j); err == nil {
				ok, err = deleteIfUnfinished(ctx, c, j)
			}
		}
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return deleted, fmt.Errorf("deleting job %s/%s of node %s: %w", namespace, j.Name, node, err)
		case ok:
			deleted = append(deleted, j.Name)
		}
	}
	slices.Sort(deleted)
	return deleted, nil
}

// deleteIfUnfinished deletes j, as read, unless it finished or is being
// deleted already, and says whether it did.
func deleteIfUnfinished(ctx context.Context, c client.Client, j *batchv1.Job) (bool, error) {
	if !j.DeletionTimestamp.IsZero() {
		return false, nil
	}
	if r, _ := Result(j); r == gpuhealthv1alpha1.JobSucceeded || r == gpuhealthv1alpha1.JobFailed {
		return false, nil
	}
	uid, rv := j.UID, j.ResourceVersion
	err := c.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &uid, ResourceVersion: &rv})
	return err == nil, err
}

// deadlineSeconds is a step's timeout as activeDeadlineSeconds: whole
// seconds, rounded up, and at least 1. The schema refuses a timeout under a
// second; one stored before it did would otherwise become 0, which the
// apiserver refuses, and the step could never start.
func deadlineSeconds(timeout time.Duration) int64 {
	return max(1, int64(math.Ceil(timeout.Seconds())))
}
