package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/budget"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
)

// The one-GPU workflow reads slices, rules and claims from the apiserver,
// never through a cache (no watch), and writes only its own rules.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=devicetaintrules,verbs=get;list;create;update;delete
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=list
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get

// defaultMaxUnavailableDevices is a policy's maxUnavailableDevices when it sets none.
var defaultMaxUnavailableDevices = intstr.FromString("5%")

// gpusPerNodeLabel is GPU feature discovery's count of a node's GPUs; a
// node without it counts as 8, for the device budget and breaker.
// maxGPUsPerNode caps what one node may claim: the label is under
// nvidia.com, which a node's kubelet may write on its own Node, and the
// count sizes limits that protect every other node's GPUs. 16 is the most
// GPUs NVIDIA puts in one node (DGX-2, HGX-2), so a node can at most
// double its share of an 8-GPU fleet's budget, not make it unbounded.
const (
	gpusPerNodeLabel   = "nvidia.com/gpu.count"
	defaultGPUsPerNode = 8
	maxGPUsPerNode     = 16
)

// observedDevices is what the one-GPU workflow needs to know of a node:
// read when a finding of scope Device counts, or a GPU is out alone.
type observedDevices struct {
	// found are the GPUs such findings name, by UUID, as found in the
	// policy's DRA driver's ResourceSlices of the node; missing says why
	// one was not (it is then handled on the node).
	found   map[string]devicetaint.Device
	missing map[string]string
	// rules are gpuhealth's DeviceTaintRules of the node, by name, read
	// from the apiserver (never a cache that may lag our own writes).
	rules map[string]*resourcev1.DeviceTaintRule
	// drained is the drain pass of each draining GPU, by UUID, run before
	// deciding (see actBeforeDeciding).
	drained map[string]*drainPass
	// breaker and budget answer one more GPU out; set when a finding
	// names a GPU not out yet.
	breaker *breakerView
	budget  *deviceBudget
}

// deviceBudget is maxUnavailableDevices, counted.
type deviceBudget struct {
	limit, out int
	err        error
}

// wantsDevices says whether decide needs the one-GPU inputs: a GPU is out
// alone, or a counting finding falls under a rule of scope Device.
func wantsDevices(o *observation, judged []judgement) bool {
	if len(o.nh.Status.Devices) > 0 {
		return true
	}
	for _, j := range judged {
		if j.counts && j.scope == gpuhealthv1alpha1.ScopeDevice {
			return true
		}
	}
	return false
}

// observeDevices reads the one-GPU inputs: the GPUs named, gpuhealth's
// rules of the node, and, for a GPU not out yet, its breaker and budget.
// Slices and rules come from the apiserver: the slices are read by field
// selectors, and the rules must show this process's last write.
func (r *Reconciler) observeDevices(ctx context.Context, o *observation) (*observedDevices, error) {
	s := devicesOf(o.policy)
	od := &observedDevices{found: map[string]devicetaint.Device{}, missing: map[string]string{}, drained: map[string]*drainPass{}}
	out := map[string]bool{}
	for _, e := range o.nh.Status.Devices {
		out[e.UUID] = true
	}
	fresh := false
	for _, j := range judgeAll(o) {
		sp := &j.event.Spec
		if !j.counts || j.scope != gpuhealthv1alpha1.ScopeDevice || sp.Component.Kind != gpuhealthv1alpha1.ComponentGPU {
			continue
		}
		uuid := sp.Component.ID
		if _, seen := od.found[uuid]; seen || od.missing[uuid] != "" {
			continue
		}
		dev, err := devicetaint.Find(ctx, r.APIReader, s.Driver, o.node.Name, uuid)
		switch {
		case errors.Is(err, devicetaint.ErrNotPublished):
			od.missing[uuid] = fmt.Sprintf("GPU %s is not published by DRA driver %s on the node", uuid, s.Driver)
			continue
		case err != nil:
			return nil, err
		}
		od.found[uuid] = dev
		fresh = fresh || !out[uuid]
	}
	rules, err := devicetaint.Owned(ctx, r.APIReader, o.node.Name)
	if err != nil {
		return nil, err
	}
	od.rules = map[string]*resourcev1.DeviceTaintRule{}
	for i := range rules {
		od.rules[rules[i].Name] = &rules[i]
	}
	if fresh {
		if od.breaker, od.budget, err = r.deviceAdmission(ctx, o); err != nil {
			return nil, err
		}
	}
	return od, nil
}

// deviceAdmission is the device breaker's and budget's answer to one more
// GPU out: both count GPUs, of the managed nodes (gpusPerNodeLabel each,
// else 8), apart from the nodes' own breaker and budget, so that a driver
// fault that makes every GPU look bad trips the device breaker alone.
func (r *Reconciler) deviceAdmission(ctx context.Context, o *observation) (*breakerView, *deviceBudget, error) {
	managed, nhs, err := r.snapshot(ctx, o.policy)
	if err != nil {
		return nil, nil, err
	}
	gpus := managedGPUs(managed)
	b := deviceBudgetOf(o, managed, nhs)
	view := &breakerView{allowed: true, message: "disabled"}
	if breaker.Enabled(o.policy.Spec.CircuitBreaker) {
		settings, err := breaker.SettingsFor(o.policy.Spec.CircuitBreaker, gpus)
		if err != nil {
			return nil, nil, err
		}
		key := deviceBreakerKey(o.policy)
		if !r.Breaker.Seeded(key) {
			r.Breaker.Seed(key, deviceOutTimes(nhs, o.now.Time, settings.Window), "", time.Time{})
		}
		allowed, st := r.Breaker.Check(key, settings, o.now.Time)
		view = &breakerView{allowed: allowed, message: st.Message, settings: settings, enabled: true}
	}
	return view, b, nil
}

