package framework

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

// The DRA driver's names, as NVIDIA's driver writes them (written here from
// its documented API, not from gpuhealth's code, so that the two can
// disagree).
const (
	draGroup   = "resource.nvidia.com"
	draVersion = "v1beta1"
	// DomainNodeLabel is set on a node while a workload's channel claim of
	// the domain is prepared there; its value is the domain's UID.
	DomainNodeLabel = "resource.nvidia.com/computeDomain"
	// DaemonCliqueLabel is the label a v25.12+ daemon puts on its own pod.
	DaemonCliqueLabel = "resource.nvidia.com/computeDomain.cliqueID"
	// WorkloadDomainLabel marks a workload pod as holding the channel
	// claim of the ComputeDomain it names (in the pod's namespace).
	// Nothing here publishes the driver's channel devices, so a label
	// stands for the pod's resourceClaims entry.
	WorkloadDomainLabel = "e2e.gpuhealth.dev/compute-domain"
)

var (
	// ComputeDomainGVK is the driver's ComputeDomain kind.
	ComputeDomainGVK = schema.GroupVersionKind{Group: draGroup, Version: draVersion, Kind: "ComputeDomain"}
	// CliqueGVK is the driver's ComputeDomainClique kind (v25.12 and later).
	CliqueGVK = schema.GroupVersionKind{Group: draGroup, Version: draVersion, Kind: "ComputeDomainClique"}
)

// DaemonEntry is one member entry: an element of a clique's daemons[] or
// of a domain's status.nodes[] (Name there, NodeName in a clique).
type DaemonEntry struct {
	Name      string `json:"name,omitempty"`
	NodeName  string `json:"nodeName,omitempty"`
	IPAddress string `json:"ipAddress"`
	CliqueID  string `json:"cliqueID"`
	Index     int64  `json:"index"`
	Status    string `json:"status,omitempty"`
}

func (e DaemonEntry) node() string { return e.Name + e.NodeName }

// DRADriver plays the ComputeDomain part of NVIDIA's DRA driver for GPUs on
// the kwok cluster, by the rules documented for each driver version; the
// cluster's own DaemonSet controller, scheduler and kwok run what the driver
// creates. Each pass (every Interval, about 2 s as the driver's status
// resync) plays:
//   - the kubelet plugin: a node that runs a workload pod of a domain (by
//     WorkloadDomainLabel; a terminating pod still holds its claim) gets
//     DomainNodeLabel, and loses it once no such pod is left. The plugin runs
//     on the node, so a NotReady node's label is never touched;
//   - the controller: one DaemonSet per domain in Namespace (named
//     computedomain-daemon-<uid> from v25.12, generateName <name>- on v25.8)
//     selecting the labelled nodes, tolerating every taint; deleted with its
//     domain; the domain's status.status set to Ready;
//   - each Ready daemon pod: on v25.12+ it labels its pod with its node's
//     clique (nvidia.com/gpu.clique, "" without one) and adds itself to the
//     clique object <uid>.<cliqueID> (owned by the daemon pods); on v25.8 it
//     adds itself to the domain's status.nodes;
//   - the controller's removal rules: v25.12+ keeps a clique entry while a
//     daemon pod object of the domain (any phase, terminating too) is bound
//     to the node, and rebuilds status.nodes from the cliques plus the
//     no-fabric daemon pods (cliqueID "", index -1); v25.8 drops a
//     status.nodes entry whose IP is no longer that of a daemon pod on the
//     entry's node.
type DRADriver struct {
	Client client.Client
	// Namespace is the driver's namespace (the DaemonSets, pods and cliques).
	Namespace string
	// Cliques selects the v25.12+ shape; false plays v25.8.
	Cliques bool
	// Interval between passes; zero means 2 s.
	Interval time.Duration
	// Log receives errors of a pass (the next pass retries).
	Log func(format string, args ...any)

	done chan struct{}
	stop context.CancelFunc
}

