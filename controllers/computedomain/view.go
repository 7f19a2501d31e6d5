package computedomain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// +kubebuilder:rbac:groups=resource.nvidia.com,resources=computedomains;computedomaincliques,verbs=get;list;watch

// DefaultPollInterval is how often the view asks discovery whether the
// ComputeDomain CRDs are served. One small GET every 30 s is negligible,
// and a driver installed later is picked up within that time.
const DefaultPollInterval = 30 * time.Second

// changesBuffer bounds the notifications waiting for the node controller;
// a full buffer makes the informer wait, never drops a wake-up.
const changesBuffer = 1024

// ResourceLister is the part of the discovery client the view uses.
type ResourceLister interface {
	ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error)
}

// Listing is a node's entry in a domain's membership list.
type Listing struct {
	// DomainUID is the domain that lists the node.
	DomainUID types.UID
	// CliqueID is the clique of the entry.
	CliqueID string
	// Trace is where the entry is: CliqueEntry or StatusEntry.
	Trace gpuhealthv1alpha1.MembershipTrace
	// Status is the entry's Ready or NotReady.
	Status string
}

// View is a read-only, in-memory view of the cluster's ComputeDomains and
// ComputeDomainCliques, fed by informers from the manager's cache. It is a
// manager Runnable: it waits, polling discovery, until the CRDs are served
// (a cluster without NVIDIA's DRA driver costs one GET per interval and
// nothing else), then starts the informers; should the CRDs go away, it
// stops them and forgets what it knew. Readers never call the apiserver.
//
// ComputeDomains are read in every namespace (a job's owners create them in
// their own), ComputeDomainCliques only in the DRA driver's namespace,
// where the driver keeps them: a clique elsewhere, which anyone allowed to
// create the kind in their namespace could write, would otherwise list any
// node as a member and hold it in a domain.
type View struct {
	// Cache is the manager's cache; the view adds its informers to it.
	Cache cache.Informers
	// Discovery answers whether the CRDs are served.
	Discovery ResourceLister
	// Clock drives the discovery poll.
	Clock clock.WithTicker
	// PollInterval is how often discovery is asked; zero means 30 s.
	PollInterval time.Duration

	// driverNamespace is the DRA driver's namespace, the only one whose
	// cliques are read.
	driverNamespace string

	changes chan event.GenericEvent

	mu sync.RWMutex
	// watching says which kinds have informers running.
	watching map[schema.GroupVersionKind]bool
	domains  map[types.UID]*Domain
	// domainKeys maps namespace/name to UID, for deletions.
	domainKeys map[types.NamespacedName]types.UID
	cliques    map[types.NamespacedName]*Clique
	// listed is the derived index: node name → the entries that list it.
	listed map[string][]Listing
	// loggedAbsent makes the "no view" message appear once, not every poll.
	loggedAbsent bool
}

// NewView returns a view over c that asks d whether the CRDs are served
// and reads cliques in driverNamespace only.
func NewView(c cache.Informers, d ResourceLister, clk clock.WithTicker, driverNamespace string) *View {
	return &View{
		Cache: c, Discovery: d, Clock: clk, driverNamespace: driverNamespace,
		changes:    make(chan event.GenericEvent, changesBuffer),
		watching:   map[schema.GroupVersionKind]bool{},
		domains:    map[types.UID]*Domain{},
		domainKeys: map[types.NamespacedName]types.UID{},
		cliques:    map[types.NamespacedName]*Clique{},
		listed:     map[string][]Listing{},
	}
}

// Changes delivers the nodes whose listing changed, as objects named after
// the node; the node controller watches it with a channel source. One
// consumer only.
func (v *View) Changes() <-chan event.GenericEvent { return v.changes }

// NeedLeaderElection is false: the view is read-only, and a standby replica
// with a warm view takes over faster.
func (v *View) NeedLeaderElection() bool { return false }

