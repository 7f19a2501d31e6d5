package computedomain

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
	"github.com/gpuhealth/gpuhealth/remediation/suite"
)

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete;patch,namespace=gpuhealth-system

const (
	defaultCliqueTimeout     = 30 * time.Minute
	defaultCliqueBackoff     = 5 * time.Minute
	defaultCliqueMaxAttempts = 3
	// cliqueRecheck bounds the wait for a clique Job; its updates enqueue
	// the clique sooner.
	cliqueRecheck = time.Minute
	// outputRetry is how long after its Job finished an unreadable output
	// is asked for again before the attempt fails for want of it.
	outputRetry = 5 * time.Minute
)

// verdictPassed is VerdictAnnotation's value on a Job that passed.
const verdictPassed = "passed"

// cliqueCert is what a clique certification decision knows: the policy's
// test, the fault episode, its Jobs and the clique's healthy nodes.
type cliqueCert struct {
	spec *gpuhealthv1alpha1.CliqueCertificationSpec
	// since names the episode (FabricSinceAnnotation of the tainted nodes).
	since string
	// jobs are the episode's Jobs.
	jobs []*batchv1.Job
	// healthy are the clique's nodes in service (managed, Healthy, Ready), sorted.
	healthy []string
	now     time.Time
	// cliqueID is the clique.
	cliqueID string
	// env is what the Job gets besides its template.
	env job.Env
}

// certStep is what to do about a clique whose fault resolved.
type certStep struct {
	// lift: the clique passed; the fabric taints go.
	lift bool
	// create is the next attempt's Job.
	create *batchv1.Job
	// judge is a finished Job that has no verdict yet.
	judge *batchv1.Job
	// exhausted: the last attempt failed; the taint stays for a human.
	exhausted bool
	// requeue is when to look again; zero: on the next change.
	requeue time.Duration
	message string
}

// decideCliqueCert is the clique certification as a pure function of what
// is known: one attempt at a time, judged once, the next after the backoff,
// the taint lifted on the first pass.
func decideCliqueCert(c cliqueCert, namespace string) certStep {
	spec := c.spec
	maxAttempts := spec.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = defaultCliqueMaxAttempts
	}
	var latest *batchv1.Job
	var attempt int32
	for _, j := range c.jobs {
		if a := jobAttempt(j); latest == nil || a > attempt {
			latest, attempt = j, a
		}
	}
	if latest != nil {
		verdict, judged := latest.Annotations[job.VerdictAnnotation]
		switch {
		case judged && verdict == verdictPassed:
			return certStep{lift: true, message: fmt.Sprintf("attempt %d passed", attempt)}
		case !judged:
			res, msg := job.Result(latest)
			if res == gpuhealthv1alpha1.JobSucceeded || res == gpuhealthv1alpha1.JobFailed {
				return certStep{judge: latest}
			}
			return certStep{requeue: cliqueRecheck, message: fmt.Sprintf("attempt %d: job %s/%s %s", attempt, latest.Namespace, latest.Name, msg)}
		case attempt >= maxAttempts:
			return certStep{exhausted: true, message: fmt.Sprintf("attempt %d of %d %s; the fabric-degraded taint stays until a human deletes the clique's Jobs or the taint", attempt, maxAttempts, verdict)}
		}
		until := job.FinishedAt(latest).Add(spec.Backoff.Get(defaultCliqueBackoff))
		if c.now.Before(until) {
			return certStep{requeue: until.Sub(c.now), message: fmt.Sprintf("attempt %d %s; next attempt after %s", attempt, verdict, until.UTC().Format(time.RFC3339))}
		}
	}
	if len(c.healthy) == 0 {
		return certStep{requeue: cliqueRecheck, message: "waiting for a node of the clique to be in service to take part"}
	}
	n, err := budget.Limit(spec.Nodes, len(c.healthy), intstr.FromString("100%"))
	if err != nil {
		return certStep{requeue: cliqueRecheck, message: err.Error()}
	}
	n = min(max(n, 1), len(c.healthy))
	parser := spec.Parser.Type
	if parser == "" {
		parser = gpuhealthv1alpha1.ParserNCCLTests
	}
	j := job.BuildClique(c.cliqueID, c.since, namespace, attempt+1, c.healthy[:n], spec.Job, parser, spec.Timeout.Get(defaultCliqueTimeout), c.env)
	return certStep{create: j, requeue: cliqueRecheck, message: fmt.Sprintf("attempt %d on %d nodes: %s", attempt+1, n, strings.Join(c.healthy[:n], ", "))}
}

