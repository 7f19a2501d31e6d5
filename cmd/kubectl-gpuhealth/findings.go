package main

import (
	"context"
	"sort"
	"strconv"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func newFindingsCommand(g *globals) *cobra.Command {
	var active bool
	var out *outputFlag
	cmd := &cobra.Command{
		Use:   "findings [NODE]",
		Short: "NodeHealthEvents, the latest seen first",
		Example: `  kubectl gpuhealth findings --active
  kubectl gpuhealth findings gpu-node-7 -o wide`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeNodeHealths(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.reader(out)
			if err != nil {
				return err
			}
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			items, err := listFindings(cmd.Context(), c, node, active)
			if err != nil {
				return err
			}
			if done, err := out.structured(g.streams.Out, items); done {
				return err
			}
			return printFindings(g, items, out.wide())
		},
	}
	out = addOutputFlag(cmd, "wide", "json", "yaml")
	cmd.Flags().BoolVar(&active, "active", false, "Only findings still in phase Active.")
	return cmd
}

// listFindings lists a node's findings (all nodes' for an empty name), the
// latest seen first.
func listFindings(ctx context.Context, c client.Client, node string, active bool) ([]gpuhealthv1alpha1.NodeHealthEvent, error) {
	var list gpuhealthv1alpha1.NodeHealthEventList
	var opts []client.ListOption
	if node != "" {
		opts = append(opts, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: node})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, listError("nodehealthevents", err)
	}
	items := make([]gpuhealthv1alpha1.NodeHealthEvent, 0, len(list.Items))
	for i := range list.Items {
		ev := list.Items[i]
		if active && ev.Status.Phase != gpuhealthv1alpha1.EventActive {
			continue
		}
		ev.ManagedFields = nil
		items = append(items, ev)
	}
	sort.SliceStable(items, func(i, j int) bool {
		a, b := lastSeen(&items[i]), lastSeen(&items[j])
		if !a.Equal(b) {
			return a.After(b)
		}
		return items[i].Name < items[j].Name
	})
	return items, nil
}

func printFindings(g *globals, items []gpuhealthv1alpha1.NodeHealthEvent, wide bool) error {
	now := g.now()
	if len(items) == 0 {
		_, err := g.streams.Out.Write([]byte("No findings.\n"))
		return err
	}
	headers := []string{"NODE", "CHECK", "CODE", "SEVERITY", "ACTION", "COUNT", "PHASE", "VERDICT", "LAST SEEN"}
	if wide {
		headers = append(headers, "FIRST SEEN", "COMPONENT", "SOURCE", "NAME", "MESSAGE")
	}
	t := newTable(g.streams.Out, headers...)
	for i := range items {
		ev := &items[i]
		verdict := "<not judged>"
		if c := ev.Status.Classification; c != nil {
			verdict = string(c.Verdict)
		}
		row := []string{ev.Spec.NodeName, string(ev.Spec.Check), orNone(ev.Spec.Code), string(ev.Spec.Severity),
			orNone(string(ev.Spec.RecommendedAction)), strconv.FormatInt(ev.Status.Count, 10), orNone(string(ev.Status.Phase)),
			verdict, age(now, lastSeen(ev))}
		if wide {
			row = append(row, age(now, timeOf(ev.Status.FirstSeen)), orNone(ev.Spec.Component.ID), string(ev.Spec.Source), ev.Name,
				orNone(ev.Spec.Message))
		}
		t.row(row...)
	}
	return t.flush()
}
