package drain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"

	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// verdict is what a pass does with one pod.
type verdict int

const (
	// undecided hands the pod to the next filter of the chain.
	undecided verdict = iota
	// skip leaves the pod on the node and out of every count.
	skip
	// evict removes the pod through the Eviction API.
	evict
	// wait leaves the pod alone until it finishes by itself, or until its
	// timeout when spec.onTimeout is Delete; it still keeps the node from being drained.
	wait
	// deleteAfterTimeout evicts the pod and deletes it once the timeout since the drain began has passed.
	deleteAfterTimeout
)

// decision is a filter's verdict. For a pod that must leave (evict, wait,
// deleteAfterTimeout) it also carries the drain timeout of its namespace.
type decision struct {
	verdict verdict
	timeout time.Duration
	// gangs is set when the pod's namespace stops gangs whole (drain.gangs
	// Gang) and the verdict is evict or deleteAfterTimeout.
	gangs bool
}

// expired reports whether the decision's timeout has passed at now for a
// drain that began at startedAt. A zero startedAt never expires.
func (d decision) expired(startedAt, now time.Time) bool {
	return !startedAt.IsZero() && !now.Before(startedAt.Add(d.timeout))
}

// podFilter judges one pod. It returns undecided to leave the pod to the next
// filter; the first other verdict wins.
type podFilter func(ctx context.Context, pod *corev1.Pod) (decision, error)

// decide runs the chain on pod. A pod no filter decides is evicted, with the
// default timeout.
func decide(ctx context.Context, chain []podFilter, pod *corev1.Pod) (decision, error) {
	for _, f := range chain {
		d, err := f(ctx, pod)
		if err != nil {
			return decision{}, err
		}
		if d.verdict != undecided {
			return d, nil
		}
	}
	return decision{verdict: evict, timeout: defaultTimeout}, nil
}

// skipDaemonSetPods keeps DaemonSet pods: their controller tolerates the
// unschedulable taint and would recreate them on the node at once, as kubectl
// drain --ignore-daemonsets assumes. Any owner of kind DaemonSet counts, so
// look-alikes such as OpenKruise's Advanced DaemonSet are kept too.
func skipDaemonSetPods(_ context.Context, pod *corev1.Pod) (decision, error) {
	for _, ref := range pod.OwnerReferences {
		if ref.Kind == "DaemonSet" {
			return decision{verdict: skip}, nil
		}
	}
	return decision{}, nil
}

// skipOwnJobPods keeps the pods of gpuhealth's own reset, reboot and
// recertification Jobs, which run in namespace: they run on the
// quarantined node on purpose, and evicting one would fail the step it
// carries out.
func skipOwnJobPods(namespace string) podFilter {
	return func(_ context.Context, pod *corev1.Pod) (decision, error) {
		if isOwnJobPod(pod, namespace) {
			return decision{verdict: skip}, nil
		}
		return decision{}, nil
	}
}

// isOwnJobPod reports whether pod belongs to one of gpuhealth's own Jobs,
// which it creates in namespace (the operator's): the pod is in that
// namespace, carries the Job kind label gpuhealth puts on every Job's pod
// template, and its controller is a batch/v1 Job. An empty namespace
// matches no pod.
//
// The label alone proves nothing: anyone who may create pods anywhere can
// set it, and a tenant can run a Job of its own. The namespace is what the
// decision rests on: only the install's administrators may create pods or
// Jobs in the operator's namespace, and whoever may create a pod there can
// already run it as the operator's ServiceAccount, which is more than a pod
// the drain leaves alone gets. So the Job itself is not read: that would
// cost a request per pod and prove nothing the namespace does not.
func isOwnJobPod(pod *corev1.Pod, namespace string) bool {
	if namespace == "" || pod.Namespace != namespace {
		return false
	}
	if _, ok := pod.Labels[job.KindLabel]; !ok {
		return false
	}
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "Job" && ref.APIVersion == batchv1.SchemeGroupVersion.String()
}

// skipMirrorPods keeps mirror pods: they stand for static pods the kubelet
// runs from files on the node, and deleting the mirror does not stop them.
func skipMirrorPods(_ context.Context, pod *corev1.Pod) (decision, error) {
	if _, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return decision{verdict: skip}, nil
	}
	return decision{}, nil
}

// skipFinishedPods ignores pods that have succeeded or failed: they hold no
// resources and nothing is gained by removing them.
func skipFinishedPods(_ context.Context, pod *corev1.Pod) (decision, error) {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return decision{verdict: skip}, nil
	}
	return decision{}, nil
}

