package nodehealth

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
)

// observedMembership is what this reconcile sees of the node's
// ComputeDomain membership, from the node's labels, the daemon pods in the
// cache and the view; no apiserver call.
type observedMembership struct {
	// uid is the domain's UID; empty when no trace names one.
	uid types.UID
	// traces are the signs of membership present now.
	traces []gpuhealthv1alpha1.MembershipTrace
	// cliqueID is the node's clique within the domain, when known.
	cliqueID string
	// domain is the domain object, when the view knows it.
	domain *computedomain.Domain
	// daemonPods are the node's ComputeDomain daemon pods (cache copies),
	// only those computedomain.IsDaemonPod accepts.
	daemonPods []*corev1.Pod
}

// member says whether anything still ties the node to a domain.
func (m *observedMembership) member() bool { return len(m.traces) > 0 }

// observeComputeDomain reads the node's membership. Membership sources, in
// the order the driver creates them: the node label (the only one when
// IMEX runs as a host service), the domain's daemon pod, and the entry in
// a ComputeDomainClique or, on drivers without cliques, in the domain's
// status.nodes. A pod counts as the daemon pod only in the driver's
// namespace and under a DaemonSet: a tenant's pod carrying the domain label
// must neither keep the node a member nor be deleted as a stale daemon.
func (r *Reconciler) observeComputeDomain(ctx context.Context, node *corev1.Node, nh *gpuhealthv1alpha1.NodeHealth) (*observedMembership, error) {
	m := &observedMembership{}
	if uid := node.Labels[computedomain.NodeLabel]; uid != "" {
		m.uid = types.UID(uid)
		m.traces = append(m.traces, gpuhealthv1alpha1.TraceNodeLabel)
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(r.DriverNamespace),
		client.MatchingFields{gpuhealthv1alpha1.PodNodeNameField: node.Name}, client.HasLabels{computedomain.NodeLabel}); err != nil {
		return nil, fmt.Errorf("listing daemon pods of node %s: %w", node.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !computedomain.IsDaemonPod(p, r.DriverNamespace) {
			continue
		}
		podDomain := types.UID(p.Labels[computedomain.NodeLabel])
		if m.uid == "" {
			m.uid = podDomain
		}
		if podDomain != m.uid {
			continue // a pod of the node's previous domain, still terminating
		}
		if m.cliqueID == "" {
			m.cliqueID = p.Labels[computedomain.PodCliqueLabel]
		}
		m.daemonPods = append(m.daemonPods, p)
	}
	if len(m.daemonPods) > 0 {
		m.traces = append(m.traces, gpuhealthv1alpha1.TraceDaemonPod)
	}
	if r.ComputeDomains != nil {
		for _, l := range r.ComputeDomains.Listed(node.Name) {
			if m.uid == "" {
				m.uid = l.DomainUID
			}
			if l.DomainUID != m.uid {
				continue // a stale entry of another domain; the label's domain wins
			}
			if l.CliqueID != "" {
				m.cliqueID = l.CliqueID
			}
			if !slices.Contains(m.traces, l.Trace) {
				m.traces = append(m.traces, l.Trace)
			}
		}
		if m.uid == "" && nh.Status.ComputeDomain != nil {
			m.uid = types.UID(nh.Status.ComputeDomain.UID)
		}
		if m.uid != "" {
			if d, ok := r.ComputeDomains.Domain(m.uid); ok {
				m.domain = &d
			}
		}
	}
	if m.cliqueID == "" && m.member() {
		m.cliqueID = node.Labels[computedomain.CliqueNodeLabel]
	}
	slices.Sort(m.traces)
	return m, nil
}
