package imex

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels of NVIDIA's DRA driver for GPUs. The driver's Go module is not
// imported for two strings (see controllers/computedomain for the same
// choice on the operator's side).
const (
	// ComputeDomainLabel is set by the driver, to the ComputeDomain's UID, on
	// a node while a workload's channel claim is prepared there, and on the
	// domain's daemon pods (and their DaemonSet). IMEX is only judged on
	// nodes that carry it: elsewhere an IMEX daemon that is not running is
	// normal.
	ComputeDomainLabel = "resource.nvidia.com/computeDomain"
	// CliqueLabel is the NVLink clique ("<ClusterUUID>.<CliqueId>") the
	// daemon writes on its own pod after it starts (driver v25.12 and
	// later; absent on v25.8). An empty value means the node has no NVLink
	// fabric, and the driver then starts no IMEX daemon in the pod.
	CliqueLabel = "resource.nvidia.com/computeDomain.cliqueID"
)

// DefaultDriverNamespace is the namespace NVIDIA's installation guide puts
// the DRA driver for GPUs in; the driver runs each ComputeDomain's daemon
// DaemonSet in its own namespace.
const DefaultDriverNamespace = "nvidia-dra-driver-gpu"

// DaemonPodLister lists the ComputeDomain daemon pods bound to this node.
type DaemonPodLister interface {
	// Start starts watching; later calls do nothing. The watch ends when
	// ctx is done.
	Start(ctx context.Context)
	// DaemonPods returns the pods bound to this node that carry
	// ComputeDomainLabel, in the driver's namespace, of any domain. An
	// error means they cannot be read now (not permitted, not listed
	// yet); it says why.
	DaemonPods(ctx context.Context) ([]corev1.Pod, error)
}

// PodWatch is a DaemonPodLister backed by a watch of the pods bound to one
// node (field selector spec.nodeName) that carry ComputeDomainLabel, in one
// namespace. It needs get, list and watch on pods in that namespace only: a
// Role there, not a ClusterRole. The apiserver filters by node and label, so
// each agent holds a handful of pods, not the cluster's.
type PodWatch struct {
	node      string
	namespace string
	cache     cache.Cache

	once     sync.Once
	informer cache.Informer
	startErr error

	mu sync.Mutex
	// watchErr is the last error of listing or watching.
	watchErr error
}

var _ DaemonPodLister = &PodWatch{}

// NewPodWatch prepares a watch of the ComputeDomain daemon pods on node in
// namespace (empty: DefaultDriverNamespace). It contacts the apiserver only
// once Start is called.
func NewPodWatch(cfg *rest.Config, node, namespace string) (*PodWatch, error) {
	if node == "" {
		return nil, errors.New("imex pod watch: the node name is required")
	}
	if namespace == "" {
		namespace = DefaultDriverNamespace
	}
	// A scheme of its own with the one kind it reads.
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the imex pod watch's scheme: %w", err)
	}
	hasDomain, err := labels.NewRequirement(ComputeDomainLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	// A fixed mapping of the one kind: no discovery requests, so that
	// creating the watch works while the apiserver is unreachable.
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{corev1.SchemeGroupVersion})
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("PodList"), meta.RESTScopeNamespace)
	w := &PodWatch{node: node, namespace: namespace}
	w.cache, err = cache.New(cfg, cache.Options{
		Scheme: scheme,
		Mapper: mapper,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {
				Namespaces: map[string]cache.Config{namespace: {}},
				Field:      fields.OneTermEqualSelector("spec.nodeName", node),
				Label:      labels.NewSelector().Add(*hasDomain),
				Transform:  trimPod,
			},
		},
		DefaultWatchErrorHandler: w.recordWatchError,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the imex pod watch: %w", err)
	}
	return w, nil
}

// Namespace returns the namespace watched.
func (w *PodWatch) Namespace() string { return w.namespace }

// Start starts the watch in the background, once.
func (w *PodWatch) Start(ctx context.Context) {
	w.once.Do(func() {
		// Registering the informer before Start makes Start run it.
		w.informer, w.startErr = w.cache.GetInformer(ctx, &corev1.Pod{}, cache.BlockUntilSynced(false))
		if w.startErr != nil {
			return
		}
		go func() {
			if err := w.cache.Start(ctx); err != nil && ctx.Err() == nil {
				w.recordWatchError(ctx, nil, err)
			}
		}()
	})
}

// DaemonPods returns the watched pods. Until the first list succeeded it
// returns the last list or watch error (Forbidden when the Role is missing),
// without waiting.
func (w *PodWatch) DaemonPods(ctx context.Context) ([]corev1.Pod, error) {
	if w.informer == nil {
		if w.startErr != nil {
			return nil, fmt.Errorf("watching pods in namespace %s: %w", w.namespace, w.startErr)
		}
		return nil, errors.New("the pod watch has not been started")
	}
	if !w.informer.HasSynced() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.watchErr != nil {
			return nil, fmt.Errorf("listing pods of node %s in namespace %s: %w", w.node, w.namespace, w.watchErr)
		}
		return nil, fmt.Errorf("listing pods of node %s in namespace %s: no answer yet", w.node, w.namespace)
	}
	var list corev1.PodList
	if err := w.cache.List(ctx, &list, client.InNamespace(w.namespace)); err != nil {
		return nil, fmt.Errorf("listing pods of node %s in namespace %s: %w", w.node, w.namespace, err)
	}
	return list.Items, nil
}

// recordWatchError keeps the error for DaemonPods. The reflector retries
// with backoff by itself; the source logs the error when its state changes,
// so it is not logged here on every retry.
func (w *PodWatch) recordWatchError(_ context.Context, _ *toolscache.Reflector, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watchErr = err
}

// trimPod keeps only what the source reads, so that the watch holds a few
// hundred bytes per pod.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              p.Name,
			Namespace:         p.Namespace,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            p.Labels,
			CreationTimestamp: p.CreationTimestamp,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{
			Phase:      p.Status.Phase,
			Conditions: p.Status.Conditions,
			PodIP:      p.Status.PodIP,
			PodIPs:     p.Status.PodIPs,
			StartTime:  p.Status.StartTime,
		},
	}, nil
}