// skipNamespaces keeps the pods of the policy's skipNamespaces.
func skipNamespaces(names []string) podFilter {
	return func(_ context.Context, pod *corev1.Pod) (decision, error) {
		if slices.Contains(names, pod.Namespace) {
			return decision{verdict: skip}, nil
		}
		return decision{}, nil
	}
}

// modeResolver picks the drain mode of a namespace: the first entry of
// spec.namespaces that matches, else spec.defaultMode. It lives for one pass
// and is used from one goroutine, so its caches need no lock.
type modeResolver struct {
	client client.Client
	spec   gpuhealthv1alpha1.DrainSpec
	// selectors holds the parsed namespaceSelector of each entry, by index; filled on first use.
	selectors map[int]labels.Selector
	// namespaceLabels holds the labels of each Namespace read in this pass; a
	// Namespace that does not exist has nil labels.
	namespaceLabels map[string]labels.Set
}

// newModeResolver returns a resolver for one pass over spec.
func newModeResolver(c client.Client, spec gpuhealthv1alpha1.DrainSpec) *modeResolver {
	return &modeResolver{
		client:          c,
		spec:            spec,
		selectors:       map[int]labels.Selector{},
		namespaceLabels: map[string]labels.Set{},
	}
}

// filter is the last link of the chain: it turns the namespace's mode into a verdict.
func (m *modeResolver) filter(ctx context.Context, pod *corev1.Pod) (decision, error) {
	mode, timeout, gangs, err := m.modeFor(ctx, pod.Namespace)
	if err != nil {
		return decision{}, err
	}
	switch mode {
	case gpuhealthv1alpha1.DrainWaitForCompletion:
		return decision{verdict: wait, timeout: timeout}, nil
	case gpuhealthv1alpha1.DrainDeleteAfterTimeout:
		return decision{verdict: deleteAfterTimeout, timeout: timeout, gangs: gangs}, nil
	default:
		// Evict, the empty default, and any value the schema's enum should have
		// refused: evicting honours PodDisruptionBudgets, so it is the safe choice.
		return decision{verdict: evict, timeout: timeout, gangs: gangs}, nil
	}
}

// modeFor returns the mode for namespace, the timeout that applies to it
// and whether its gangs are stopped whole.
func (m *modeResolver) modeFor(ctx context.Context, namespace string) (gpuhealthv1alpha1.DrainMode, time.Duration, bool, error) {
	timeout := m.spec.Timeout.Get(defaultTimeout)
	gangs := m.spec.Gangs
	for i := range m.spec.Namespaces {
		entry := &m.spec.Namespaces[i]
		ok, err := m.matches(ctx, i, entry, namespace)
		if err != nil {
			return "", 0, false, err
		}
		if ok {
			return entry.Mode, entry.Timeout.Get(timeout), cmp.Or(entry.Gangs, gangs) == gpuhealthv1alpha1.GangDrainGang, nil
		}
	}
	mode := m.spec.DefaultMode
	if mode == "" {
		mode = gpuhealthv1alpha1.DrainEvict
	}
	return mode, timeout, gangs == gpuhealthv1alpha1.GangDrainGang, nil
}

// matches reports whether entry i applies to namespace.
func (m *modeResolver) matches(ctx context.Context, i int, entry *gpuhealthv1alpha1.NamespaceDrain, namespace string) (bool, error) {
	if entry.Namespace != "" {
		return entry.Namespace == namespace, nil
	}
	if entry.NamespaceSelector == nil {
		return false, nil
	}
	sel, ok := m.selectors[i]
	if !ok {
		var err error
		sel, err = metav1.LabelSelectorAsSelector(entry.NamespaceSelector)
		if err != nil {
			return false, fmt.Errorf("parsing namespaceSelector of drain.namespaces[%d]: %w", i, err)
		}
		m.selectors[i] = sel
	}
	set, err := m.labelsOf(ctx, namespace)
	if err != nil {
		return false, err
	}
	return sel.Matches(set), nil
}

// labelsOf returns the labels of the Namespace, reading it once per pass.
func (m *modeResolver) labelsOf(ctx context.Context, namespace string) (labels.Set, error) {
	if set, ok := m.namespaceLabels[namespace]; ok {
		return set, nil
	}
	ns := &corev1.Namespace{}
	err := m.client.Get(ctx, client.ObjectKey{Name: namespace}, ns)
	switch {
	case apierrors.IsNotFound(err):
		// A pod outliving its namespace is being garbage collected; with no
		// labels it gets the mode of entries by name or the default.
		m.namespaceLabels[namespace] = nil
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting namespace %s: %w", namespace, err)
	}
	m.namespaceLabels[namespace] = ns.Labels
	return ns.Labels, nil
}
