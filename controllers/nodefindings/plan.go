package nodefindings

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// maxMessage is a finding's message's MaxLength.
const maxMessage = 1024

// Labels and resources read from Nodes.
const (
	// ProductLabel is GPU Feature Discovery's product label, the default
	// pool key and the key of the policy's expected counts.
	ProductLabel = "nvidia.com/gpu.product"
	// CountLabel is GPU Feature Discovery's GPU count label.
	CountLabel = "nvidia.com/gpu.count"
	// GPUResource is the device plugin's extended resource.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// ownCondition is gpuhealth's own Node condition: its output, never
	// an input, whatever a policy says.
	ownCondition = "GPUHealthy"
)

// GPUMissing codes the operator writes.
const (
	CodeExpected      = "Expected"
	CodeAllocatable   = "Allocatable"
	CodeResourceSlice = "ResourceSlice"
)

// nodeInput is what the pass read about one node.
type nodeInput struct {
	node *corev1.Node
	// policy manages the node; nil when none does (then nothing is
	// derived: the node is not gpuhealth's).
	policy *gpuhealthv1alpha1.RemediationPolicy
	// inventory is its monitor's report, nil when there is none.
	inventory *gpuhealthv1alpha1.NodeInventory
	// sliceGPUs is how many full GPUs the DRA driver's current slices of
	// the node publish, nil when it publishes none (or slices were not
	// read).
	sliceGPUs *int
}

// finding is one finding the operator wants open.
type finding struct {
	spec gpuhealthv1alpha1.NodeHealthEventSpec
}

// Drift is one node's property that differs from its pool's majority.
type Drift struct {
	Node, Pool string
	Property   gpuhealthv1alpha1.DriftProperty
	Value      string
	Majority   string
	// Agree and Reporting count the pool's nodes with the majority's value
	// and with any value.
	Agree, Reporting int
}

// wanted is the pure part of a pass: the findings that should be open now
// (by event name) and the drift table.
type wanted struct {
	open   map[string]finding
	drifts []Drift
	// stack is each node's property values, for the info metric.
	stack map[string]map[gpuhealthv1alpha1.DriftProperty]string
	// pools names each node's pool.
	pools map[string]string
}

