package nodehealth

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// GPUResource is the extended resource NVIDIA's device plugin advertises.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Causes of lost GPU time, the cause label of
// gpuhealth_node_gpus_out_of_service: an outage's cause, or for a Healthy
// node one that keeps new work off it.
const (
	causeCordoned = "cordoned"
	causeFabric   = "fabric"
	// causeDevice is one GPU out of service alone (status.devices) on a
	// node in service: it counts one GPU, not the node's.
	causeDevice = "device"
)

// deviceCheck is the check a device's class names ("xid" → XID).
func deviceCheck(class string) string {
	for _, c := range []gpuhealthv1alpha1.Check{gpuhealthv1alpha1.CheckXID} {
		if strings.EqualFold(string(c), class) {
			return string(c)
		}
	}
	return class
}

var (
	nodeGPUsDesc = prometheus.NewDesc("gpuhealth_node_gpus",
		"The GPUs of each managed node: the larger of its nvidia.com/gpu capacity and allocatable.", []string{labelNode}, nil)
	outOfServiceDesc = prometheus.NewDesc("gpuhealth_node_gpus_out_of_service",
		"The GPUs (as gpuhealth_node_gpus) of each managed node that is not in service: not Healthy, or Healthy but cordoned by someone else or fabric-degraded; by phase, cause (fault, maintenance, certification, request, cordoned, fabric, device) and, for a fault or a device, its check and code; a GPU out of service alone on a node in service (cause device) counts one GPU.",
		[]string{labelNode, labelPhase, "cause", labelCheck, "code"}, nil)
	strandedDesc = prometheus.NewDesc("gpuhealth_computedomain_stranded_gpus",
		"The GPUs of the in-service members of a ComputeDomain with a member out of service: the domain cannot run at full size.",
		[]string{"computedomain"}, nil)
)

// nodeGauges exports the per-node and GPU-time gauges at each scrape,
// from the persisted NodeHealth status and the cached Nodes, so they need
// no bookkeeping of their own and cannot drift from what is written: a new
// leader exports every node's phase once its cache has synced, before its
// first pass. Only the leader exports them: a standby's copy would double
// every sum.
type nodeGauges struct {
	mu      sync.Mutex
	reader  client.Reader
	elected <-chan struct{}
}

var gauges = &nodeGauges{}

func init() { metrics.Registry.MustRegister(gauges) }

// serve makes the gauges read from reader once elected is closed.
func (f *nodeGauges) serve(reader client.Reader, elected <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reader, f.elected = reader, elected
}

// Describe sends the gauges' descriptions.
func (f *nodeGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodePhaseDesc
	ch <- drainTimedOutDesc
	ch <- deadMemberListedDesc
	ch <- awaitingApprovalDesc
	ch <- activeFindingsDesc
	ch <- nodeGPUsDesc
	ch <- outOfServiceDesc
	ch <- strandedDesc
}

// Collect lists NodeHealths and Nodes from the cache and sends the gauges.
func (f *nodeGauges) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	reader, elected := f.reader, f.elected
	f.mu.Unlock()
	if reader == nil {
		return
	}
	select {
	case <-elected:
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nhs := &gpuhealthv1alpha1.NodeHealthList{}
	nodes := &corev1.NodeList{}
	policies := &gpuhealthv1alpha1.RemediationPolicyList{}
	if reader.List(ctx, nhs, client.UnsafeDisableDeepCopy) != nil || reader.List(ctx, nodes, client.UnsafeDisableDeepCopy) != nil ||
		reader.List(ctx, policies) != nil {
		return
	}
	byName := make(map[string]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		if gpuhealthv1alpha1.ManagingPolicy(policies.Items, nodes.Items[i].Labels) != nil {
			byName[nodes.Items[i].Name] = &nodes.Items[i]
		}
	}
	for i := range nhs.Items {
		nh := &nhs.Items[i]
		if !managed(nh, byName[nh.Name]) {
			continue
		}
		st := &nh.Status
		ch <- prometheus.MustNewConstMetric(nodePhaseDesc, prometheus.GaugeValue, 1, nh.Name, string(st.Phase))
		ch <- prometheus.MustNewConstMetric(drainTimedOutDesc, prometheus.GaugeValue,
			b2f(meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthDrainTimedOutCondition)), nh.Name)
		ch <- prometheus.MustNewConstMetric(deadMemberListedDesc, prometheus.GaugeValue,
			b2f(meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthDeadMemberListedCondition)), nh.Name)
		ch <- prometheus.MustNewConstMetric(awaitingApprovalDesc, prometheus.GaugeValue,
			b2f(meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthAwaitingApprovalCondition)), nh.Name)
		ch <- prometheus.MustNewConstMetric(activeFindingsDesc, prometheus.GaugeValue, float64(len(st.ActiveEvents)), nh.Name)
	}
	for _, s := range gpuTime(nhs.Items, byName) {
		switch {
		case s.domain != "":
			ch <- prometheus.MustNewConstMetric(strandedDesc, prometheus.GaugeValue, s.gpus, s.domain)
		case s.cause == "":
			ch <- prometheus.MustNewConstMetric(nodeGPUsDesc, prometheus.GaugeValue, s.gpus, s.node)
		default:
			ch <- prometheus.MustNewConstMetric(outOfServiceDesc, prometheus.GaugeValue, s.gpus, s.node, string(s.phase), s.cause, string(s.check), s.code)
		}
	}
}