// managedGPUs are the managed nodes' GPUs: gpusPerNodeLabel each (at
// most maxGPUsPerNode), else 8.
func managedGPUs(managed map[string]map[string]string) int {
	gpus := 0
	for _, lbls := range managed {
		n, err := strconv.Atoi(lbls[gpusPerNodeLabel])
		if err != nil || n <= 0 {
			n = defaultGPUsPerNode
		}
		gpus += min(n, maxGPUsPerNode)
	}
	return gpus
}

// deviceBudgetOf counts maxUnavailableDevices over nhs: the managed
// nodes' GPUs out alone, this node's as observed.
func deviceBudgetOf(o *observation, managed map[string]map[string]string, nhs []gpuhealthv1alpha1.NodeHealth) *deviceBudget {
	b := &deviceBudget{}
	for i := range nhs {
		if _, ok := managed[nhs[i].Name]; ok && nhs[i].Name != o.nh.Name {
			b.out += len(nhs[i].Status.Devices)
		}
	}
	b.out += len(o.nh.Status.Devices)
	b.limit, b.err = budget.Limit(o.policy.Spec.Budgets.MaxUnavailableDevices, managedGPUs(managed), defaultMaxUnavailableDevices)
	return b
}

// liveDeviceBudget is deviceBudgetOf counted from the apiserver (with this
// process's writes under the lock laid over), for admission.
func (r *Reconciler) liveDeviceBudget(ctx context.Context, o *observation) *deviceBudget {
	managed, _, err := r.snapshot(ctx, o.policy)
	if err != nil {
		return &deviceBudget{err: err}
	}
	nhs, recent, err := r.liveNodeHealths(ctx, o)
	if err != nil {
		return &deviceBudget{err: err}
	}
	b := deviceBudgetOf(o, managed, nhs)
	if recent && b.out >= b.limit {
		// A refusal is decided on a fresh list only (the recent list can
		// only over-count).
		r.admission.recent = nil
		if nhs, _, err = r.liveNodeHealths(ctx, o); err != nil {
			return &deviceBudget{err: err}
		}
		b = deviceBudgetOf(o, managed, nhs)
	}
	return b
}

// deviceBreakerKey is the device breaker's name in the shared Breaker.
func deviceBreakerKey(p *gpuhealthv1alpha1.RemediationPolicy) string { return p.Name + "/devices" }

// deviceOutTimes are when the GPUs out now went out, within the window:
// what a new leader's device breaker starts from.
func deviceOutTimes(nhs []gpuhealthv1alpha1.NodeHealth, now time.Time, window time.Duration) []time.Time {
	var out []time.Time
	for i := range nhs {
		for _, e := range nhs[i].Status.Devices {
			if now.Sub(e.OutSince.Time) <= window {
				out = append(out, e.OutSince.Time)
			}
		}
	}
	return out
}

// drainDevices runs one drain pass for each of the node's draining GPUs:
// the pods whose claims hold the GPU, evicted with the policy's drain
// modes, timeouts and PodDisruptionBudgets (see drain.Drainer.DrainPods).
func (r *Reconciler) drainDevices(ctx context.Context, o *observation) {
	if o.devices == nil || o.policy.Spec.DryRun || o.nh.Spec.Hold {
		return
	}
	for _, e := range o.nh.Status.Devices {
		if e.Phase != gpuhealthv1alpha1.DeviceDraining {
			continue
		}
		dev := devicetaint.Device{Driver: e.Driver, Pool: e.Pool, Name: e.Device}
		res, err := r.Drainer.DrainPods(ctx, o.node.Name, o.policy.Spec.Drain, e.Since.Time, func(ctx context.Context, pod *corev1.Pod) (bool, error) {
			return r.holds(ctx, pod, dev)
		})
		o.devices.drained[e.UUID] = &drainPass{result: res, err: err}
	}
}

// holds says whether one of the pod's ResourceClaims is allocated the
// device: those it names, those made from its templates, and the one for
// its extended resources, read from the apiserver.
func (r *Reconciler) holds(ctx context.Context, pod *corev1.Pod, dev devicetaint.Device) (bool, error) {
	var names []string
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			names = append(names, *c.ResourceClaimName)
		}
	}
	for _, c := range pod.Status.ResourceClaimStatuses {
		if c.ResourceClaimName != nil {
			names = append(names, *c.ResourceClaimName)
		}
	}
	if x := pod.Status.ExtendedResourceClaimStatus; x != nil && x.ResourceClaimName != "" {
		names = append(names, x.ResourceClaimName)
	}
	for _, name := range names {
		claim := &resourcev1.ResourceClaim{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, claim); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return false, fmt.Errorf("getting resourceclaim %s/%s of pod %s: %w", pod.Namespace, name, pod.Name, err)
		}
		if allocates(claim, dev) {
			return true, nil
		}
	}
	return false, nil
}

// allocates says whether the claim's allocation holds the device. Pure.
func allocates(claim *resourcev1.ResourceClaim, dev devicetaint.Device) bool {
	a := claim.Status.Allocation
	if a == nil {
		return false
	}
	for _, res := range a.Devices.Results {
		if res.Driver == dev.Driver && res.Pool == dev.Pool && res.Device == dev.Name {
			return true
		}
	}
	return false
}
