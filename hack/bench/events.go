package main

import (
	"context"
	"fmt"
	"time"

	eventsv1 "k8s.io/api/events/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// transitionEvents counts, over nodes, the Healthy → Quarantined transitions
// the NodeHealth histories hold and the Fault Events the apiserver holds
// for them (an Event repeated within minutes is one object with a series
// count, which is summed). Each transition must be published once: the
// ratio is 1.00. Events are sent asynchronously, so it waits until their
// number has not moved for two seconds.
func (h *harness) transitionEvents(ctx context.Context, nodes []string) (transitions, events int, err error) {
	want := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		want[n] = true
	}
	nhs := &gpuhealthv1alpha1.NodeHealthList{}
	if err := h.crc.List(ctx, nhs); err != nil {
		return 0, 0, fmt.Errorf("listing nodehealths: %w", err)
	}
	for i := range nhs.Items {
		if !want[nhs.Items[i].Name] {
			continue
		}
		for _, t := range nhs.Items[i].Status.History {
			if t.From == gpuhealthv1alpha1.PhaseHealthy && t.To == gpuhealthv1alpha1.PhaseQuarantined && t.Reason == gpuhealthv1alpha1.ReasonFault {
				transitions++
			}
		}
	}
	last, stable := -1, time.Now()
	for {
		list := &eventsv1.EventList{}
		if err := h.crc.List(ctx, list); err != nil {
			return 0, 0, fmt.Errorf("listing events: %w", err)
		}
		events = 0
		for i := range list.Items {
			e := &list.Items[i]
			if e.Reason != gpuhealthv1alpha1.ReasonFault || e.Regarding.Kind != "Node" || !want[e.Regarding.Name] {
				continue
			}
			if e.Series != nil && e.Series.Count > 1 {
				events += int(e.Series.Count)
			} else {
				events++
			}
		}
		if events != last {
			last, stable = events, time.Now()
		}
		if time.Since(stable) >= 2*time.Second {
			return transitions, events, nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