// Start polls discovery until ctx ends.
func (v *View) Start(ctx context.Context) error {
	if v.Cache == nil || v.Discovery == nil || v.Clock == nil || v.changes == nil || v.driverNamespace == "" {
		return errors.New("computedomain.View needs Cache, Discovery, Clock and the driver's namespace (use NewView)")
	}
	interval := v.PollInterval
	if interval == 0 {
		interval = DefaultPollInterval
	}
	t := v.Clock.NewTicker(interval)
	defer t.Stop()
	for {
		v.sync(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// Available says whether ComputeDomain objects are being watched. When
// false, membership comes from node labels and daemon pods alone.
func (v *View) Available() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.watching[ComputeDomainGVK]
}

// Listed returns the entries that list node, by domain UID.
func (v *View) Listed(node string) []Listing {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return slices.Clone(v.listed[node])
}

// CliqueMembers returns the nodes that ComputeDomainCliques list in NVLink
// clique cliqueID, sorted: the driver's word on the clique's members.
func (v *View) CliqueMembers(cliqueID string) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []string
	for node, ls := range v.listed {
		if slices.ContainsFunc(ls, func(l Listing) bool {
			return l.Trace == gpuhealthv1alpha1.TraceCliqueEntry && l.CliqueID == cliqueID
		}) {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// Domain returns a copy of the domain with this UID.
func (v *View) Domain(uid types.UID) (Domain, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	d, ok := v.domains[uid]
	if !ok {
		return Domain{}, false
	}
	out := *d
	out.Nodes = slices.Clone(d.Nodes)
	return out, true
}

// Members returns the nodes the domain lists (its clique entries, or its
// status.nodes when it has no clique objects), sorted.
func (v *View) Members(uid types.UID) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []string
	for node, ls := range v.listed {
		if slices.ContainsFunc(ls, func(l Listing) bool { return l.DomainUID == uid }) {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// sync starts or stops the informers to match what discovery serves.
func (v *View) sync(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("computedomain-view")
	served, err := v.served()
	if err != nil {
		logger.Error(err, "Asking discovery for the ComputeDomain API")
		return
	}
	for _, gvk := range []schema.GroupVersionKind{ComputeDomainGVK, CliqueGVK} {
		v.mu.RLock()
		watching := v.watching[gvk]
		v.mu.RUnlock()
		switch {
		case served[gvk] && !watching:
			if err := v.watch(ctx, gvk); err != nil {
				logger.Error(err, "Starting the informer", "kind", gvk.Kind)
				continue
			}
			logger.Info("Watching ComputeDomain objects", "kind", gvk.Kind)
		case !served[gvk] && watching:
			logger.Info("ComputeDomain API went away; forgetting its objects", "kind", gvk.Kind)
			v.unwatch(ctx, gvk)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	viewAvailable.Set(boolGauge(v.watching[ComputeDomainGVK]))
	if !v.watching[ComputeDomainGVK] && !v.loggedAbsent {
		v.loggedAbsent = true
		logger.Info("ComputeDomain CRDs are not installed; membership comes from node labels only until they are",
			"group", Group, "version", Version)
	}
	if v.watching[ComputeDomainGVK] {
		v.loggedAbsent = false
	}
}

// served asks discovery which of the two kinds the apiserver serves.
func (v *View) served() (map[schema.GroupVersionKind]bool, error) {
	list, err := v.Discovery.ServerResourcesForGroupVersion(Group + "/" + Version)
	if apierrors.IsNotFound(err) {
		return map[schema.GroupVersionKind]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[schema.GroupVersionKind]bool{}
	for _, r := range list.APIResources {
		switch r.Name {
		case ComputeDomainResource:
			out[ComputeDomainGVK] = true
		case CliqueResource:
			out[CliqueGVK] = true
		}
	}
	return out, nil
}

func object(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func (v *View) watch(ctx context.Context, gvk schema.GroupVersionKind) error {
	inf, err := v.Cache.GetInformer(ctx, object(gvk), cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("getting informer for %s: %w", gvk.Kind, err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { v.upsert(ctx, gvk, o) },
		UpdateFunc: func(_, o any) { v.upsert(ctx, gvk, o) },
		DeleteFunc: func(o any) { v.remove(ctx, gvk, o) },
	}); err != nil {
		return fmt.Errorf("watching %s: %w", gvk.Kind, err)
	}
	v.mu.Lock()
	v.watching[gvk] = true
	v.mu.Unlock()
	return nil
}

func (v *View) unwatch(ctx context.Context, gvk schema.GroupVersionKind) {
	if err := v.Cache.RemoveInformer(ctx, object(gvk)); err != nil {
		log.FromContext(ctx).Error(err, "Stopping the informer", "kind", gvk.Kind)
	}
	v.mu.Lock()
	v.watching[gvk] = false
	if gvk == ComputeDomainGVK {
		v.domains, v.domainKeys = map[types.UID]*Domain{}, map[types.NamespacedName]types.UID{}
	} else {
		v.cliques = map[types.NamespacedName]*Clique{}
	}
	changed := v.reindex()
	v.mu.Unlock()
	v.notify(ctx, changed)
}

func (v *View) upsert(ctx context.Context, gvk schema.GroupVersionKind, o any) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok || (gvk == CliqueGVK && u.GetNamespace() != v.driverNamespace) {
		return
	}
	v.mu.Lock()
	var err error
	var members []string
	switch gvk {
	case ComputeDomainGVK:
		var d *Domain
		if d, err = domainFrom(u); err == nil {
			v.domains[d.UID] = d
			v.domainKeys[types.NamespacedName{Namespace: d.Namespace, Name: d.Name}] = d.UID
			members = v.listedBy(d.UID)
		}
	case CliqueGVK:
		var c *Clique
		if c, err = cliqueFrom(u); err == nil {
			v.cliques[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
		}
	}
	changed := v.reindex()
	if d, ok := v.domains[u.GetUID()]; ok && gvk == ComputeDomainGVK {
		members = append(members, v.listedBy(d.UID)...)
	}
	v.mu.Unlock()
	changed = append(changed, members...)
	slices.Sort(changed)
	changed = slices.Compact(changed)
	if err != nil {
		// The driver's schema would not admit it; skip the object, keep the rest.
		log.FromContext(ctx).Error(err, "Skipping a ComputeDomain object that cannot be read")
		return
	}
	v.notify(ctx, changed)
}

func (v *View) remove(ctx context.Context, gvk schema.GroupVersionKind, o any) {
	if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = tomb.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
	var members []string
	v.mu.Lock()
	switch gvk {
	case ComputeDomainGVK:
		if uid, ok := v.domainKeys[key]; ok {
			members = v.listedBy(uid)
			delete(v.domains, uid)
			delete(v.domainKeys, key)
		}
	case CliqueGVK:
		delete(v.cliques, key)
	}
	changed := append(v.reindex(), members...)
	v.mu.Unlock()
	v.notify(ctx, changed)
}

// reindex rebuilds the node index and returns the nodes whose entries
// changed. A domain with clique objects is listed by its cliques (the
// driver's source of truth for fabric-attached members) plus the members
// its status.nodes lists without a clique (cliqueID "": nodes without
// NVLink fabric never appear in a clique); one without cliques, by its
// status.nodes. Rebuilding the whole index is a few thousand map writes
// for a large cluster, and these objects change at human or
// job-scheduling pace. Callers hold mu.
func (v *View) reindex() []string {
	withCliques := map[types.UID]bool{}
	next := map[string][]Listing{}
	for _, c := range v.cliques {
		withCliques[c.DomainUID] = true
		for _, m := range c.Daemons {
			cid := m.CliqueID
			if cid == "" {
				cid = c.CliqueID
			}
			next[m.NodeName] = append(next[m.NodeName], Listing{DomainUID: c.DomainUID, CliqueID: cid, Trace: gpuhealthv1alpha1.TraceCliqueEntry, Status: m.Status})
		}
	}
	for _, d := range v.domains {
		for _, m := range d.Nodes {
			if withCliques[d.UID] && (m.CliqueID != "" || slices.ContainsFunc(next[m.NodeName], func(l Listing) bool { return l.DomainUID == d.UID })) {
				continue // a fabric-attached member: its clique lists it, or it left
			}
			next[m.NodeName] = append(next[m.NodeName], Listing{DomainUID: d.UID, CliqueID: m.CliqueID, Trace: gpuhealthv1alpha1.TraceStatusEntry, Status: m.Status})
		}
	}
	for n := range next {
		sort.Slice(next[n], func(i, j int) bool { return next[n][i].DomainUID < next[n][j].DomainUID })
	}
	var changed []string
	for n, ls := range next {
		if !slices.Equal(ls, v.listed[n]) {
			changed = append(changed, n)
		}
	}
	for n := range v.listed {
		if _, ok := next[n]; !ok {
			changed = append(changed, n)
		}
	}
	v.listed = next
	return changed
}

// listedBy returns the nodes listed under the domain. A domain's own status
// (Ready, NotReady) is part of each member's NodeHealth, so a domain event
// wakes its members even when the listing is unchanged. Callers hold mu.
func (v *View) listedBy(uid types.UID) []string {
	var out []string
	for n, ls := range v.listed {
		if slices.ContainsFunc(ls, func(l Listing) bool { return l.DomainUID == uid }) {
			out = append(out, n)
		}
	}
	return out
}

// notify wakes the nodes whose view changed; it waits while the node
// controller's queue is full rather than dropping a wake-up.
func (v *View) notify(ctx context.Context, nodes []string) {
	for _, n := range nodes {
		select {
		case v.changes <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: n}}}:
		case <-ctx.Done():
			return
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
