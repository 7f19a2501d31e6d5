package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// Object kinds the expectations are kept for.
const (
	kindNode        = "Node"
	kindNodeHealth  = "NodeHealth"
	kindHealthEvent = "NodeHealthEvent"
)

// observation is everything one reconcile knows about a node. decide takes
// nothing else, so every decision can be replayed from it.
type observation struct {
	// now is the reconcile's time.
	now metav1.Time
	// node is the Node as the cache has it; never written through.
	node *corev1.Node
	// nh is the node's NodeHealth as read; never written through. When the
	// node has none yet (nhMissing), an empty one of its name, which apply
	// creates.
	nh        *gpuhealthv1alpha1.NodeHealth
	nhMissing bool
	// policy is the RemediationPolicy that manages the node.
	policy *gpuhealthv1alpha1.RemediationPolicy
	// findings are the node's NodeHealthEvents as read.
	findings []*gpuhealthv1alpha1.NodeHealthEvent
	// cd is the node's ComputeDomain membership.
	cd *observedMembership
	// namespace is where Jobs run.
	namespace string
	// jobEnv is what the node's Jobs get besides their templates: the
	// install's Job service account and the policy's quarantine taint.
	jobEnv job.Env
	// breaches are what in the policy the install's Job rules refuse;
	// while there are any, nothing is done to the node (decide).
	breaches []string
	// jobs are the node's remediation and recertification Jobs, by name.
	jobs map[string]*batchv1.Job
	// uncordonedBy names who lifted gpuhealth's cordon, when someone did.
	uncordonedBy string
	// breaker is the circuit breaker as seen now, without counting a
	// quarantine; set when a new quarantine may be decided.
	breaker *breakerView
	// network is the network circuit breaker of the node's group as seen
	// now; set with breaker. It holds only quarantines whose every
	// counting finding is a NIC finding.
	network *networkView
	// stormHold is how long the bookkeeping after this process's fence
	// waits for a storm of fences to pass; zero: it goes ahead.
	stormHold time.Duration
	// budgets are the budget counts; set when a drain may be decided.
	budgets *budgetCount
	// drains says the node is draining now; drain is the pass of the drain
	// that ran before deciding (see actBeforeDeciding).
	drains bool
	drain  *drainPass
	// outputs are the finished suite Jobs' outputs that wait for a verdict, by Job name.
	outputs map[string]jobOutput
	// waits say why the current attempt's suite Jobs not seen running yet
	// do not run, by Job name.
	waits map[string]string
	// workloads are the pods a drain would remove (namespace/name); read
	// when a new node may be certified.
	workloads    []string
	workloadsErr error
	// devices is what the one-GPU workflow needs; nil when no GPU is out
	// alone and no finding of scope Device counts.
	devices *observedDevices
	// handOff is what a failed node's hand-off needs; read while Failed
	// under a policy with a ClusterAPI or Template hand-off.
	handOff *handOffTarget
}

// breakerView is the circuit breaker's answer to one more quarantine.
type breakerView struct {
	allowed bool
	message string
	// settings are the breaker's, resolved against the managed nodes once
	// per pass; enabled is false for a disabled breaker.
	settings breaker.Settings
	enabled  bool
	// reset is a reset token on the policy the breaker has not honoured.
	reset string
}

// budgetCount is every budget that applies to the node, counted.
type budgetCount struct {
	decisions []budget.Decision
	// blocked are the indexes of the decisions without room.
	blocked []int
	err     error
	// fromAPIServer is true when the NodeHealths were read from the
	// apiserver, not the cache: a drain is only started on such a count.
	fromAPIServer bool
	// fromRecentList is true when that read was the recent list with this
	// process's writes laid over it (see recentList), not a fresh list.
	fromRecentList bool
}

// drainPass is what one pass of the Drainer did and found.
type drainPass struct {
	result drain.Result
	err    error
}

// errCacheBehind says the cache has not yet shown a write of this process.
type errCacheBehind struct{ kind, name string }

func (e *errCacheBehind) Error() string {
	return fmt.Sprintf("the cache does not show this operator's last write of %s %s yet", e.kind, e.name)
}

// errNodeGone says the node was deleted.
var errNodeGone = errors.New("the node is gone")