// Start creates the namespace and runs passes until Stop.
func (d *DRADriver) Start(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.Namespace}}
	if err := d.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the driver's namespace: %w", err)
	}
	interval := d.Interval
	if interval == 0 {
		interval = 2 * time.Second
	}
	ctx, d.stop = context.WithCancel(ctx)
	d.done = make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if err := d.Sync(ctx); err != nil && ctx.Err() == nil && d.Log != nil {
				d.Log("DRA driver stand-in: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the passes and waits for the current one.
func (d *DRADriver) Stop() {
	if d.stop != nil {
		d.stop()
		<-d.done
	}
}

// domainState is what one pass knows about one domain.
type domainState struct {
	obj  *unstructured.Unstructured
	pods []corev1.Pod // its daemon pods, any phase
}

// Sync runs one pass.
func (d *DRADriver) Sync(ctx context.Context) error {
	var cds unstructured.UnstructuredList
	cds.SetGroupVersionKind(ComputeDomainGVK)
	if err := d.Client.List(ctx, &cds); err != nil {
		return fmt.Errorf("listing ComputeDomains: %w", err)
	}
	domains := map[types.UID]*domainState{}
	byName := map[types.NamespacedName]types.UID{}
	for i := range cds.Items {
		cd := &cds.Items[i]
		if cd.GetDeletionTimestamp() != nil {
			continue
		}
		domains[cd.GetUID()] = &domainState{obj: cd}
		byName[types.NamespacedName{Namespace: cd.GetNamespace(), Name: cd.GetName()}] = cd.GetUID()
	}
	var nodes corev1.NodeList
	if err := d.Client.List(ctx, &nodes); err != nil {
		return err
	}
	var errs []error
	errs = append(errs, d.kubeletPlugin(ctx, nodes.Items, byName))
	errs = append(errs, d.daemonSets(ctx, domains))
	var pods corev1.PodList
	if err := d.Client.List(ctx, &pods, client.InNamespace(d.Namespace), client.HasLabels{DomainNodeLabel}); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, p := range pods.Items {
		if s := domains[types.UID(p.Labels[DomainNodeLabel])]; s != nil {
			s.pods = append(s.pods, p)
		}
	}
	cliqueOf := map[string]string{}
	for _, n := range nodes.Items {
		cliqueOf[n.Name] = n.Labels[CliqueLabel]
	}
	if d.Cliques {
		errs = append(errs, d.syncCliques(ctx, domains, cliqueOf))
	} else {
		for _, s := range domains {
			errs = append(errs, d.syncStatusNodes(ctx, s, cliqueOf))
		}
	}
	return errors.Join(errs...)
}

// kubeletPlugin prepares and unprepares the nodes' channel claims.
func (d *DRADriver) kubeletPlugin(ctx context.Context, nodes []corev1.Node, byName map[types.NamespacedName]types.UID) error {
	var pods corev1.PodList
	if err := d.Client.List(ctx, &pods, client.HasLabels{WorkloadDomainLabel}); err != nil {
		return err
	}
	prepared := map[string]types.UID{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if uid, ok := byName[types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[WorkloadDomainLabel]}]; ok {
			prepared[p.Spec.NodeName] = uid
		}
	}
	var errs []error
	for i := range nodes {
		n := &nodes[i]
		want, have := string(prepared[n.Name]), n.Labels[DomainNodeLabel]
		if want == have || !readiness.Node(n) {
			continue
		}
		patch := client.MergeFrom(n.DeepCopy())
		if want == "" {
			delete(n.Labels, DomainNodeLabel)
		} else {
			n.Labels[DomainNodeLabel] = want
		}
		errs = append(errs, d.Client.Patch(ctx, n, patch))
	}
	return errors.Join(errs...)
}

// nodeReady is readiness.Node, under the name the harness's callers use.
func nodeReady(n *corev1.Node) bool { return readiness.Node(n) }

// daemonSets keeps one daemon DaemonSet per domain.
func (d *DRADriver) daemonSets(ctx context.Context, domains map[types.UID]*domainState) error {
	var list appsv1.DaemonSetList
	if err := d.Client.List(ctx, &list, client.InNamespace(d.Namespace), client.HasLabels{DomainNodeLabel}); err != nil {
		return err
	}
	var errs []error
	have := map[types.UID]bool{}
	for i := range list.Items {
		ds := &list.Items[i]
		uid := types.UID(ds.Labels[DomainNodeLabel])
		if domains[uid] == nil {
			errs = append(errs, client.IgnoreNotFound(d.Client.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationBackground))))
			continue
		}
		have[uid] = true
	}
	for uid, s := range domains {
		if have[uid] {
			continue
		}
		labels := map[string]string{DomainNodeLabel: string(uid)}
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Labels: labels},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						NodeSelector: labels,
						Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
						Containers:   []corev1.Container{{Name: "compute-domain-daemon", Image: "compute-domain-daemon:fake"}},
					},
				},
			},
		}
		if d.Cliques {
			ds.Name = "computedomain-daemon-" + string(uid)
		} else {
			ds.GenerateName = s.obj.GetName() + "-"
		}
		errs = append(errs, d.Client.Create(ctx, ds))
	}
	return errors.Join(errs...)
}

// runningDaemon says whether the daemon in pod p is up and has joined: the
// pod runs, is Ready and has an IP.
func runningDaemon(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning && readiness.Pod(p)
}

