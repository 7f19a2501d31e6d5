package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// rawCordon cordons every node with unthrottled client-go merge patches and
// returns the time from the first patch until every patch has returned and
// the node watch has seen every node cordoned (the same end point as the
// operator's measurement).
func (h *harness) rawCordon(ctx context.Context, nodes []string, res *results) (time.Duration, error) {
	if err := h.nodes.arm(nodes); err != nil {
		return 0, err
	}
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	cpu := takeCPU()
	start := time.Now()
	err := parallel(ctx, len(nodes), h.o.workers, func(ctx context.Context, i int) error {
		_, err := h.cs.CoreV1().Nodes().Patch(ctx, nodes[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("raw cordon: %w", err)
	}
	returned := time.Since(start)
	if err := h.waitCordoned(ctx, len(nodes)); err != nil {
		return 0, err
	}
	res.CPURaw = takeCPU().minus(cpu)
	_, last := h.nodes.cordoned()
	return max(returned, last.Sub(start)), nil
}

// waitCordoned waits until the node watch has seen n armed nodes cordoned.
func (h *harness) waitCordoned(ctx context.Context, n int) error {
	return h.wait(ctx, fmt.Sprintf("%d nodes cordoned", n), h.nodes.changed, func() (bool, string) {
		seen, _ := h.nodes.cordoned()
		return seen == n, fmt.Sprintf("%d/%d seen cordoned", seen, n)
	})
}

// finding is the NodeHealthEvent the benchmark reports for a node: XID 79
// (GPU fallen off the bus), Fatal, which the built-in table quarantines.
func finding(node string) *gpuhealthv1alpha1.NodeHealthEvent {
	const gpu, code = "GPU-1", "79"
	return &gpuhealthv1alpha1.NodeHealthEvent{
		ObjectMeta: metav1.ObjectMeta{Name: gpuhealthv1alpha1.EventName(node, gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.CheckXID, gpu, code)},
		Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName:          node,
			Source:            gpuhealthv1alpha1.SourceNVML,
			Check:             gpuhealthv1alpha1.CheckXID,
			Component:         gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu},
			Code:              code,
			Severity:          gpuhealthv1alpha1.SeverityFatal,
			RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
			Message:           "bench: Xid 79, GPU has fallen off the bus",
		},
	}
}

// eventsKey is the NodeHealthEvents' resource, which the harness's own
// creates write to.
var eventsKey = resKey{group: gpuhealthv1alpha1.GroupVersion.Group, resource: "nodehealthevents"}

// burst creates one event per node at once, times it to every node seen
// cordoned (the whole burst, and each node from its own event's create),
// and counts the API writes and bytes it took to get every NodeHealth
// Quarantined.
func (h *harness) burst(ctx context.Context, op *operator, nodes []string, res *results) error {
	before, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return err
	}
	opBefore, err := operatorWrites(ctx, op)
	if err != nil {
		return err
	}
	if err := h.nodes.arm(nodes); err != nil {
		return err
	}
	sent := h.sent.Load()
	cpu := takeCPU()
	start := time.Now()
	var created []time.Time
	if res.CreatesDone, created, err = h.createEvents(ctx, nodes); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	if err := h.waitCordoned(ctx, len(nodes)); err != nil {
		return err
	}
	res.CPUBurst = takeCPU().minus(cpu)
	_, last := h.nodes.cordoned()
	res.Operator = last.Sub(start)
	res.BurstLatency = elapsed(created, h.nodes.cordonedAt(nodes))
	if err := h.waitPhase(ctx, nodes, phaseQuarantined); err != nil {
		return err
	}
	res.Quarantined = time.Since(start)
	after, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return err
	}
	opAfter, err := operatorWrites(ctx, op)
	if err != nil {
		return err
	}
	d := after.minus(before)
	res.Writes, res.Reads = d.writes, d.reads
	res.HarnessCreates = int64(len(nodes))
	res.Writes.subtract(eventsKey, "POST", float64(res.HarnessCreates))
	res.BodyBytes, res.BodyMetric = d.bodyBytes, d.bodyMetric
	res.HarnessBytes = float64(h.sent.Load() - sent)
	res.BodyBytes.subtract(eventsKey, "POST", res.HarnessBytes)
	res.OperatorWrites = opAfter.minus(opBefore)
	if res.Transitions, res.TransitionEvents, err = h.transitionEvents(ctx, nodes); err != nil {
		return err
	}
	return nil
}

