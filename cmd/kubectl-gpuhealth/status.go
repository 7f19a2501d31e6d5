package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
)

// phases is every NodeHealth phase in the order the tables show them.
var phases = []gpuhealthv1alpha1.NodeHealthPhase{
	gpuhealthv1alpha1.PhaseHealthy, gpuhealthv1alpha1.PhaseCertifying, gpuhealthv1alpha1.PhaseQuarantined,
	gpuhealthv1alpha1.PhaseDraining, gpuhealthv1alpha1.PhaseRecertifying, gpuhealthv1alpha1.PhaseMaintenance,
	gpuhealthv1alpha1.PhaseFailed,
}

// FleetStatus is what `status` shows, and its -o json|yaml form.
type FleetStatus struct {
	// Policies are the RemediationPolicies by name, as the operator last counted them.
	Policies []PolicySummary `json:"policies"`
	// Unmanaged counts NodeHealths of nodes no policy selects.
	Unmanaged int `json:"unmanaged"`
	// DegradedCliques are the NVLink cliques with an open fabric fault.
	DegradedCliques []DegradedClique `json:"degradedCliques"`
	// Failed are the Failed nodes, the oldest first (at most --failed).
	Failed []FailedNode `json:"failed"`
	// FailedTotal counts every Failed node.
	FailedTotal int `json:"failedTotal"`
	// Devices are the GPUs out of service alone (rules of scope Device),
	// by node and device.
	Devices []OutDevice `json:"devices"`
	// Drift is each pool of managed nodes, by name, with the properties of
	// its NVIDIA stack on which nodes differ from the pool's majority.
	Drift []DriftPool `json:"drift"`
	// DriftUnknown says why Drift is empty although nodes are managed:
	// NodeInventories could not be read.
	DriftUnknown string `json:"driftUnknown,omitempty"`
}

// OutDevice is one GPU out of service alone on a node in service.
type OutDevice struct {
	Node   string                        `json:"node"`
	Device string                        `json:"device"`
	UUID   string                        `json:"uuid"`
	Phase  gpuhealthv1alpha1.DevicePhase `json:"phase"`
	Since  metav1.Time                   `json:"since"`
	Class  string                        `json:"class,omitempty"`
}

// PolicySummary is one policy's nodes, budget and breaker.
type PolicySummary struct {
	Name       string                                      `json:"name"`
	DryRun     bool                                        `json:"dryRun"`
	Managed    int32                                       `json:"managed"`
	Phases     map[gpuhealthv1alpha1.NodeHealthPhase]int32 `json:"phases"`
	Budget     *gpuhealthv1alpha1.BudgetStatus             `json:"budget,omitempty"`
	Breaker    *gpuhealthv1alpha1.CircuitBreakerStatus     `json:"circuitBreaker,omitempty"`
	NotCounted bool                                        `json:"notCounted,omitempty"`
}

// DegradedClique is an NVLink clique with open fabric faults.
type DegradedClique struct {
	Clique string `json:"clique"`
	// Nodes counts the clique's nodes.
	Nodes int `json:"nodes"`
	// FaultyNodes are the nodes whose findings make the clique degraded.
	FaultyNodes []string `json:"faultyNodes"`
	// Faults are those findings' checks and codes ("IMEXDomain DOWN").
	Faults []string `json:"faults"`
}

// FailedNode is a node that needs a human.
type FailedNode struct {
	Name    string       `json:"name"`
	Since   *metav1.Time `json:"since,omitempty"`
	Reason  string       `json:"reason"`
	Message string       `json:"message,omitempty"`
}

