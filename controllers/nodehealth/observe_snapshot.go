package nodehealth

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// snapshotCache keeps, per policy (and its generation), what a budget count
// reads from the informer cache — the managed nodes' labels and every NodeHealth — and rebuilds it
// only when something a count depends on changed: a node added, deleted or
// relabelled, a NodeHealth added, deleted, entering or leaving a phase that
// uses a budget, or changing its ComputeDomain. Without it every reconcile
// of a quarantined node copied the whole fleet twice, which at 2,000 nodes
// made a restarted operator fence ~10 nodes a second.
//
// The snapshot's objects are the cache's own (read-only). A count from it is
// the cheap first check; the decision to drain is confirmed from the
// apiserver under the admission lock (see admit).
type snapshotCache struct {
	version atomic.Uint64

	mu    sync.Mutex
	snaps map[types.UID]*budgetSnapshot // by policy
}

type budgetSnapshot struct {
	version    uint64
	generation int64 // the policy's
	managed    map[string]map[string]string
	nhs        []gpuhealthv1alpha1.NodeHealth
}

// changed invalidates every snapshot.
func (f *snapshotCache) changed() {
	if f != nil {
		f.version.Add(1)
	}
}

// watch registers the informer handlers that invalidate the snapshots. The
// informer updates its store before it calls handlers, so a snapshot taken
// after a change was stored is never older than the version it carries.
func (f *snapshotCache) watch(ctx context.Context, mgr ctrl.Manager) error {
	nodes, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("getting the node informer: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f.changed() },
		DeleteFunc: func(any) { f.changed() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !sameLabelsButPhase(on.Labels, nn.Labels) {
				f.changed()
			}
		},
	}); err != nil {
		return fmt.Errorf("watching nodes for budget counts: %w", err)
	}
	nhs, err := mgr.GetCache().GetInformer(ctx, &gpuhealthv1alpha1.NodeHealth{})
	if err != nil {
		return fmt.Errorf("getting the nodehealth informer: %w", err)
	}
	if _, err := nhs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f.changed() },
		DeleteFunc: func(any) { f.changed() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*gpuhealthv1alpha1.NodeHealth)
			nn, ok2 := n.(*gpuhealthv1alpha1.NodeHealth)
			if !ok1 || !ok2 || usesBudget(on) != usesBudget(nn) ||
				!equality.Semantic.DeepEqual(on.Status.ComputeDomain, nn.Status.ComputeDomain) {
				f.changed()
			}
		},
	}); err != nil {
		return fmt.Errorf("watching nodehealths for budget counts: %w", err)
	}
	return nil
}

// sameLabelsButPhase says whether two label sets differ at most in the
// phase label gpuhealth itself sets at every fence (selecting nodes by it
// is not supported), so that a storm of fences does not invalidate the
// snapshot at every node.
func sameLabelsButPhase(a, b map[string]string) bool {
	if a[nodepkg.PhaseLabel] == b[nodepkg.PhaseLabel] {
		return maps.Equal(a, b)
	}
	a, b = maps.Clone(a), maps.Clone(b)
	delete(a, nodepkg.PhaseLabel)
	delete(b, nodepkg.PhaseLabel)
	return maps.Equal(a, b)
}

// snapshot returns the nodes the policy manages (labels by name) and every
// NodeHealth, from the informer cache, read-only.
func (r *Reconciler) snapshot(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (map[string]map[string]string, []gpuhealthv1alpha1.NodeHealth, error) {
	f := r.snapshots
	if f == nil {
		return r.readSnapshot(ctx, p)
	}
	// One rebuild at a time: the workers that wait for it use its result.
	f.mu.Lock()
	defer f.mu.Unlock()
	// Read under the lock, so a worker that waited for a rebuild does not
	// take a snapshot that a change during its wait made outdated.
	v := f.version.Load()
	if s := f.snaps[p.UID]; s != nil && s.version == v && s.generation == p.Generation {
		return s.managed, s.nhs, nil
	}
	managed, nhs, err := r.readSnapshot(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	if f.snaps == nil {
		f.snaps = map[types.UID]*budgetSnapshot{}
	}
	for uid, s := range f.snaps {
		if s.version != v {
			delete(f.snaps, uid) // outdated: a deleted policy's, say
		}
	}
	f.snaps[p.UID] = &budgetSnapshot{version: v, generation: p.Generation, managed: managed, nhs: nhs}
	return managed, nhs, nil
}

func (r *Reconciler) readSnapshot(ctx context.Context, p *gpuhealthv1alpha1.RemediationPolicy) (map[string]map[string]string, []gpuhealthv1alpha1.NodeHealth, error) {
	managed, err := r.managedNodes(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing nodehealths: %w", err)
	}
	return managed, list.Items, nil
}