func jobAttempt(j *batchv1.Job) int32 {
	a, _ := strconv.Atoi(j.Labels[job.AttemptLabel])
	return int32(a)
}

// certifyClique runs the clique's certification for the episode of its
// tainted nodes and says whether the taint may go now; requeue is when to
// look again.
func (r *FabricReconciler) certifyClique(ctx context.Context, clique string, spec *gpuhealthv1alpha1.CliqueCertificationSpec,
	nodes []corev1.Node, tainted []*corev1.Node, healthy []string, env job.Env) (lift bool, requeue time.Duration, err error) {
	logger := log.FromContext(ctx)
	since := episodeOf(tainted)
	list := &batchv1.JobList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Namespace), client.MatchingLabels{
		job.KindLabel: string(job.CliqueCertification), job.CliqueLabel: clique, job.EpisodeLabel: job.Episode(since)}); err != nil {
		return false, 0, fmt.Errorf("listing certification jobs of clique %s: %w", clique, err)
	}
	c := cliqueCert{spec: spec, since: since, healthy: healthy, now: r.Clock.Now(), cliqueID: clique, env: env}
	for i := range list.Items {
		c.jobs = append(c.jobs, &list.Items[i])
	}
	step := decideCliqueCert(c, r.Namespace)
	switch {
	case step.lift:
		return true, 0, nil
	case step.judge != nil:
		passed, why, err := r.judgeClique(ctx, spec, step.judge, nodes)
		if apierrors.IsConflict(err) {
			return false, time.Second, nil // judged already, or changed: read it again
		}
		if err != nil {
			return false, 0, err
		}
		result, eventType, reason := "failed", corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonCliqueCertificationFailed
		if passed {
			result, eventType, reason = verdictPassed, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonCliqueCertified
		}
		cliqueCertifications.WithLabelValues(result).Inc()
		logger.Info("Judged clique certification", "job", step.judge.Name, "result", result, "message", why)
		for _, n := range tainted {
			r.Recorder.Eventf(n, nil, eventType, reason, "Certify", "NVLink clique %s, certification job %s/%s %s: %s", clique, step.judge.Namespace, step.judge.Name, result, why)
		}
		if passed {
			return true, 0, nil
		}
		return false, time.Second, nil
	case step.create != nil:
		if _, err := job.Ensure(ctx, r.Client, step.create); err != nil {
			return false, 0, err
		}
		if !slices.ContainsFunc(c.jobs, func(j *batchv1.Job) bool { return j.Name == step.create.Name }) {
			logger.Info("Started clique certification", "job", step.create.Name, "plan", step.message)
			for _, n := range tainted {
				r.Recorder.Eventf(n, nil, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonCliqueCertifying, "Certify",
					"NVLink clique %s: the fabric fault resolved; certification job %s/%s, %s; the fabric-degraded taint stays until it passes", clique, step.create.Namespace, step.create.Name, step.message)
			}
		}
	}
	if step.message != "" {
		logger.V(1).Info("Clique certification", "state", step.message)
	}
	return false, step.requeue, nil
}

