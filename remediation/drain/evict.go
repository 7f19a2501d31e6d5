package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

// maxMessageLen is the MaxLength of BlockedPod.message.
const maxMessageLen = 512

// task is one request a pass sends for a pod: an eviction, or a deletion when
// the pod's timeout has expired in a DeleteAfterTimeout namespace or with
// onTimeout Delete.
type task struct {
	pod    *corev1.Pod
	delete bool
	// expired is set when the pod's drain timeout has passed.
	expired bool
	// timeout is the pod's drain timeout, for messages.
	timeout time.Duration
	// budget is the one PodDisruptionBudget selecting the pod, when one
	// does (set by refuse): its evictions are spaced (budgetSpacing).
	budget types.NamespacedName
	// wave is set for a gang member evicted in a wave: it takes its
	// eviction token without waiting for it, so the wave is not spread
	// over seconds (it still counts against the shared rate). peer is set
	// for a member on another node than the one being drained.
	wave, peer bool
	// grace, when set, is the eviction's grace period (drain.gangGracePeriod
	// longer than the pod's own).
	grace *int64
}

// timedOut returns the timed-out pod to report when the task's pod is past
// its timeout and out says it is still on the node and not terminating; ok is
// false when the pass evicted or deleted it, or found it gone.
func (t task) timedOut(out outcome) (p timedOutPod, ok bool) {
	if !t.expired {
		return timedOutPod{}, false
	}
	p = timedOutPod{pod: t.pod, timeout: t.timeout}
	switch {
	case out.kind == outcomeBlocked:
		p.refusal = out.message
		if p.refusal == "" {
			p.refusal = "eviction refused"
		}
	case out.kind == outcomeFailed && t.delete:
		p.message = fmt.Sprintf("past the %s drain timeout, deleting it failed: %v", t.timeout, out.err)
	case out.kind == outcomeFailed:
		p.message = fmt.Sprintf("eviction failed past the %s drain timeout: %v", t.timeout, out.err)
	case out.kind == outcomeDeferred && t.delete:
		p.message = fmt.Sprintf("past the %s drain timeout, deletion left for the next pass", t.timeout)
	case out.kind == outcomeDeferred:
		p.message = fmt.Sprintf("still running past the %s drain timeout, eviction left for the next pass", t.timeout)
	default:
		// Evicted, deleted or gone: the pod is leaving.
		return timedOutPod{}, false
	}
	return p, true
}

// outcomeKind is what became of a task.
type outcomeKind int

const (
	// outcomeDeferred: no token, slot or time was left; the next pass retries.
	outcomeDeferred outcomeKind = iota
	// outcomeEvicted: the apiserver accepted the eviction; the pod is terminating.
	outcomeEvicted
	// outcomeDeleted: the pod was deleted after its timeout; it is terminating.
	outcomeDeleted
	// outcomeGone: the pod, or at least the one with this UID, no longer exists.
	outcomeGone
	// outcomeBlocked: the eviction was refused with 429, usually by a PodDisruptionBudget.
	outcomeBlocked
	// outcomeFailed: any other error, in err.
	outcomeFailed
)

// outcome is what became of one task.
type outcome struct {
	kind outcomeKind
	pod  *corev1.Pod
	// message is the apiserver's reason for a blocked eviction.
	message string
	err     error
}