// plan computes what should be open from what was read. Pure.
func plan(nodes []nodeInput) wanted {
	w := wanted{open: map[string]finding{}, stack: map[string]map[gpuhealthv1alpha1.DriftProperty]string{}, pools: map[string]string{}}
	add := func(f finding) { w.open[f.spec.EventName()] = f }
	pools := map[string][]PoolMember{}
	poolSpec := map[string]*gpuhealthv1alpha1.DriftSpec{}
	for _, in := range nodes {
		if in.policy == nil {
			continue
		}
		spec := &in.policy.Spec
		for _, f := range conditionFindings(in.node, spec.Conditions) {
			add(f)
		}
		for _, f := range countFindings(in, spec.GPUCount) {
			add(f)
		}
		if in.inventory == nil {
			continue
		}
		props := Properties(&in.inventory.Spec)
		w.stack[in.node.Name] = props
		pool := PoolOf(in.policy, in.node)
		w.pools[in.node.Name] = pool
		if d := spec.Drift; d != nil && ptr.Deref(d.Enabled, true) {
			pools[pool] = append(pools[pool], PoolMember{Node: in.node.Name, Properties: props})
			poolSpec[pool] = d
		}
	}
	names := make([]string, 0, len(pools))
	for p := range pools {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, pool := range names {
		d := poolSpec[pool]
		for _, dr := range PoolDrift(pool, pools[pool], d) {
			w.drifts = append(w.drifts, dr)
			add(driftFinding(dr, d.Verdict))
		}
	}
	return w
}

// PoolMember is one node of a pool and its stack's drift properties
// (Properties of its NodeInventory).
type PoolMember struct {
	Node       string
	Properties map[gpuhealthv1alpha1.DriftProperty]string
}

// PoolDrift compares the members of one pool as spec says (nil: the
// defaults; its enabled and verdict are not read): per property (spec's,
// default all), the value more than half of the members reporting it have
// is the majority, and every member with another value drifts. A property
// fewer than minPoolSize members report (default 3), or without such a
// majority, has no drift. The drifts come by property, then in members'
// order. Pure.
func PoolDrift(pool string, members []PoolMember, spec *gpuhealthv1alpha1.DriftSpec) []Drift {
	var props []gpuhealthv1alpha1.DriftProperty
	minSize := 0
	if spec != nil {
		props, minSize = spec.Properties, int(spec.MinPoolSize)
	}
	if len(props) == 0 {
		props = gpuhealthv1alpha1.DriftProperties
	}
	if minSize == 0 {
		minSize = 3
	}
	var out []Drift
	for _, prop := range props {
		counts := map[string]int{}
		reporting := 0
		for _, m := range members {
			if v, ok := m.Properties[prop]; ok {
				counts[v]++
				reporting++
			}
		}
		majority, agree := majorityOf(counts)
		if reporting < minSize || agree*2 <= reporting {
			continue
		}
		for _, m := range members {
			v, ok := m.Properties[prop]
			if !ok || v == majority {
				continue
			}
			out = append(out, Drift{Node: m.Node, Pool: pool, Property: prop, Value: v, Majority: majority, Agree: agree, Reporting: reporting})
		}
	}
	return out
}

// majorityOf returns the most common value and its count; ties go to the
// lesser value so that the answer does not depend on map order (a tie is
// never a majority anyway).
func majorityOf(counts map[string]int) (string, int) {
	best, n := "", 0
	for v, c := range counts {
		if c > n || (c == n && v < best) {
			best, n = v, c
		}
	}
	return best, n
}

// PoolOf names the node's pool: the policy, and the node's values of the
// pool label keys.
func PoolOf(p *gpuhealthv1alpha1.RemediationPolicy, n *corev1.Node) string {
	keys := []string{ProductLabel}
	if d := p.Spec.Drift; d != nil && len(d.PoolLabelKeys) > 0 {
		keys = d.PoolLabelKeys
	}
	parts := []string{p.Name}
	for _, k := range keys {
		parts = append(parts, n.Labels[k])
	}
	return strings.Join(parts, "/")
}

// Properties are a report's drift properties: one value each, a GPU's
// property being the node's distinct values joined with ", ". A property
// the report does not have (NVML unavailable, Fabric Manager not
// installed) is absent: a node that cannot say does not drift.
func Properties(s *gpuhealthv1alpha1.NodeInventorySpec) map[gpuhealthv1alpha1.DriftProperty]string {
	out := map[gpuhealthv1alpha1.DriftProperty]string{}
	set := func(p gpuhealthv1alpha1.DriftProperty, v string) {
		if v != "" {
			out[p] = v
		}
	}
	set(gpuhealthv1alpha1.DriftDriver, s.Driver.Version)
	set(gpuhealthv1alpha1.DriftCUDADriver, s.Driver.CUDAVersion)
	perGPU := func(p gpuhealthv1alpha1.DriftProperty, get func(*gpuhealthv1alpha1.GPUInventory) string) {
		set(p, distinct(s.GPUs, get))
	}
	perGPU(gpuhealthv1alpha1.DriftVBIOS, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.VBIOS })
	perGPU(gpuhealthv1alpha1.DriftInfoROM, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.InfoROM })
	perGPU(gpuhealthv1alpha1.DriftECC, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.ECC })
	perGPU(gpuhealthv1alpha1.DriftPersistence, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.Persistence })
	perGPU(gpuhealthv1alpha1.DriftMIG, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.MIG })
	perGPU(gpuhealthv1alpha1.DriftProduct, func(g *gpuhealthv1alpha1.GPUInventory) string { return g.Product })
	perGPU(gpuhealthv1alpha1.DriftPowerLimit, func(g *gpuhealthv1alpha1.GPUInventory) string {
		if g.PowerLimitWatts == 0 {
			return ""
		}
		return strconv.Itoa(int(g.PowerLimitWatts)) + " W"
	})
	// Only the compute fabric's ports: a management NIC may differ.
	perNIC := func(p gpuhealthv1alpha1.DriftProperty, get func(*gpuhealthv1alpha1.NICInventory) string) {
		set(p, distinct(s.NICs, func(n *gpuhealthv1alpha1.NICInventory) string {
			if !n.Compute {
				return ""
			}
			return get(n)
		}))
	}
	perNIC(gpuhealthv1alpha1.DriftNICFirmware, func(n *gpuhealthv1alpha1.NICInventory) string { return n.Firmware })
	perNIC(gpuhealthv1alpha1.DriftNICRate, func(n *gpuhealthv1alpha1.NICInventory) string { return n.Rate })
	for _, sv := range s.Services {
		switch sv.Name {
		case "nvidia-fabricmanager":
			set(gpuhealthv1alpha1.DriftFabricManager, sv.Version)
		case "nvidia-imex":
			set(gpuhealthv1alpha1.DriftIMEX, sv.Version)
		}
	}
	return out
}

// distinct is the distinct non-empty values get gives of items, sorted and
// joined: one value per node for a property of each GPU or port.
func distinct[T any](items []T, get func(*T) string) string {
	seen := map[string]bool{}
	var vals []string
	for i := range items {
		if v := get(&items[i]); v != "" && !seen[v] {
			seen[v] = true
			vals = append(vals, v)
		}
	}
	sort.Strings(vals)
	return strings.Join(vals, ", ")
}

