package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

// notifier wakes every waiter on each change: waiters take the current channel
// before they look, and it is closed (and replaced) on the next change.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *notifier) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *notifier) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// nodeState is what the benchmark cares about in a Node.
type nodeState struct {
	ready         bool
	unschedulable bool
	// unschedulableTaint is node.kubernetes.io/unschedulable, which the
	// node lifecycle controller adds to cordoned nodes and removes later.
	unschedulableTaint bool
}

// nodeWatch follows every Node through an informer and records when an
// armed node is first seen cordoned.
type nodeWatch struct {
	notifier
	mu    sync.Mutex
	nodes map[string]nodeState
	// armed maps the nodes being timed to when each was first seen with
	// spec.unschedulable (zero while not yet).
	armed map[string]time.Time
	// seen counts the armed nodes seen cordoned, last is when the latest
	// of them was: kept as they come, since a wait asks after every node
	// update, and counting 10,000 armed nodes each time would cost the
	// harness seconds of the CPU it shares with what it measures.
	seen int
	last time.Time
}

func startNodeWatch(cs kubernetes.Interface, stop <-chan struct{}) *nodeWatch {
	w := &nodeWatch{nodes: map[string]nodeState{}}
	inf := informers.NewSharedInformerFactory(cs, 0).Core().V1().Nodes().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.update,
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: w.remove,
	})
	go inf.Run(stop)
	return w
}

func (w *nodeWatch) update(obj any) {
	now := time.Now()
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	st := nodeState{unschedulable: n.Spec.Unschedulable, ready: readiness.Node(n)}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnschedulable {
			st.unschedulableTaint = true
		}
	}
	w.mu.Lock()
	w.nodes[n.Name] = st
	if seen, armed := w.armed[n.Name]; armed && seen.IsZero() && st.unschedulable {
		w.armed[n.Name] = now
		w.seen, w.last = w.seen+1, now
	}
	w.mu.Unlock()
	w.fire()
}

func (w *nodeWatch) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		w.mu.Lock()
		delete(w.nodes, n.Name)
		w.mu.Unlock()
		w.fire()
	}
}

func (w *nodeWatch) exists(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.nodes[name]
	return ok
}

func (w *nodeWatch) get(name string) nodeState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodes[name]
}

// arm starts timing the named nodes: from now on, the first sight of each
// cordoned is recorded. It fails if one is already cordoned.
func (w *nodeWatch) arm(names []string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = make(map[string]time.Time, len(names))
	w.seen, w.last = 0, time.Time{}
	for _, n := range names {
		if w.nodes[n].unschedulable {
			return fmt.Errorf("node %s is already cordoned before the measurement", n)
		}
		w.armed[n] = time.Time{}
	}
	return nil
}

// cordoned says how many armed nodes have been seen cordoned and when the
// last of them was.
func (w *nodeWatch) cordoned() (seen int, last time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen, w.last
}

// cordonedAt returns when each of names was first seen cordoned since it
// was armed (zero where not yet, or not armed).
func (w *nodeWatch) cordonedAt(names []string) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return timesOf(w.armed, names)
}

// timesOf returns the time of each of names in at, by position (zero where
// absent).
func timesOf(at map[string]time.Time, names []string) []time.Time {
	out := make([]time.Time, len(names))
	for i, n := range names {
		out[i] = at[n]
	}
	return out
}

// phaseWatch follows every NodeHealth's status.phase through an informer.
type phaseWatch struct {
	notifier
	mu     sync.Mutex
	phases map[string]string
}

var nodeHealthGVR = schema.GroupVersionResource{Group: "gpuhealth.dev", Version: "v1alpha1", Resource: "nodehealths"}

func startPhaseWatch(dyn dynamic.Interface, stop <-chan struct{}) *phaseWatch {
	w := &phaseWatch{phases: map[string]string{}}
	inf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(nodeHealthGVR).Informer()
	set := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
			w.mu.Lock()
			w.phases[u.GetName()] = phase
			w.mu.Unlock()
			w.fire()
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				w.mu.Lock()
				delete(w.phases, u.GetName())
				w.mu.Unlock()
				w.fire()
			}
		},
	})
	go inf.Run(stop)
	return w
}

const (
	phaseHealthy     = "Healthy"
	phaseQuarantined = "Quarantined"
)

// in counts how many of names have a NodeHealth in phase, and sums up the
// phases of the others for progress messages.
func (w *phaseWatch) in(names []string, phase string) (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	others := map[string]int{}
	for _, name := range names {
		p, ok := w.phases[name]
		switch {
		case ok && p == phase:
			n++
		case !ok:
			others["no NodeHealth"]++
		case p == "":
			others["no phase"]++
		default:
			others[p]++
		}
	}
	msg := fmt.Sprintf("%d/%d %s", n, len(names), phase)
	for _, k := range sorted(others) {
		msg += fmt.Sprintf(", %d %s", others[k], k)
	}
	return n, msg
}

// waitPhase waits until every named node's NodeHealth is in phase.
func (h *harness) waitPhase(ctx context.Context, names []string, phase string) error {
	return h.wait(ctx, fmt.Sprintf("%d NodeHealths %s", len(names), phase), h.nodeHealths.changed, func() (bool, string) {
		n, msg := h.nodeHealths.in(names, phase)
		return n == len(names), msg
	})
}

// wait blocks until check reports done, waking on every change; it prints
// progress every 10 seconds and gives up after -timeout without progress
// (the deadline starts again whenever check's message changes).
func (h *harness) wait(ctx context.Context, what string, changed func() <-chan struct{}, check func() (bool, string)) error {
	deadline := time.NewTimer(h.o.timeout)
	defer deadline.Stop()
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	last := ""
	for {
		ch := changed()
		done, msg := check()
		if done {
			return nil
		}
		if msg != last {
			last = msg
			deadline.Reset(h.o.timeout)
		}
		select {
		case <-ch:
		case <-progress.C:
			logf("  waiting for %s: %s", what, msg)
		case <-deadline.C:
			return fmt.Errorf("timed out after %s without progress waiting for %s: %s", h.o.timeout, what, msg)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%s): %w", what, msg, context.Cause(ctx))
		}
	}
}

// parallel calls fn for 0..n-1 on at most workers goroutines and returns the
// first error; after an error the remaining items are skipped.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	items := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range items {
				if ctx.Err() != nil {
					continue
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case items <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(items)
	wg.Wait()
	return context.Cause(ctx)
}