// evictPod asks the apiserver to evict pod, which it does only if every
// PodDisruptionBudget selecting the pod allows a disruption. The UID
// precondition makes sure a pod recreated under the same name (a StatefulSet
// replica already rescheduled) is not evicted in its predecessor's place.
// See https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/.
func (d *Drainer) evictPod(ctx context.Context, pod *corev1.Pod, grace *int64) outcome {
	log.FromContext(ctx).V(4).Info("Evicting Pod", "Pod", klog.KObj(pod))
	eviction := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}, GracePeriodSeconds: grace},
	}
	err := d.client.SubResource("eviction").Create(ctx, pod, eviction)
	switch {
	case err == nil:
		return outcome{kind: outcomeEvicted, pod: pod}
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// 404: the pod is gone. 409: the UID precondition failed, so the pod we
		// listed is gone and another took its name.
		return outcome{kind: outcomeGone, pod: pod}
	case apierrors.IsTooManyRequests(err):
		// A PodDisruptionBudget allows no disruption now (or the apiserver is
		// shedding load); the disruption controller raises the budget once
		// replacements are healthy, and the next pass tries again.
		log.FromContext(ctx).V(1).Info("Eviction refused, retrying next pass", "Pod", klog.KObj(pod), "err", err)
		return outcome{kind: outcomeBlocked, pod: pod, message: blockedMessage(err)}
	case ctx.Err() != nil:
		// The pass ran out of time mid-request; the next pass sees whether it landed.
		return outcome{kind: outcomeDeferred, pod: pod}
	default:
		return outcome{kind: outcomeFailed, pod: pod, err: fmt.Errorf("evicting pod %s: %w", client.ObjectKeyFromObject(pod), err)}
	}
}

// deletePod deletes pod once its DeleteAfterTimeout has expired, bypassing
// PodDisruptionBudgets. It keeps the pod's own grace period rather than force
// deleting with 0: the kubelet still stops the containers, so a replacement
// never overlaps a workload still holding the node's GPUs.
func (d *Drainer) deletePod(ctx context.Context, pod *corev1.Pod) outcome {
	log.FromContext(ctx).Info("Deleting Pod after drain timeout", "Pod", klog.KObj(pod))
	err := d.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
	switch {
	case err == nil:
		return outcome{kind: outcomeDeleted, pod: pod}
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return outcome{kind: outcomeGone, pod: pod}
	case ctx.Err() != nil:
		return outcome{kind: outcomeDeferred, pod: pod}
	default:
		return outcome{kind: outcomeFailed, pod: pod, err: fmt.Errorf("deleting pod %s after drain timeout: %w", client.ObjectKeyFromObject(pod), err)}
	}
}

// blockedMessage returns why an eviction was refused: the apiserver's
// DisruptionBudget cause ("The disruption budget web needs 2 healthy pods and
// has 2 currently") when there is one, else the error, cut to fit BlockedPod.message.
func blockedMessage(err error) string {
	msg := err.Error()
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, cause := range status.Status().Details.Causes {
			if cause.Type == policyv1.DisruptionBudgetCause && cause.Message != "" {
				msg = cause.Message
				break
			}
		}
	}
	return gpuhealthv1alpha1.Truncate(msg, maxMessageLen)
}

// blockedPod is a pod whose eviction was refused in this pass.
type blockedPod struct {
	pod     *corev1.Pod
	message string
}

// timedOutPod is a pod past its drain timeout that this pass left on the node.
type timedOutPod struct {
	pod     *corev1.Pod
	timeout time.Duration
	// refusal is the apiserver's reason when the pod's eviction was refused;
	// the message then names the PodDisruptionBudget, found later.
	refusal string
	// message is why the pod is still there, for any other reason.
	message string
}

// comparePods orders pods by namespace and name.
func comparePods(a, b *corev1.Pod) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// budgetCache finds the PodDisruptionBudget selecting a pod. The 429 of a
// refused eviction names no budget in a field, so the budgets of the pod's
// namespace are listed (once per namespace and pass) and matched against the
// pod's labels.
type budgetCache struct {
	client client.Client
	// byNamespace holds the budgets listed so far; a failed list leaves none.
	byNamespace map[string][]policyv1.PodDisruptionBudget
}

// newBudgetCache returns an empty cache for one pass.
func (d *Drainer) newBudgetCache() *budgetCache {
	return &budgetCache{client: d.client, byNamespace: map[string][]policyv1.PodDisruptionBudget{}}
}

// nameFor returns the name of the budget selecting pod, or "" when none does
// or the budgets could not be listed.
func (c *budgetCache) nameFor(ctx context.Context, pod *corev1.Pod) string {
	return budgetFor(pod, c.inNamespace(ctx, pod.Namespace))
}