// observe reads the node's world, and nothing else: it writes nothing, to
// the apiserver or to this process's own state beyond caches. It returns
// errNodeGone when the node was deleted, a nil observation when no policy
// manages it, and an *errCacheBehind when the cache lags behind one of this
// process's writes (deciding on it would repeat a decision). Which of the
// costly inputs it reads is decide's to say (inputsFor).
func (r *Reconciler) observe(ctx context.Context, name string) (*observation, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errNodeGone
		}
		return nil, fmt.Errorf("getting node %s: %w", name, err)
	}
	if !r.expect.caughtUp(kindNode, name, node) {
		return nil, &errCacheBehind{kindNode, name}
	}
	policy, err := r.policyFor(ctx, node)
	if err != nil || policy == nil {
		return nil, err
	}
	nh := &gpuhealthv1alpha1.NodeHealth{}
	unmanagedUntilNow := false
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(node), nh); apierrors.IsNotFound(err) {
		// The first pass under a policy: apply creates it.
		nh, unmanagedUntilNow = &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}, true
	} else if err != nil {
		return nil, fmt.Errorf("getting nodehealth %s: %w", name, err)
	} else if !r.expect.caughtUp(kindNodeHealth, name, nh) {
		return nil, &errCacheBehind{kindNodeHealth, name}
	}
	o := &observation{now: metav1.NewTime(r.Clock.Now()), node: node, nh: nh, nhMissing: unmanagedUntilNow, policy: policy, namespace: r.Namespace,
		jobEnv:   job.Env{ServiceAccount: r.JobRules.ServiceAccount, Quarantine: policy.Spec.Quarantine.Taint, NodeTaints: node.Spec.Taints},
		breaches: r.JobRules.Breaches(&policy.Spec)}
	list := &gpuhealthv1alpha1.NodeHealthEventList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: name}); err != nil {
		return nil, fmt.Errorf("listing events of node %s: %w", name, err)
	}
	for i := range list.Items {
		ev := &list.Items[i]
		if !r.expect.caughtUp(kindHealthEvent, ev.Name, ev) {
			return nil, &errCacheBehind{kindHealthEvent, ev.Name}
		}
		o.findings = append(o.findings, ev)
	}
	if o.cd, err = r.observeComputeDomain(ctx, node, nh); err != nil {
		return nil, err
	}
	jobs := &batchv1.JobList{}
	if err := r.Client.List(ctx, jobs, client.InNamespace(r.Namespace), client.MatchingLabels{job.NodeLabel: name}); err != nil {
		return nil, fmt.Errorf("listing jobs of node %s: %w", name, err)
	}
	o.jobs = make(map[string]*batchv1.Job, len(jobs.Items))
	for i := range jobs.Items {
		o.jobs[jobs.Items[i].Name] = &jobs.Items[i]
	}
	if nodepkg.HumanUncordoned(node) || preexistingCordonLifted(o) {
		o.uncordonedBy = nodepkg.UncordonedBy(node, FieldManager)
	}
	return o, r.observeInputs(ctx, o, inputsFor(o))
}