// latency creates one event at a time, each for a fresh node at steady
// state, and returns each creation-to-cordon time. Between samples it waits
// for the node's NodeHealth to reach Quarantined, so that every sample
// starts with an idle operator.
func (h *harness) latency(ctx context.Context, fresh []string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(fresh))
	for i, node := range fresh {
		if err := h.nodes.arm([]string{node}); err != nil {
			return nil, err
		}
		start := time.Now()
		if err := h.crc.Create(ctx, finding(node)); err != nil {
			return nil, fmt.Errorf("latency: creating the event of %s: %w", node, err)
		}
		if err := h.waitCordoned(ctx, 1); err != nil {
			return nil, err
		}
		_, last := h.nodes.cordoned()
		out = append(out, last.Sub(start))
		if err := h.waitPhase(ctx, []string{node}, phaseQuarantined); err != nil {
			return nil, err
		}
		if (i+1)%25 == 0 {
			logf("  latency: %d/%d samples", i+1, len(fresh))
		}
	}
	return out, nil
}

// apiserverEvictions reads what the apiserver's /metrics says of evictions.
func (h *harness) apiserverEvictions(ctx context.Context) (evictionStats, error) {
	b, err := h.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return evictionStats{}, fmt.Errorf("reading the apiserver's /metrics: %w", err)
	}
	return parseEvictionStats(b)
}

// operatorWrites reads the write counters of the operator's own client.
func operatorWrites(ctx context.Context, op *operator) (reqCounts, error) {
	b, err := op.metrics(ctx)
	if err != nil {
		return nil, err
	}
	return clientWriteCounts(b)
}

// createEvents creates one finding per node with the harness's workers and
// returns how long until every create had returned, and when each did (by
// node): a node's clock starts when its finding exists, not when the
// burst began.
func (h *harness) createEvents(ctx context.Context, nodes []string) (time.Duration, []time.Time, error) {
	created := make([]time.Time, len(nodes))
	start := time.Now()
	err := parallel(ctx, len(nodes), h.o.workers, func(ctx context.Context, i int) error {
		if err := h.crc.Create(ctx, finding(nodes[i])); err != nil {
			return fmt.Errorf("creating the event of %s: %w", nodes[i], err)
		}
		created[i] = time.Now()
		return nil
	})
	return time.Since(start), created, err
}

// backlog measures the operator's own cordon throughput, apart from the
// harness's creation rate: with the operator stopped, one event per node is
// created (timed: the creates alone, with nothing else running), then a new
// operator process starts, and the time from its start until the watch has
// seen every node cordoned is the operator's — cache sync included. This is
// also the real case of an operator restarting after an outage in which
// many nodes failed.
func (h *harness) backlog(ctx context.Context, stop func(), start func() (*operator, error), nodes []string, res *results) (*operator, error) {
	stop()
	if err := h.nodes.arm(nodes); err != nil {
		return nil, err
	}
	var err error
	cpu := takeCPU()
	if res.BacklogCreates, _, err = h.createEvents(ctx, nodes); err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	res.CPUCreates = takeCPU().minus(cpu)
	logf("backlog: %d events created in %s with no operator running; starting the operator", len(nodes), res.BacklogCreates.Round(time.Millisecond))
	before, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	cpu = takeCPU()
	begin := time.Now()
	op, err := start()
	if err != nil {
		return nil, err
	}
	if err := h.waitCordoned(ctx, len(nodes)); err != nil {
		return op, err
	}
	res.CPUBacklog = takeCPU().minus(cpu)
	_, last := h.nodes.cordoned()
	res.Backlog = last.Sub(begin)
	after, err := h.apiserverSnapshot(ctx)
	if err != nil {
		return op, err
	}
	res.BacklogWrites = after.writes.minus(before.writes)
	if err := h.waitPhase(ctx, nodes, phaseQuarantined); err != nil {
		return op, err
	}
	res.BacklogQuarantined = time.Since(begin)
	return op, nil
}