// inNamespace returns the budgets of namespace, listed once per pass.
func (c *budgetCache) inNamespace(ctx context.Context, namespace string) []policyv1.PodDisruptionBudget {
	pdbs, ok := c.byNamespace[namespace]
	if !ok {
		list := &policyv1.PodDisruptionBudgetList{}
		if err := c.client.List(ctx, list, client.InNamespace(namespace)); err != nil {
			// The budgets only name a blocked pod's budget and spare requests
			// the apiserver would refuse; without them every eviction is
			// sent and the apiserver decides, so a failed lookup is logged.
			log.FromContext(ctx).Error(err, "Listing PodDisruptionBudgets failed", "namespace", namespace)
		}
		pdbs = list.Items
		c.byNamespace[namespace] = pdbs
	}
	return pdbs
}

// refuse decides, before any request, which evictions the apiserver would
// refuse: those of Ready pods whose one PodDisruptionBudget, as the cache
// shows it and up to date with its spec, allows no disruption, or no more
// than the evictions admitted under it (by this pass or a concurrent one of
// another node, in l) since the cache last showed it change. Such a request
// would only be answered 429 and, worse, spend an eviction token that a pod
// other budgets allow is waiting for. It returns, by task, the outcome of
// each refused one (nil: send it) and the admission of each one it counted
// against a budget, which the caller gives back unless the eviction went
// through. The apiserver stays the judge of every eviction that is sent: a
// stale cache that allows too many only costs 429s, one that allows too
// few is caught up by the next pass, which the budget's own change
// triggers. Deletions after a timeout bypass budgets, and pods that are not
// Ready, or under no or several budgets, are left to the apiserver's rules.
// It also sets each eviction task's budget, where one budget selects the pod.
func (c *budgetCache) refuse(ctx context.Context, l *ledger, tasks []task) ([]*outcome, []*admission) {
	out, admitted := make([]*outcome, len(tasks)), make([]*admission, len(tasks))
	for i, t := range tasks {
		if t.delete {
			continue
		}
		var selecting []*policyv1.PodDisruptionBudget
		pdbs := c.inNamespace(ctx, t.pod.Namespace)
		for j := range pdbs {
			if selects(&pdbs[j], t.pod) {
				selecting = append(selecting, &pdbs[j])
			}
		}
		if len(selecting) != 1 {
			continue
		}
		pdb := selecting[0]
		tasks[i].budget = client.ObjectKeyFromObject(pdb)
		if !readiness.Pod(t.pod) || pdb.Status.ObservedGeneration < pdb.Generation {
			continue
		}
		if a, ok := l.admit(pdb); ok {
			admitted[i] = &a
			continue
		}
		out[i] = &outcome{kind: outcomeBlocked, pod: t.pod, message: gpuhealthv1alpha1.Truncate(fmt.Sprintf(
			"Cannot evict pod as it would violate the pod's disruption budget: PodDisruptionBudget %s allows %d disruptions (%d of %d desired healthy pods healthy); not sent",
			pdb.Name, pdb.Status.DisruptionsAllowed, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy), maxMessageLen)}
	}
	return out, admitted
}

// ledger counts the evictions admitted under each PodDisruptionBudget since
// the cache last showed that budget change (a new resourceVersion: the
// apiserver's own decrement after an eviction, or the disruption
// controller's count). Concurrent passes of different nodes share it, so
// together they send no more evictions than the budget allows.
type ledger struct {
	mu      sync.Mutex
	budgets map[types.NamespacedName]ledgerEntry
}

type ledgerEntry struct {
	resourceVersion string
	admitted        int32
}

// admission is one eviction counted against a budget as it was seen.
type admission struct {
	key             types.NamespacedName
	resourceVersion string
}

func newLedger() *ledger { return &ledger{budgets: map[types.NamespacedName]ledgerEntry{}} }