// severityFor is the severity that makes the built-in judgement give the
// verdict: Fatal quarantines, Degraded is observed.
func severityFor(v gpuhealthv1alpha1.Verdict) gpuhealthv1alpha1.Severity {
	if v == gpuhealthv1alpha1.VerdictQuarantine {
		return gpuhealthv1alpha1.SeverityFatal
	}
	return gpuhealthv1alpha1.SeverityDegraded
}

func nodeSpec(node string, source gpuhealthv1alpha1.Source, check gpuhealthv1alpha1.Check, code string) gpuhealthv1alpha1.NodeHealthEventSpec {
	return gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: source, Check: check, Code: code,
		Component:         gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode},
		RecommendedAction: gpuhealthv1alpha1.ActionNone,
	}
}

// conditionFindings are the node's conditions the policy lists that hold.
func conditionFindings(n *corev1.Node, rules []gpuhealthv1alpha1.NodeConditionRule) []finding {
	var out []finding
	for _, r := range rules {
		if r.Type == ownCondition {
			continue
		}
		want := r.Status
		if want == "" {
			want = corev1.ConditionTrue
		}
		for _, c := range n.Status.Conditions {
			if string(c.Type) != r.Type || c.Status != want {
				continue
			}
			s := nodeSpec(n.Name, gpuhealthv1alpha1.SourceNodeCondition, gpuhealthv1alpha1.CheckNodeCondition, r.Type)
			s.Severity = severityFor(r.Verdict)
			if r.Action != "" {
				s.RecommendedAction = r.Action
			}
			s.Message = gpuhealthv1alpha1.Truncate(fmt.Sprintf("Node condition %s is %s: %s: %s", c.Type, c.Status, c.Reason, c.Message), maxMessage)
			out = append(out, finding{spec: s})
		}
	}
	return out
}

// expectedGPUs is how many GPUs the node should have, from where, and
// whether the policy said it: the policy's count for its product, else its
// monitor's PCI bus, else its nvidia.com/gpu.count label; 0 when nothing
// says.
func expectedGPUs(in nodeInput, gc *gpuhealthv1alpha1.GPUCountSpec) (n int, from string, policy bool) {
	product := in.node.Labels[ProductLabel]
	for _, e := range gc.Expected {
		if e.Product == product {
			return int(e.Count), "the policy's count for " + product, true
		}
	}
	if in.inventory != nil && in.inventory.Spec.PCI.GPUs > 0 {
		return int(in.inventory.Spec.PCI.GPUs), "the PCI bus", false
	}
	if v, err := strconv.Atoi(in.node.Labels[CountLabel]); err == nil && v > 0 {
		return v, "the " + CountLabel + " label", false
	}
	return 0, "", false
}

// migOn says whether the report has a GPU in MIG mode.
func migOn(inv *gpuhealthv1alpha1.NodeInventory) bool {
	if inv == nil {
		return false
	}
	for _, g := range inv.Spec.GPUs {
		if g.MIG == "Enabled" {
			return true
		}
	}
	return false
}

// countFindings compare the node's GPUs, as NVML and the scheduler see
// them, with the expected count. Only with gpuCount set in the policy.
func countFindings(in nodeInput, gc *gpuhealthv1alpha1.GPUCountSpec) []finding {
	if gc == nil {
		return nil
	}
	want, from, fromPolicy := expectedGPUs(in, gc)
	if want == 0 {
		return nil
	}
	var out []finding
	// NVML's count against the policy's: the monitor compares it with the
	// PCI bus itself (code PCI); a GPU gone from the bus too shows here.
	if inv := in.inventory; inv != nil && inv.Spec.GPUCount != nil && fromPolicy {
		if have := int(*inv.Spec.GPUCount); have < want {
			s := nodeSpec(in.node.Name, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckGPUMissing, CodeExpected)
			s.Severity, s.RecommendedAction = gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode
			s.Message = fmt.Sprintf("NVML lists %d GPUs, %s is %d (the PCI bus has %d)", have, from, want, inv.Spec.PCI.GPUs)
			out = append(out, finding{spec: s})
		}
	}
	verdict := gc.SchedulerVerdict
	// Allocatable counts whole GPUs only without MIG (with it, the device
	// plugin offers slices under other names or none at all).
	if q, ok := in.node.Status.Capacity[GPUResource]; ok && !q.IsZero() && !migOn(in.inventory) {
		alloc := in.node.Status.Allocatable[GPUResource]
		if have := int(alloc.Value()); have < want {
			s := nodeSpec(in.node.Name, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckGPUMissing, CodeAllocatable)
			s.Severity = severityFor(verdict)
			s.Message = fmt.Sprintf("the scheduler is offered %d %s (allocatable), %s is %d", have, GPUResource, from, want)
			out = append(out, finding{spec: s})
		}
	}
	if in.sliceGPUs != nil {
		if have := *in.sliceGPUs; have < want {
			s := nodeSpec(in.node.Name, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckGPUMissing, CodeResourceSlice)
			s.Severity = severityFor(verdict)
			s.Message = fmt.Sprintf("the DRA driver's ResourceSlices publish %d GPUs, %s is %d", have, from, want)
			out = append(out, finding{spec: s})
		}
	}
	return out
}