// boundTo is the node a daemon pod is for: the node it is bound to, or,
// before the scheduler binds it, the node the DaemonSet controller's node
// affinity names.
func boundTo(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil || p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// syncStatusNodes plays v25.8: the daemons add themselves to status.nodes,
// the controller drops entries whose daemon pod (by IP) is gone.
func (d *DRADriver) syncStatusNodes(ctx context.Context, s *domainState, cliqueOf map[string]string) error {
	old, err := entries(s.obj.Object, "status", "nodes")
	if err != nil {
		return err
	}
	// By IP, and on the entry's node: kwok hands out pod IPs from one range
	// for all nodes and reuses them, where a real cluster's per-node pod
	// ranges would not.
	ips := map[string]bool{}
	for _, p := range s.pods {
		if p.Status.PodIP != "" {
			ips[p.Spec.NodeName+"/"+p.Status.PodIP] = true
		}
	}
	var kept []DaemonEntry
	for _, e := range old {
		if ips[e.node()+"/"+e.IPAddress] {
			kept = append(kept, e)
		}
	}
	for i := range s.pods {
		p := &s.pods[i]
		if runningDaemon(p) {
			kept = upsert(kept, DaemonEntry{Name: p.Spec.NodeName, IPAddress: p.Status.PodIP, CliqueID: cliqueOf[p.Spec.NodeName], Status: "Ready"})
		}
	}
	return d.writeStatus(ctx, s.obj, old, kept)
}

// syncCliques plays v25.12+: daemons join their clique objects, the
// controller drops entries of nodes without a daemon pod object and
// rebuilds each domain's status.nodes.
func (d *DRADriver) syncCliques(ctx context.Context, domains map[types.UID]*domainState, cliqueOf map[string]string) error {
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(CliqueGVK)
	if err := d.Client.List(ctx, &list, client.InNamespace(d.Namespace)); err != nil {
		return fmt.Errorf("listing ComputeDomainCliques: %w", err)
	}
	cliques := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		cliques[list.Items[i].GetName()] = &list.Items[i]
	}
	var errs []error
	for uid, s := range domains {
		bound := map[string][]corev1.Pod{}
		for _, p := range s.pods {
			if n := boundTo(&p); n != "" {
				bound[n] = append(bound[n], p)
			}
		}
		// The daemons label their pods and say which clique they join.
		joining := map[string][]DaemonEntry{}
		var noFabric []DaemonEntry
		for i := range s.pods {
			p := &s.pods[i]
			if !runningDaemon(p) {
				continue
			}
			clique := cliqueOf[p.Spec.NodeName]
			if v, ok := p.Labels[DaemonCliqueLabel]; !ok || v != clique {
				patch := client.MergeFrom(p.DeepCopy())
				p.Labels[DaemonCliqueLabel] = clique
				errs = append(errs, client.IgnoreNotFound(d.Client.Patch(ctx, p, patch)))
			}
			e := DaemonEntry{NodeName: p.Spec.NodeName, IPAddress: p.Status.PodIP, CliqueID: clique, Status: "Ready"}
			if clique == "" {
				noFabric = append(noFabric, DaemonEntry{Name: p.Spec.NodeName, IPAddress: p.Status.PodIP, Index: -1, Status: "Ready"})
				continue
			}
			joining[clique] = append(joining[clique], e)
		}
		var all []DaemonEntry
		names := map[string]bool{}
		for clique := range joining {
			names[string(uid)+"."+clique] = true
		}
		for name := range cliques {
			if strings.HasPrefix(name, string(uid)+".") {
				names[name] = true
			}
		}
		for name := range names {
			clique := strings.TrimPrefix(name, string(uid)+".")
			kept, err := d.syncClique(ctx, uid, clique, cliques[name], joining[clique], bound)
			errs = append(errs, err)
			for _, e := range kept {
				all = append(all, DaemonEntry{Name: e.NodeName, IPAddress: e.IPAddress, CliqueID: e.CliqueID, Index: e.Index, Status: e.Status})
			}
		}
		all = append(all, noFabric...)
		slices.SortFunc(all, func(a, b DaemonEntry) int { return strings.Compare(a.node(), b.node()) })
		old, err := entries(s.obj.Object, "status", "nodes")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, d.writeStatus(ctx, s.obj, old, all))
	}
	return errors.Join(errs...)
}

