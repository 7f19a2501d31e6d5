package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
)

// synthetic is a finding the soak writes itself for a node without a
// monitor process, as a monitor does: the object created from its spec,
// then its status merge-patched with absolute values (count, firstSeen,
// lastSeen, resolved, resolvedAt), so that a write retried after an error
// cannot count twice.
type synthetic struct {
	name       string
	spec       gpuhealthv1alpha1.NodeHealthEventSpec
	count      int64
	firstSeen  time.Time
	lastSeen   time.Time
	resolved   bool
	resolvedAt time.Time
	dirty      bool
}

// ledger is the soak's own account of every finding it injected: the
// synthetic findings it writes and the occurrences it gave the monitors.
type ledger struct {
	c client.Client

	mu        sync.Mutex
	synthetic map[string]*synthetic
	// monitor counts the occurrences injected through a monitor.
	monitor map[findingKey]int64
}

func newLedger(c client.Client) *ledger {
	return &ledger{c: c, synthetic: map[string]*synthetic{}, monitor: map[findingKey]int64{}}
}

// xidSpec is the spec a monitor writes for an XID on a GPU of node i,
// judged by the built-in catalog.
func xidSpec(node string, i, device, code int) gpuhealthv1alpha1.NodeHealthEventSpec {
	e := xid.Lookup(code, "")
	return gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(i, device)},
		Code:      strconv.Itoa(code), Severity: e.Severity, RecommendedAction: e.Action,
		Message: fmt.Sprintf("XID %d: %s; %s (written by the chaos soak)", code, e.Summary(), e.Reason),
	}
}

// nvlinkSpec is an NVLink error-rate crossing on one link.
func nvlinkSpec(node string, i, device, link int) gpuhealthv1alpha1.NodeHealthEventSpec {
	return gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckNVLinkErrors,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: fmt.Sprintf("%s/link-%d", framework.GPUUUID(i, device), link)},
		Code:      "CRC_FLIT", Severity: gpuhealthv1alpha1.SeverityDegraded, RecommendedAction: gpuhealthv1alpha1.ActionRecertify,
		Message: fmt.Sprintf("GPU %d link %d CRC_FLIT rate over its threshold (written by the chaos soak)", device, link),
	}
}

// fabricSpec is a GPU's NVLink fabric reported unhealthy, a clique fault.
func fabricSpec(node string, i, device int) gpuhealthv1alpha1.NodeHealthEventSpec {
	return gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckFabric,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(i, device)},
		Code:      "UNHEALTHY", Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionRecertify,
		Message: fmt.Sprintf("GPU %d fabric UNHEALTHY (written by the chaos soak)", device),
	}
}

// occur records n more occurrences of the finding spec describes (it is
// active again) and writes it.
func (l *ledger) occur(ctx context.Context, spec gpuhealthv1alpha1.NodeHealthEventSpec, n int64) error {
	name := xid.EventName(&spec)
	now := time.Now()
	l.mu.Lock()
	s, ok := l.synthetic[name]
	if !ok {
		s = &synthetic{name: name, spec: spec, firstSeen: now}
		l.synthetic[name] = s
	}
	s.count += n
	s.lastSeen, s.resolved, s.resolvedAt, s.dirty = now, false, time.Time{}, true
	l.mu.Unlock()
	return l.flushOne(ctx, name)
}

// resolve marks a condition finding cleared, as its producer would.
func (l *ledger) resolve(ctx context.Context, spec gpuhealthv1alpha1.NodeHealthEventSpec) error {
	name := xid.EventName(&spec)
	l.mu.Lock()
	s, ok := l.synthetic[name]
	if !ok || s.resolved {
		l.mu.Unlock()
		return nil
	}
	s.resolved, s.resolvedAt, s.dirty = true, time.Now(), true
	l.mu.Unlock()
	return l.flushOne(ctx, name)
}

// flush writes every finding whose last write failed; it returns how many
// are still unwritten and the last error.
func (l *ledger) flush(ctx context.Context) (int, error) {
	l.mu.Lock()
	var names []string
	for n, s := range l.synthetic {
		if s.dirty {
			names = append(names, n)
		}
	}
	l.mu.Unlock()
	sort.Strings(names)
	left, lastErr := 0, error(nil)
	for _, n := range names {
		if err := l.flushOne(ctx, n); err != nil {
			left, lastErr = left+1, err
		}
	}
	return left, lastErr
}

// flushOne writes one finding's spec (when missing) and absolute status.
func (l *ledger) flushOne(ctx context.Context, name string) error {
	l.mu.Lock()
	s := *l.synthetic[name]
	l.mu.Unlock()
	if !s.dirty {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	obj := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: s.spec}
	if err := l.c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating finding %s: %w", name, err)
	}
	status := map[string]any{
		"count": s.count, "firstSeen": metav1.NewTime(s.firstSeen), "lastSeen": metav1.NewTime(s.lastSeen),
		"resolved": s.resolved, "resolvedAt": nil,
	}
	if s.resolved {
		status["resolvedAt"] = metav1.NewTime(s.resolvedAt)
	}
	data, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	if err := l.c.Status().Patch(ctx, &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}},
		client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("writing the status of finding %s: %w", name, err)
	}
	l.mu.Lock()
	if cur := l.synthetic[name]; cur.count == s.count && cur.resolved == s.resolved && cur.lastSeen.Equal(s.lastSeen) {
		cur.dirty = false
	}
	l.mu.Unlock()
	return nil
}

// injected records n occurrences given to a monitor.
func (l *ledger) injected(k findingKey, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.monitor[k] += n
}

// want is the count every injected finding must have.
func (l *ledger) want() map[findingKey]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[findingKey]int64{}
	for _, s := range l.synthetic {
		out[findingKey{s.spec.NodeName, s.spec.Check, s.spec.Component.ID, s.spec.Code}] += s.count
	}
	for k, n := range l.monitor {
		out[k] += n
	}
	return out
}

// got reads every finding's count from the apiserver, by the key the
// ledger uses: the kernel log's copy of an XID named by its GPU's bus id
// counts for the GPU's UUID, and the source does not matter.
func got(ctx context.Context, c client.Client) (map[findingKey]int64, error) {
	var list gpuhealthv1alpha1.NodeHealthEventList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing findings: %w", err)
	}
	out := map[findingKey]int64{}
	for i := range list.Items {
		s := &list.Items[i].Spec
		out[findingKey{s.NodeName, s.Check, normalizeComponent(s.NodeName, s.Component.ID), s.Code}] += list.Items[i].Status.Count
	}
	return out, nil
}

// normalizeComponent maps a fake GPU's PCI bus id ("0000:88:00.0", as the
// kernel log names a GPU before NVML has) to its UUID.
func normalizeComponent(node, id string) string {
	i, ok := nodeIndex(node)
	if !ok || !strings.HasPrefix(id, "0000:") {
		return id
	}
	for d := range 8 {
		if strings.HasPrefix(id, framework.PCIBusID(d)) {
			return framework.GPUUUID(i, d)
		}
	}
	return id
}

// nodeIndex is n of gpu-node-n.
func nodeIndex(node string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(node, "gpu-node-"))
	return n, err == nil && strings.HasPrefix(node, "gpu-node-")
}
