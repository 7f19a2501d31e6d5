package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/nodefindings"
)

// maxOutliers is how many outliers of a property the table lists without
// -o wide: a driver rollout half done has hundreds.
const maxOutliers = 3

// DriftPool is one pool's NVIDIA stack compared across its nodes, by the
// operator's rule (nodefindings.PoolDrift), from the nodes' NodeInventories.
type DriftPool struct {
	// Pool is the pool's name: the policy, then the node's values of the
	// policy's drift.poolLabelKeys (default nvidia.com/gpu.product).
	Pool   string `json:"pool"`
	Policy string `json:"policy"`
	// Findings is what the operator makes of a drift in this pool: the
	// policy's drift verdict (Observe or Quarantine), or "off" when the
	// policy does not compare stacks (drift unset or disabled); the plugin
	// compares them either way.
	Findings string `json:"findings"`
	// Nodes counts the pool's nodes; NotReporting those without a
	// NodeInventory (no monitor, or it has not reported yet) or with one
	// older than nodefindings.DefaultStaleAfter (its monitor stopped), which
	// the operator does not count either.
	Nodes        int `json:"nodes"`
	NotReporting int `json:"notReporting"`
	// Properties are the properties on which nodes differ from the
	// majority, in the order the policy compares them; empty when none do.
	Properties []DriftedProperty `json:"properties"`
}

// DriftedProperty is one property of a pool with outliers.
type DriftedProperty struct {
	Property gpuhealthv1alpha1.DriftProperty `json:"property"`
	// Majority is the value more than half of the nodes reporting the
	// property have: Agree of Reporting.
	Majority  string         `json:"majority"`
	Agree     int            `json:"agree"`
	Reporting int            `json:"reporting"`
	Outliers  []DriftOutlier `json:"outliers"`
}

// DriftOutlier is a node with a value other than its pool's majority.
type DriftOutlier struct {
	Node  string `json:"node"`
	Value string `json:"value"`
}

// listInventories lists the NodeInventories, or says why drift is not
// known: a cluster whose gpuhealth predates them, or a user whose role
// does not grant them, still gets the rest of the status.
func listInventories(ctx context.Context, c client.Client) ([]gpuhealthv1alpha1.NodeInventory, string, error) {
	var invs gpuhealthv1alpha1.NodeInventoryList
	if err := c.List(ctx, &invs); err != nil {
		switch {
		case meta.IsNoMatchError(err) || strings.Contains(err.Error(), "no matches for kind"):
			return nil, "the NodeInventory CRD is not installed (gpuhealth older than the drift check)", nil
		case apierrors.IsForbidden(err):
			return nil, "you may not list nodeinventories (the chart's gpuhealth-view role grants it)", nil
		}
		return nil, "", listError("nodeinventories", err)
	}
	return invs.Items, "", nil
}

// driftPools groups the managed nodes into the operator's pools and
// compares each pool's reports as of now.
func driftPools(policies []gpuhealthv1alpha1.RemediationPolicy, nodes []metav1.PartialObjectMetadata, reports []gpuhealthv1alpha1.NodeInventory, now time.Time) []DriftPool {
	invs := make(map[string]*gpuhealthv1alpha1.NodeInventory, len(reports))
	for i := range reports {
		// As the operator: only a recent report about the node it is named
		// after.
		if r := &reports[i]; r.Spec.NodeName == r.Name && now.Sub(r.Spec.ObservedAt.Time) <= nodefindings.DefaultStaleAfter {
			invs[r.Name] = r
		}
	}
	byPool := map[string]*DriftPool{}
	members := map[string][]nodefindings.PoolMember{}
	specs := map[string]*gpuhealthv1alpha1.DriftSpec{}
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: nodes[i].ObjectMeta}
		p := gpuhealthv1alpha1.ManagingPolicy(policies, n.Labels)
		if p == nil {
			continue
		}
		name := nodefindings.PoolOf(p, n)
		dp := byPool[name]
		if dp == nil {
			dp = &DriftPool{Pool: name, Policy: p.Name, Findings: "off", Properties: []DriftedProperty{}}
			if d := p.Spec.Drift; d != nil && ptr.Deref(d.Enabled, true) {
				dp.Findings = string(gpuhealthv1alpha1.VerdictObserve)
				if d.Verdict != "" {
					dp.Findings = string(d.Verdict)
				}
			}
			byPool[name], specs[name] = dp, p.Spec.Drift
		}
		dp.Nodes++
		inv := invs[n.Name]
		if inv == nil {
			dp.NotReporting++
			continue
		}
		members[name] = append(members[name], nodefindings.PoolMember{Node: n.Name, Properties: nodefindings.Properties(&inv.Spec)})
	}
	out := make([]DriftPool, 0, len(byPool))
	for name, dp := range byPool {
		ms := members[name]
		sort.Slice(ms, func(i, j int) bool { return ms[i].Node < ms[j].Node })
		for _, d := range nodefindings.PoolDrift(name, ms, specs[name]) {
			last := len(dp.Properties) - 1
			if last < 0 || dp.Properties[last].Property != d.Property {
				dp.Properties = append(dp.Properties, DriftedProperty{Property: d.Property, Majority: d.Majority, Agree: d.Agree, Reporting: d.Reporting})
				last++
			}
			dp.Properties[last].Outliers = append(dp.Properties[last].Outliers, DriftOutlier{Node: d.Node, Value: d.Value})
		}
		out = append(out, *dp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out
}

// printDrift writes the drift table: a row per pool and drifted property,
// one row saying "no drift" for a pool without any.
func printDrift(w io.Writer, st *FleetStatus, wide bool) error {
	if st.DriftUnknown != "" {
		fmt.Fprintf(w, "Drift unknown: %s.\n", st.DriftUnknown)
		return nil
	}
	if len(st.Drift) == 0 {
		fmt.Fprintln(w, "No managed node: no pool to compare for drift.")
		return nil
	}
	headers := []string{"DRIFT POOL", "NODES", "NOT REPORTING", "PROPERTY", "MAJORITY", "OUTLIERS"}
	if wide {
		headers = append(headers, "FINDINGS")
	}
	t := newTable(w, headers...)
	var off []string
	for _, p := range st.Drift {
		if p.Findings == "off" && len(p.Properties) > 0 && !slices.Contains(off, p.Policy) {
			off = append(off, p.Policy)
		}
		row := func(cells ...string) {
			r := append([]string{p.Pool, strconv.Itoa(p.Nodes), strconv.Itoa(p.NotReporting)}, cells...)
			if wide {
				r = append(r, p.Findings)
			}
			t.row(r...)
		}
		if len(p.Properties) == 0 {
			row("<none>", "no drift", "<none>")
			continue
		}
		for _, d := range p.Properties {
			row(string(d.Property), fmt.Sprintf("%s on %d of %d", d.Majority, d.Agree, d.Reporting), outliers(d.Outliers, wide))
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, p := range off {
		fmt.Fprintf(w, "Policy %s does not compare stacks (spec.drift): the operator opens no Drift finding and exports no gpuhealth_node_drift for its nodes.\n", p)
	}
	return nil
}

// outliers lists nodes with their values, the first maxOutliers unless
// wide.
func outliers(list []DriftOutlier, wide bool) string {
	var parts []string
	for i, o := range list {
		if !wide && i == maxOutliers {
			parts = append(parts, fmt.Sprintf("and %d more (-o wide lists them)", len(list)-maxOutliers))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", o.Node, o.Value))
	}
	return strings.Join(parts, ", ")
}