// syncClique updates one clique object and returns its entries.
func (d *DRADriver) syncClique(ctx context.Context, uid types.UID, clique string, obj *unstructured.Unstructured, joining []DaemonEntry, bound map[string][]corev1.Pod) ([]DaemonEntry, error) {
	var old []DaemonEntry
	if obj != nil {
		var err error
		if old, err = entries(obj.Object, "daemons"); err != nil {
			return nil, err
		}
	}
	var kept []DaemonEntry
	for _, e := range old {
		if len(bound[e.NodeName]) > 0 {
			kept = append(kept, e)
		}
	}
	for _, e := range joining {
		kept = upsert(kept, e)
	}
	if obj != nil && slices.Equal(old, kept) {
		return kept, nil
	}
	if obj == nil {
		if len(kept) == 0 {
			return nil, nil
		}
		obj = &unstructured.Unstructured{}
		obj.SetGroupVersionKind(CliqueGVK)
		obj.SetNamespace(d.Namespace)
		obj.SetName(string(uid) + "." + clique)
		obj.SetLabels(map[string]string{DomainNodeLabel: string(uid), DaemonCliqueLabel: clique})
	}
	var owners []metav1.OwnerReference
	for _, e := range kept {
		for _, p := range bound[e.NodeName] {
			owners = append(owners, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID})
		}
	}
	obj.SetOwnerReferences(owners)
	list, err := toList(kept)
	if err != nil {
		return nil, err
	}
	obj.Object["daemons"] = list
	if obj.GetResourceVersion() == "" {
		return kept, d.Client.Create(ctx, obj)
	}
	return kept, d.Client.Update(ctx, obj)
}

// writeStatus writes the domain's status (Ready, the given nodes) when it changed.
func (d *DRADriver) writeStatus(ctx context.Context, cd *unstructured.Unstructured, old, nodes []DaemonEntry) error {
	status, _, _ := unstructured.NestedString(cd.Object, "status", "status")
	if status == "Ready" && slices.Equal(old, nodes) {
		return nil
	}
	list, err := toList(nodes)
	if err != nil {
		return err
	}
	cd.Object["status"] = map[string]any{"status": "Ready", "nodes": list}
	return d.Client.Status().Update(ctx, cd)
}

// upsert adds e to list, or refreshes the node's entry, keeping its index;
// a new entry takes the lowest index its clique does not use.
func upsert(list []DaemonEntry, e DaemonEntry) []DaemonEntry {
	used := map[int64]bool{}
	for i := range list {
		if list[i].node() == e.node() {
			e.Index = list[i].Index
			list[i] = e
			return list
		}
		if list[i].CliqueID == e.CliqueID {
			used[list[i].Index] = true
		}
	}
	for e.Index = 0; used[e.Index]; e.Index++ {
	}
	return append(list, e)
}

func entries(obj map[string]any, fields ...string) ([]DaemonEntry, error) {
	raw, _, err := unstructured.NestedSlice(obj, fields...)
	if err != nil {
		return nil, err
	}
	out := make([]DaemonEntry, 0, len(raw))
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: entry %v is no object", strings.Join(fields, "."), r)
		}
		var e DaemonEntry
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func toList(es []DaemonEntry) ([]any, error) {
	out := make([]any, 0, len(es))
	for i := range es {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&es[i])
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// CreateComputeDomain creates a ComputeDomain the real schema accepts (the
// channel's claim template named after it, numNodes 0) and returns its UID.
func CreateComputeDomain(ctx context.Context, c client.Client, namespace, name string) (types.UID, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(ComputeDomainGVK)
	cd.SetNamespace(namespace)
	cd.SetName(name)
	cd.Object["spec"] = map[string]any{"numNodes": int64(0), "channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": name + "-channel"}}}
	if err := c.Create(ctx, cd); err != nil {
		return "", fmt.Errorf("creating ComputeDomain %s/%s: %w", namespace, name, err)
	}
	return cd.GetUID(), nil
}

// Listed returns the nodes the domain's entries list in this shape: its
// clique objects' daemons (v25.12+, plus no-fabric status.nodes entries)
// or its status.nodes (v25.8).
func (d *DRADriver) Listed(ctx context.Context, namespace, name string) ([]string, error) {
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(ComputeDomainGVK)
	if err := d.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, cd); err != nil {
		return nil, err
	}
	es, err := entries(cd.Object, "status", "nodes")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if !d.Cliques || e.CliqueID == "" {
			out = append(out, e.node())
		}
	}
	if d.Cliques {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(CliqueGVK)
		if err := d.Client.List(ctx, &list, client.InNamespace(d.Namespace), client.MatchingLabels{DomainNodeLabel: string(cd.GetUID())}); err != nil {
			return nil, err
		}
		for _, cl := range list.Items {
			es, err := entries(cl.Object, "daemons")
			if err != nil {
				return nil, err
			}
			for _, e := range es {
				out = append(out, e.node())
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