// driftFinding is the finding for one drifted property.
func driftFinding(d Drift, verdict gpuhealthv1alpha1.Verdict) finding {
	s := nodeSpec(d.Node, gpuhealthv1alpha1.SourceOperator, gpuhealthv1alpha1.CheckDrift, string(d.Property))
	s.Severity = severityFor(verdict)
	s.Message = gpuhealthv1alpha1.Truncate(fmt.Sprintf("%s is %q; %d of the %d nodes of pool %s reporting it have %q", d.Property, d.Value, d.Agree, d.Reporting, d.Pool, d.Majority), maxMessage)
	return finding{spec: s}
}

// change is one write the pass makes.
type change struct {
	// create is a finding to create (spec) with its first status.
	create *gpuhealthv1alpha1.NodeHealthEvent
	// patch is an existing finding's status change.
	patch *gpuhealthv1alpha1.NodeHealthEvent
	// status is what the patch sets.
	status gpuhealthv1alpha1.NodeHealthEventStatus
	// opened and resolved say what it does, for logs and metrics.
	opened, resolved bool
}

// ours says whether the operator derives findings of this source.
func ours(s gpuhealthv1alpha1.Source) bool {
	return s == gpuhealthv1alpha1.SourceNodeCondition || s == gpuhealthv1alpha1.SourceOperator
}

// diff turns what should be open and what exists into writes. Pure.
// existing are the NodeHealthEvents of the operator's sources; one that
// is open and no longer wanted (its condition stopped, or no policy manages
// its node now) is resolved.
func diff(w wanted, existing []gpuhealthv1alpha1.NodeHealthEvent, now metav1.Time) []change {
	have := map[string]*gpuhealthv1alpha1.NodeHealthEvent{}
	var out []change
	for i := range existing {
		ev := &existing[i]
		if !ours(ev.Spec.Source) {
			continue
		}
		have[ev.Name] = ev
		if _, open := w.open[ev.Name]; !open && !ev.Status.Resolved && !isSuperseded(ev) {
			st := ev.Status
			st.Resolved, st.ResolvedAt = true, &now
			out = append(out, change{patch: ev, status: st, resolved: true})
		}
	}
	names := make([]string, 0, len(w.open))
	for n := range w.open {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		f := w.open[name]
		ev, ok := have[name]
		if !ok {
			obj := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: f.spec}
			out = append(out, change{create: obj, status: gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, FirstSeen: &now, LastSeen: &now}, opened: true})
			continue
		}
		switch {
		case ev.Status.Resolved || isSuperseded(ev):
			// It holds again: one more occurrence, after the closure.
			st := ev.Status
			st.Resolved, st.ResolvedAt, st.Count, st.LastSeen = false, nil, st.Count+1, &now
			out = append(out, change{patch: ev, status: st, opened: true})
		case ev.Status.Count == 0:
			// Created, but its first status write was lost (the operator
			// stopped between the two): write it now.
			st := ev.Status
			st.Count, st.FirstSeen, st.LastSeen = 1, &now, &now
			out = append(out, change{patch: ev, status: st, opened: true})
		}
	}
	return out
}

// isSuperseded says whether a recertification or a human closed the
// finding after it was last seen.
func isSuperseded(ev *gpuhealthv1alpha1.NodeHealthEvent) bool {
	st := &ev.Status
	return st.SupersededAt != nil && (st.LastSeen == nil || !st.LastSeen.After(st.SupersededAt.Time))
}

// sliceGPUCount counts the full GPUs (attribute type "gpu") in the
// slices.
func sliceGPUCount(slices []*resourcev1.ResourceSliceSpec) int {
	n := 0
	for _, s := range slices {
		for _, d := range s.Devices {
			for _, key := range []resourcev1.QualifiedName{"type", resourcev1.QualifiedName(s.Driver + "/type")} {
				if a, ok := d.Attributes[key]; ok && a.StringValue != nil && *a.StringValue == "gpu" {
					n++
					break
				}
			}
		}
	}
	return n
}