func newStatusCommand(g *globals) *cobra.Command {
	var failed int
	var out *outputFlag
	cmd := &cobra.Command{
		Use:   "status",
		Short: "The fleet at a glance: phases and budgets per policy, breakers, degraded cliques, stack drift, Failed nodes",
		Example: `  kubectl gpuhealth status
  kubectl gpuhealth status -o wide --failed 20
  kubectl gpuhealth status -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.reader(out)
			if err != nil {
				return err
			}
			st, err := fleetStatus(cmd.Context(), c, failed, g.now())
			if err != nil {
				return err
			}
			if done, err := out.structured(g.streams.Out, st); done {
				return err
			}
			return printStatus(g, st, out.wide())
		},
	}
	out = addOutputFlag(cmd, "wide", "json", "yaml")
	cmd.Flags().IntVar(&failed, "failed", 5, "How many of the oldest Failed nodes to list.")
	return cmd
}

// fleetStatus reads the policies, NodeHealths, open fabric findings, the
// nodes' labels (metadata only) and their NodeInventories, and sums them
// up as of now.
func fleetStatus(ctx context.Context, c client.Client, maxFailed int, now time.Time) (*FleetStatus, error) {
	var policies gpuhealthv1alpha1.RemediationPolicyList
	if err := c.List(ctx, &policies); err != nil {
		return nil, listError("remediationpolicies", err)
	}
	var nhs gpuhealthv1alpha1.NodeHealthList
	if err := c.List(ctx, &nhs); err != nil {
		return nil, listError("nodehealths", err)
	}
	var events gpuhealthv1alpha1.NodeHealthEventList
	if err := c.List(ctx, &events); err != nil {
		return nil, listError("nodehealthevents", err)
	}
	nodes := &metav1.PartialObjectMetadataList{}
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := c.List(ctx, nodes); err != nil {
		return nil, listError("nodes", err)
	}
	labels := make(map[string]map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		labels[nodes.Items[i].Name] = nodes.Items[i].Labels
	}
	invs, driftUnknown, err := listInventories(ctx, c)
	if err != nil {
		return nil, err
	}

	st := &FleetStatus{Policies: []PolicySummary{}, DegradedCliques: []DegradedClique{}, Failed: []FailedNode{}, Devices: []OutDevice{}, Drift: []DriftPool{}}
	if st.DriftUnknown = driftUnknown; driftUnknown == "" {
		st.Drift = driftPools(policies.Items, nodes.Items, invs, now)
	}
	sort.Slice(policies.Items, func(i, j int) bool { return policies.Items[i].Name < policies.Items[j].Name })
	for i := range policies.Items {
		p := &policies.Items[i]
		st.Policies = append(st.Policies, PolicySummary{
			Name: p.Name, DryRun: p.Spec.DryRun, Managed: p.Status.ManagedNodes, Phases: p.Status.Phases,
			Budget: p.Status.Budget, Breaker: p.Status.CircuitBreaker,
			NotCounted: p.Status.ObservedGeneration == 0,
		})
	}
	for i := range nhs.Items {
		nh := &nhs.Items[i]
		if l, ok := labels[nh.Name]; !ok || gpuhealthv1alpha1.ManagingPolicy(policies.Items, l) == nil {
			st.Unmanaged++
		}
		for _, d := range nh.Status.Devices {
			st.Devices = append(st.Devices, OutDevice{Node: nh.Name, Device: d.Device, UUID: d.UUID, Phase: d.Phase, Since: d.OutSince, Class: d.Class})
		}
		if nh.Status.Phase == gpuhealthv1alpha1.PhaseFailed {
			st.Failed = append(st.Failed, FailedNode{Name: nh.Name, Since: nh.Status.Since, Reason: nh.Status.Reason, Message: nh.Status.Message})
		}
	}
	sort.Slice(st.Devices, func(i, j int) bool {
		a, b := st.Devices[i], st.Devices[j]
		return a.Node < b.Node || a.Node == b.Node && a.Device < b.Device
	})
	st.FailedTotal = len(st.Failed)
	sort.SliceStable(st.Failed, func(i, j int) bool {
		a, b := st.Failed[i], st.Failed[j]
		if !timeOf(a.Since).Equal(timeOf(b.Since)) {
			return timeOf(a.Since).Before(timeOf(b.Since))
		}
		return a.Name < b.Name
	})
	if maxFailed >= 0 && len(st.Failed) > maxFailed {
		st.Failed = st.Failed[:maxFailed]
	}

	st.DegradedCliques = degradedCliques(events.Items, labels)
	return st, nil
}

// degradedCliques groups the open fabric faults (as the operator's fabric
// controller judges them) by the NVLink clique of their node.
func degradedCliques(events []gpuhealthv1alpha1.NodeHealthEvent, labels map[string]map[string]string) []DegradedClique {
	size := map[string]int{}
	for _, l := range labels {
		if q := l[computedomain.CliqueNodeLabel]; q != "" {
			size[q]++
		}
	}
	byClique := map[string]*DegradedClique{}
	for i := range events {
		ev := &events[i]
		if !computedomain.IsFabricFault(ev) {
			continue
		}
		q := labels[ev.Spec.NodeName][computedomain.CliqueNodeLabel]
		if q == "" {
			continue
		}
		d := byClique[q]
		if d == nil {
			d = &DegradedClique{Clique: q, Nodes: size[q], FaultyNodes: []string{}, Faults: []string{}}
			byClique[q] = d
		}
		if !slices.Contains(d.FaultyNodes, ev.Spec.NodeName) {
			d.FaultyNodes = append(d.FaultyNodes, ev.Spec.NodeName)
		}
		if f := strings.TrimSpace(string(ev.Spec.Check) + " " + ev.Spec.Code); !slices.Contains(d.Faults, f) {
			d.Faults = append(d.Faults, f)
		}
	}
	out := make([]DegradedClique, 0, len(byClique))
	for _, d := range byClique {
		sort.Strings(d.FaultyNodes)
		sort.Strings(d.Faults)
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Clique < out[j].Clique })
	return out
}

// phaseColumn is a column of node counts: the nodes in any of phases.
type phaseColumn struct {
	header string
	phases []gpuhealthv1alpha1.NodeHealthPhase
}

// phaseColumns are one column per phase when wide; otherwise Healthy,
// the phases between (OUT OF SERVICE) and Failed.
func phaseColumns(wide bool) []phaseColumn {
	var out []phaseColumn
	if wide {
		for _, p := range phases {
			out = append(out, phaseColumn{strings.ToUpper(string(p)), []gpuhealthv1alpha1.NodeHealthPhase{p}})
		}
		return out
	}
	between := phaseColumn{header: "OUT OF SERVICE"}
	for _, p := range phases {
		if p != gpuhealthv1alpha1.PhaseHealthy && p != gpuhealthv1alpha1.PhaseFailed {
			between.phases = append(between.phases, p)
		}
	}
	return []phaseColumn{
		{"HEALTHY", []gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseHealthy}},
		between,
		{"FAILED", []gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseFailed}},
	}
}

func printStatus(g *globals, st *FleetStatus, wide bool) error {
	now := g.now()
	w := g.streams.Out
	if len(st.Policies) == 0 {
		fmt.Fprintln(w, "No RemediationPolicy: gpuhealth manages no node. Install one (the chart's default policy, or kubectl apply a RemediationPolicy).")
	} else {
		columns := phaseColumns(wide)
		headers := []string{"POLICY", "MANAGED"}
		for _, c := range columns {
			headers = append(headers, c.header)
		}
		headers = append(headers, "BUDGET", "WAITING", "BREAKER")
		if wide {
			headers = append(headers, "DRY-RUN", "BREAKER MESSAGE")
		}
		t := newTable(w, headers...)
		for _, p := range st.Policies {
			row := []string{p.Name, strconv.Itoa(int(p.Managed))}
			if p.NotCounted {
				row[1] = "<not counted>"
			}
			for _, c := range columns {
				n := int32(0)
				for _, ph := range c.phases {
					n += p.Phases[ph]
				}
				row = append(row, strconv.Itoa(int(n)))
			}
			budget, waiting := "<none>", "0"
			if p.Budget != nil {
				budget = fmt.Sprintf("%d/%d", p.Budget.Unavailable, p.Budget.Limit)
				waiting = strconv.Itoa(int(p.Budget.Waiting))
			}
			breaker, msg := "Disabled", ""
			if p.Breaker != nil && p.Breaker.State != "" {
				breaker = string(p.Breaker.State)
				if p.Breaker.Since != nil {
					breaker += " " + age(now, p.Breaker.Since.Time)
				}
				msg = p.Breaker.Message
			}
			row = append(row, budget, waiting, breaker)
			if wide {
				row = append(row, strconv.FormatBool(p.DryRun), orNone(msg))
			}
			t.row(row...)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if st.Unmanaged > 0 {
		fmt.Fprintf(w, "\n%d NodeHealth(s) belong to nodes no policy selects.\n", st.Unmanaged)
	}

	fmt.Fprintln(w)
	if len(st.DegradedCliques) == 0 {
		fmt.Fprintln(w, "No degraded NVLink clique.")
	} else {
		t := newTable(w, "DEGRADED CLIQUE", "NODES", "FAULTY NODES", "FAULTS")
		for _, d := range st.DegradedCliques {
			t.row(d.Clique, strconv.Itoa(d.Nodes), strings.Join(d.FaultyNodes, ","), strings.Join(d.Faults, ", "))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	if len(st.Devices) > 0 {
		fmt.Fprintln(w)
		t := newTable(w, "NODE", "GPU OUT ALONE", "PHASE", "OUT FOR", "CLASS")
		for _, d := range st.Devices {
			t.row(d.Node, d.Device, string(d.Phase), age(now, d.Since.Time), orNone(d.Class))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	if len(st.Policies) > 0 {
		fmt.Fprintln(w)
		if err := printDrift(w, st, wide); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	if st.FailedTotal == 0 {
		fmt.Fprintln(w, "No Failed node.")
		return nil
	}
	headers := []string{"FAILED NODE", "SINCE", "REASON"}
	if wide {
		headers = append(headers, "MESSAGE")
	}
	t := newTable(w, headers...)
	for _, f := range st.Failed {
		row := []string{f.Name, age(now, timeOf(f.Since)), f.Reason}
		if wide {
			row = append(row, orNone(f.Message))
		}
		t.row(row...)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if st.FailedTotal > len(st.Failed) {
		fmt.Fprintf(w, "… and %d more Failed nodes (--failed to list more).\n", st.FailedTotal-len(st.Failed))
	}
	return nil
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

// listError names what could not be listed and the usual fix.
func listError(what string, err error) error {
	if strings.Contains(err.Error(), "no matches for kind") {
		return fmt.Errorf("listing %s: gpuhealth's CRDs are not installed in this cluster (helm install gpuhealth, or kubectl apply -f config/crd): %w", what, err)
	}
	return fmt.Errorf("listing %s: %w", what, err)
}