// gpuSample is one gauge value: a node's GPUs (no cause), its GPUs out of
// service (a cause), or a domain's stranded GPUs (a domain).
type gpuSample struct {
	node   string
	phase  gpuhealthv1alpha1.NodeHealthPhase
	cause  string
	check  gpuhealthv1alpha1.Check
	code   string
	domain string
	gpus   float64
}

// gpuTime is the gauges' values: a pure function of the NodeHealths and
// the Nodes a policy manages.
func gpuTime(nhs []gpuhealthv1alpha1.NodeHealth, nodes map[string]*corev1.Node) []gpuSample {
	var out []gpuSample
	type domain struct {
		inService float64
		out       bool
	}
	domains := map[string]*domain{}
	var order []string
	for i := range nhs {
		nh := &nhs[i]
		n := nodes[nh.Name]
		if !managed(nh, n) {
			continue
		}
		gpus := nodeGPUs(n)
		out = append(out, gpuSample{node: n.Name, gpus: gpus})
		s, lost := outOfService(nh, n)
		if lost {
			s.node, s.gpus = n.Name, gpus
			out = append(out, s)
		} else {
			// A GPU out of service alone is one GPU of a node in service.
			for _, e := range nh.Status.Devices {
				check, code, _ := strings.Cut(e.Class, "-")
				out = append(out, gpuSample{node: n.Name, phase: nh.Status.Phase, cause: causeDevice,
					check: gpuhealthv1alpha1.Check(deviceCheck(check)), code: code, gpus: 1})
			}
		}
		if cd := nh.Status.ComputeDomain; cd != nil && cd.UID != "" {
			key := cd.UID
			if cd.Name != "" {
				key = cd.Namespace + "/" + cd.Name
			}
			dm := domains[key]
			if dm == nil {
				dm = &domain{}
				domains[key] = dm
				order = append(order, key)
			}
			if lost {
				dm.out = true
			} else {
				dm.inService += gpus
			}
		}
	}
	for _, key := range order {
		if dm := domains[key]; dm.out {
			out = append(out, gpuSample{domain: key, gpus: dm.inService})
		}
	}
	return out
}

// managed says whether the gauges show a node: one a policy manages (n,
// from the Nodes a policy manages, is not nil), not excluded by a human,
// with a phase and its Managed condition True. An excluded node has no
// phase gpuhealth tracks (it is left as it is), so no alert fires on it.
func managed(nh *gpuhealthv1alpha1.NodeHealth, n *corev1.Node) bool {
	return n != nil && !nh.Spec.Exclude && nh.Status.Phase != "" &&
		meta.IsStatusConditionTrue(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
}

// nodeGPUs is the node's GPU count: the larger of its nvidia.com/gpu
// capacity and allocatable. The device plugin takes a sick GPU out of
// allocatable, and a restarting kubelet reports none for a while; counting
// only allocatable would shrink the fleet exactly while GPUs are lost.
func nodeGPUs(n *corev1.Node) float64 {
	c, a := n.Status.Capacity[GPUResource], n.Status.Allocatable[GPUResource]
	return float64(max(c.Value(), a.Value()))
}

// outOfService says whether a managed node's GPUs are out of service, and why.
func outOfService(nh *gpuhealthv1alpha1.NodeHealth, n *corev1.Node) (gpuSample, bool) {
	st := &nh.Status
	s := gpuSample{phase: st.Phase}
	if st.Phase == gpuhealthv1alpha1.PhaseHealthy {
		switch {
		case nodepkg.AppliedOn(n).Any():
			// gpuhealth's own fence, its bookkeeping still to follow.
			s.cause = strings.ToLower(string(gpuhealthv1alpha1.OutageFault))
		case n.Spec.Unschedulable:
			s.cause = causeCordoned
		case slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1alpha1.FabricDegradedTaintKey }):
			s.cause = causeFabric
		default:
			return s, false
		}
		return s, true
	}
	switch o := st.Outage; {
	case o == nil && st.Phase != gpuhealthv1alpha1.PhaseCertifying && !nodepkg.AppliedOn(n).Any():
		// Out of service on paper only: a dry run fences nothing.
		return s, false
	case o != nil:
		s.cause, s.check, s.code = strings.ToLower(string(o.Cause)), o.Check, o.Code
	case st.Phase == gpuhealthv1alpha1.PhaseCertifying:
		s.cause = strings.ToLower(string(gpuhealthv1alpha1.OutageCertification))
	default:
		s.cause = strings.ToLower(string(gpuhealthv1alpha1.OutageFault))
	}
	return s, true
}