// observeInputs reads the costly inputs decide asked for.
func (r *Reconciler) observeInputs(ctx context.Context, o *observation, in inputs) error {
	var err error
	if in.workloads {
		o.workloads, o.workloadsErr = r.Drainer.Workloads(ctx, o.node.Name, o.policy.Spec.Drain)
	}
	if in.outputs {
		o.outputs, o.waits = r.readOutputs(ctx, o), r.readWaits(ctx, o)
	}
	if in.stormHold {
		o.stormHold = r.storm.hold(o.node.Name)
	}
	if in.breaker {
		// The snapshot's, rebuilt only when a node or a NodeHealth that a
		// count reads changed: every pass that may quarantine asks, and a
		// fresh list of the policy's nodes copied the fleet each time (at
		// 5,000 nodes, 19 GB allocated in a burst of 5,000 quarantines).
		managed, _, err := r.snapshot(ctx, o.policy)
		if err != nil {
			return err
		}
		if o.breaker, err = r.peekBreaker(ctx, o.policy, managed, o.now.Time); err != nil {
			return err
		}
		if in.network {
			if o.network, err = r.peekNetworkBreaker(ctx, o, managed); err != nil {
				return err
			}
		}
	}
	if in.budgets {
		o.budgets = r.countBudgets(ctx, o, false)
	}
	o.drains = in.drain
	if in.devices {
		if o.devices, err = r.observeDevices(ctx, o); err != nil {
			return err
		}
	}
	if in.handOff {
		if o.handOff, err = r.observeHandOff(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// suiteAttempt is the suite a node's phase runs, its Job kind and its
// attempt: certification while Certifying, else recertification.
func suiteAttempt(st *gpuhealthv1alpha1.NodeHealthStatus) (gpuhealthv1alpha1.Suite, job.Kind, *gpuhealthv1alpha1.RecertificationStatus) {
	if st.Phase == gpuhealthv1alpha1.PhaseCertifying {
		return gpuhealthv1alpha1.SuiteCertification, job.Certification, st.Certification
	}
	return gpuhealthv1alpha1.SuiteRecertification, job.Recertification, st.Recertification
}

// suiteJobs are the current attempt's suite Jobs (of every try of every
// step), nil when no attempt runs.
func suiteJobs(o *observation) []*batchv1.Job {
	_, kind, rc := suiteAttempt(&o.nh.Status)
	if rc == nil || rc.StartedAt == nil {
		return nil
	}
	started := rc.StartedAt.UTC().Format(time.RFC3339)
	var out []*batchv1.Job
	for _, j := range o.jobs {
		if j.Labels[job.ParserLabel] == "" || j.Labels[job.KindLabel] != string(kind) || j.Labels[job.AttemptLabel] != strconv.Itoa(int(rc.Attempt)) ||
			j.Annotations[job.AttemptStartedAnnotation] != started {
			continue
		}
		out = append(out, j)
	}
	return out
}

// readOutputs reads the output of the current attempt's finished suite
// Jobs whose parser needs it and whose verdict the status does not hold
// yet: each log is read until its verdict is written, then never again.
func (r *Reconciler) readOutputs(ctx context.Context, o *observation) map[string]jobOutput {
	_, _, rc := suiteAttempt(&o.nh.Status)
	// Only a step's current Job, while the step has no verdict: never an
	// earlier try's (one that never ran) or a judged step's.
	current := map[string]bool{}
	if rc != nil {
		for _, s := range rc.Steps {
			switch s.Result {
			case gpuhealthv1alpha1.JobSucceeded, gpuhealthv1alpha1.JobFailed, gpuhealthv1alpha1.JobNotRun:
			default:
				current[s.Job] = s.Job != ""
			}
		}
	}
	out := map[string]jobOutput{}
	for _, j := range suiteJobs(o) {
		if j.Labels[job.ParserLabel] == string(gpuhealthv1alpha1.ParserExitCode) || !current[j.Name] {
			continue
		}
		if res, _ := job.Result(j); res != gpuhealthv1alpha1.JobSucceeded && res != gpuhealthv1alpha1.JobFailed {
			continue
		}
		if r.Outputs == nil {
			out[j.Name] = jobOutput{err: fmt.Errorf("the operator reads no job output: %w", job.ErrNoOutput)}
			continue
		}
		text, total, err := r.Outputs.Output(ctx, o.namespace, j.Name)
		out[j.Name] = jobOutput{text: text, total: total, err: err}
	}
	return out
}

// readWaits says, for each of the current attempt's suite Jobs not seen
// running yet, why its pod does not run (see job.WaitReader): what a step
// that never runs is reported with. A read that fails is only logged.
func (r *Reconciler) readWaits(ctx context.Context, o *observation) map[string]string {
	if r.Waits == nil {
		return nil
	}
	out := map[string]string{}
	for _, j := range suiteJobs(o) {
		if res, _ := job.Result(j); res == gpuhealthv1alpha1.JobSucceeded || res == gpuhealthv1alpha1.JobFailed || job.Ran(j) {
			continue
		}
		why, err := r.Waits.NotRunning(ctx, o.namespace, j.Name)
		if err != nil {
			log.FromContext(ctx).V(1).Info("Could not read why a job's pod does not run", "job", j.Name, "err", err)
			continue
		}
		out[j.Name] = why
	}
	return out
}

// policyFor returns the RemediationPolicy that manages the node (see
// gpuhealthv1alpha1.ManagingPolicy), nil when none does.
func (r *Reconciler) policyFor(ctx context.Context, node *corev1.Node) (*gpuhealthv1alpha1.RemediationPolicy, error) {
	list := &gpuhealthv1alpha1.RemediationPolicyList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing remediation policies: %w", err)
	}
	return gpuhealthv1alpha1.ManagingPolicy(list.Items, node.Labels), nil
}

// preexistingCordonLifted says whether someone lifted the cordon that was
// on the node before gpuhealth took it out of service (gpuhealth's
// cordoning policy found it there, so it is the cordon the node is out of
// service under): as with gpuhealth's own, that is a human putting the node
// back in service, not a cordon for gpuhealth to put back and own.
func preexistingCordonLifted(o *observation) bool {
	return o.nh.Status.PreexistingCordon && !o.node.Spec.Unschedulable && policyCordons(o.policy) &&
		!nodepkg.AppliedOn(o.node).Cordon
}
