package drain

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// watchIdle is how long a node's pod watch outlives the last pass that
// asked for it. Passes of a draining node come at least every few seconds
// (the reconciler's drain recheck); a node that left Draining without a
// pass that found it empty (released, excluded, handed off) stops asking.
const watchIdle = 2 * time.Minute

// podWatches wakes draining nodes when their pods leave. The operator
// caches no Pods but ComputeDomain daemon pods: with 50,000 pods in a
// cluster their cache was most of its memory, while only the few nodes
// being drained need to hear about theirs. Each of those gets one watch of
// the pods bound to it, on the apiserver's spec.nodeName field selector as
// a kubelet watches its own: started at the resourceVersion of the pass's
// list (so nothing between the list and the watch is missed), ended by the
// pass that finds the node empty, or watchIdle after the last pass.
type podWatches struct {
	client client.WithWatch
	clock  clock.PassiveClock
	wake   chan event.GenericEvent

	mu    sync.Mutex
	ctx   context.Context // set by start; nil before, and no watch runs
	nodes map[string]*podWatch
}

type podWatch struct {
	cancel context.CancelFunc
	// asked is when a pass last asked for this watch.
	asked time.Time
}

func newPodWatches(c client.WithWatch, clk clock.PassiveClock) *podWatches {
	return &podWatches{client: c, clock: clk, wake: make(chan event.GenericEvent, 1024), nodes: map[string]*podWatch{}}
}

// start lets watches run until ctx is done, then ends them all.
func (w *podWatches) start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	for node := range w.nodes {
		w.drop(node)
	}
	w.ctx = nil
	return nil
}

// ensure keeps node's watch running, starting it at resourceVersion rv when
// there is none, and ends the watches no pass has asked for in watchIdle.
func (w *podWatches) ensure(node, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil || rv == "" {
		return
	}
	now := w.clock.Now()
	for n, pw := range w.nodes {
		if n != node && now.Sub(pw.asked) > watchIdle {
			w.drop(n)
		}
	}
	if pw, ok := w.nodes[node]; ok {
		pw.asked = now
		return
	}
	ctx, cancel := context.WithCancel(w.ctx)
	pw := &podWatch{cancel: cancel, asked: now}
	w.nodes[node] = pw
	go w.run(w.ctx, ctx, node, rv, pw)
}

// stop ends node's watch, if it has one.
func (w *podWatches) stop(node string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drop(node)
}

// watching reports whether node has a watch running.
func (w *podWatches) watching(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.nodes[node]
	return ok
}

// run watches node's pods from rv, through reconnects, and wakes the node on
// each change a drain waits for. When the watch can go on no longer (its
// resourceVersion expired), it wakes the node once more and forgets the
// watch, so the next pass lists afresh and starts a new one. Wake-ups are
// sent within root, which outlives the watch's own ctx.
func (w *podWatches) run(root, ctx context.Context, node, rv string, pw *podWatch) {
	logger := log.FromContext(ctx).WithValues("Node", klog.KRef("", node))
	selector := fields.OneTermEqualSelector(NodeNameField, node).String()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		opts.FieldSelector = selector
		return w.client.Watch(ctx, &corev1.PodList{}, &client.ListOptions{Raw: &opts})
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
	if err != nil {
		logger.Error(err, "Watching the pods of a draining node")
		w.forget(node, pw)
		w.notify(root, node)
		return
	}
	defer rw.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-rw.ResultChan():
			if !ok || ev.Type == watch.Error {
				w.forget(node, pw)
				w.notify(root, node)
				return
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && leftOrLeaving(ev.Type, pod) {
				w.notify(ctx, node)
			}
		}
	}
}

// leftOrLeaving reports whether a watch event is one a drain waits for: the
// pod gone, terminating, or finished.
func leftOrLeaving(t watch.EventType, pod *corev1.Pod) bool {
	switch t {
	case watch.Deleted:
		return true
	case watch.Modified:
		return pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	}
	return false
}

// forget ends node's watch if it is still pw (a pass may have started a
// new one since).
func (w *podWatches) forget(node string, pw *podWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.nodes[node] == pw {
		w.drop(node)
	}
}

// drop ends node's watch, if it has one; w.mu is held.
func (w *podWatches) drop(node string) {
	if pw, ok := w.nodes[node]; ok {
		pw.cancel()
		delete(w.nodes, node)
	}
}

func (w *podWatches) notify(ctx context.Context, node string) {
	select {
	case w.wake <- event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}:
	case <-ctx.Done():
	}
}