// judgeClique judges a finished clique Job by completion index 0's output
// and records the verdict on the Job, once.
func (r *FabricReconciler) judgeClique(ctx context.Context, spec *gpuhealthv1alpha1.CliqueCertificationSpec, j *batchv1.Job, nodes []corev1.Node) (bool, string, error) {
	res, msg := job.Result(j)
	parser := spec.Parser
	if parser.Type == "" {
		parser.Type = gpuhealthv1alpha1.ParserNCCLTests
	}
	var text []byte
	var total int64
	var outErr error
	if parser.Type != gpuhealthv1alpha1.ParserExitCode {
		if r.Outputs == nil {
			outErr = fmt.Errorf("the operator reads no job output: %w", job.ErrNoOutput)
		} else if text, total, outErr = r.Outputs.Output(ctx, j.Namespace, j.Name); outErr != nil && !job.Final(outErr) &&
			r.Clock.Since(job.FinishedAt(j)) < outputRetry {
			// Asked again on the next pass; past outputRetry the attempt
			// fails for want of its output.
			return false, "", outErr
		}
	}
	labels := map[string]string{}
	if participants := jobNodes(j); len(participants) > 0 {
		for i := range nodes {
			if nodes[i].Name == participants[0] {
				labels = nodes[i].Labels
			}
		}
	}
	v := suite.Judge(parser, res == gpuhealthv1alpha1.JobSucceeded, msg, text, job.CutNote(total), outErr, labels)
	why := v.Message
	for _, m := range v.Measurements {
		if m.Name == "busBandwidth" {
			why += fmt.Sprintf(" (%s %s %s)", m.Name, m.Value, m.Unit)
		}
	}
	verdict := verdictPassed
	if !v.Passed {
		verdict = "failed: " + why
	}
	// The optimistic lock makes a cache that does not show the verdict yet
	// meet a conflict instead of judging (and announcing) the Job twice.
	patch := client.MergeFromWithOptions(j.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[job.VerdictAnnotation] = gpuhealthv1alpha1.Truncate(verdict, 1024)
	if err := r.Client.Patch(ctx, j, patch); err != nil {
		return false, "", fmt.Errorf("recording the verdict on job %s/%s: %w", j.Namespace, j.Name, err)
	}
	return v.Passed, why, nil
}

// jobNodes are the nodes a clique Job's pods may run on, in order.
func jobNodes(j *batchv1.Job) []string {
	a := j.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out []string
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" {
				out = append(out, f.Values...)
			}
		}
	}
	return out
}

// stopCliqueCerts deletes the clique's unfinished certification Jobs: its
// fault is back, or no policy asks for the test any more. With a fault
// back (now set) and any Job of the episode there, it starts a new episode
// on the tainted nodes, so the next certification starts from attempt 1
// under new names.
func (r *FabricReconciler) stopCliqueCerts(ctx context.Context, clique string, tainted []*corev1.Node, now *time.Time) error {
	list := &batchv1.JobList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Namespace), client.MatchingLabels{
		job.KindLabel: string(job.CliqueCertification), job.CliqueLabel: clique}); err != nil {
		return fmt.Errorf("listing certification jobs of clique %s: %w", clique, err)
	}
	episode := job.Episode(episodeOf(tainted))
	inEpisode := false
	for i := range list.Items {
		j := &list.Items[i]
		inEpisode = inEpisode || j.Labels[job.EpisodeLabel] == episode
		if res, _ := job.Result(j); res == gpuhealthv1alpha1.JobSucceeded || res == gpuhealthv1alpha1.JobFailed || j.DeletionTimestamp != nil {
			continue
		}
		if err := r.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting certification job %s/%s: %w", j.Namespace, j.Name, err)
		}
	}
	if now == nil || !inEpisode {
		return nil
	}
	for _, n := range tainted {
		if err := nodepkg.RestampFabric(ctx, r.Client, n, *now); err != nil {
			return err
		}
	}
	return nil
}

// episodeOf is the earliest FabricSinceAnnotation of the tainted nodes.
func episodeOf(tainted []*corev1.Node) string {
	var all []string
	for _, n := range tainted {
		if v := n.Annotations[nodepkg.FabricSinceAnnotation]; v != "" {
			all = append(all, v)
		}
	}
	if len(all) == 0 {
		return ""
	}
	sort.Strings(all)
	return all[0]
}

// healthyNodes are the clique's managed nodes in service: NodeHealth
// Healthy, Ready, not excluded, sorted by name.
func (r *FabricReconciler) healthyNodes(ctx context.Context, nodes []corev1.Node, clique string, managed map[string]bool) ([]string, error) {
	var out []string
	for i := range nodes {
		n := &nodes[i]
		if n.Labels[CliqueNodeLabel] != clique || !managed[n.Name] || n.Spec.Unschedulable || !readiness.Node(n) {
			continue
		}
		nh := &gpuhealthv1alpha1.NodeHealth{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: n.Name}, nh); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("getting nodehealth %s: %w", n.Name, err)
		}
		if nh.Spec.Exclude || nh.Status.Phase != gpuhealthv1alpha1.PhaseHealthy {
			continue
		}
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out, nil
}