// admit counts one more eviction against pdb if it allows one.
func (l *ledger) admit(pdb *policyv1.PodDisruptionBudget) (admission, bool) {
	key := client.ObjectKeyFromObject(pdb)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.budgets[key]
	if e.resourceVersion != pdb.ResourceVersion {
		e = ledgerEntry{resourceVersion: pdb.ResourceVersion}
	}
	if e.admitted >= pdb.Status.DisruptionsAllowed {
		l.budgets[key] = e
		return admission{}, false
	}
	e.admitted++
	l.budgets[key] = e
	return admission{key: key, resourceVersion: e.resourceVersion}, true
}

// release gives back an admission whose eviction did not go through, if
// the budget has not changed since.
func (l *ledger) release(a admission) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.budgets[a.key]; ok && e.resourceVersion == a.resourceVersion && e.admitted > 0 {
		e.admitted--
		l.budgets[a.key] = e
	}
}

// selects says whether pdb's selector matches pod; an empty or invalid
// selector matches nothing, as the apiserver's eviction treats it.
func selects(pdb *policyv1.PodDisruptionBudget, pod *corev1.Pod) bool {
	if pdb.Spec.Selector == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || sel.Empty() {
		return false
	}
	return sel.Matches(labels.Set(pod.Labels))
}

// describeBlocked returns the first maxBlockedPods of blocked, sorted by
// namespace and name, each with the name of the PodDisruptionBudget selecting it.
func describeBlocked(ctx context.Context, budgets *budgetCache, blocked []blockedPod) []gpuhealthv1alpha1.BlockedPod {
	if len(blocked) == 0 {
		return nil
	}
	slices.SortFunc(blocked, func(a, b blockedPod) int { return comparePods(a.pod, b.pod) })
	blocked = blocked[:min(len(blocked), maxBlockedPods)]
	out := make([]gpuhealthv1alpha1.BlockedPod, 0, len(blocked))
	for _, b := range blocked {
		out = append(out, gpuhealthv1alpha1.BlockedPod{
			Namespace:           b.pod.Namespace,
			Name:                b.pod.Name,
			PodDisruptionBudget: budgets.nameFor(ctx, b.pod),
			Message:             b.message,
		})
	}
	return out
}

// describeTimedOut returns the first maxBlockedPods of timedOut, sorted by
// namespace and name, each with why it is still there; a refused eviction
// names the PodDisruptionBudget selecting the pod.
func describeTimedOut(ctx context.Context, budgets *budgetCache, timedOut []timedOutPod) []gpuhealthv1alpha1.BlockedPod {
	if len(timedOut) == 0 {
		return nil
	}
	slices.SortFunc(timedOut, func(a, b timedOutPod) int { return comparePods(a.pod, b.pod) })
	timedOut = timedOut[:min(len(timedOut), maxBlockedPods)]
	out := make([]gpuhealthv1alpha1.BlockedPod, 0, len(timedOut))
	for _, t := range timedOut {
		p := gpuhealthv1alpha1.BlockedPod{Namespace: t.pod.Namespace, Name: t.pod.Name, Message: t.message}
		if t.refusal != "" {
			p.PodDisruptionBudget = budgets.nameFor(ctx, t.pod)
			if p.PodDisruptionBudget != "" {
				p.Message = fmt.Sprintf("blocked by PodDisruptionBudget %s past the %s drain timeout", p.PodDisruptionBudget, t.timeout)
			} else {
				p.Message = fmt.Sprintf("eviction refused past the %s drain timeout: %s", t.timeout, t.refusal)
			}
		}
		p.Message = gpuhealthv1alpha1.Truncate(p.Message, maxMessageLen)
		out = append(out, p)
	}
	return out
}

// budgetFor returns the name of the first budget, by name, whose selector
// matches pod's labels, or "" if none does. In policy/v1 a nil selector matches
// no pod and an empty one every pod of the namespace, which is what
// LabelSelectorAsSelector returns for them.
func budgetFor(pod *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) string {
	var names []string
	for i := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdbs[i].Spec.Selector)
		if err != nil {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			names = append(names, pdbs[i].Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return slices.Min(names)
}
