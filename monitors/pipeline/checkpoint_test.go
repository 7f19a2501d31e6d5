package pipeline

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

func withCheckpointed(committed uint64) harnessOption {
	return func(o *Options) {
		o.Checkpointed = map[gpuhealthv1alpha1.Source]uint64{gpuhealthv1alpha1.SourceKmsg: committed}
	}
}

func kmsgXID(gpu, code string) monitors.Finding {
	f := xidFinding(gpu, code)
	f.Source = gpuhealthv1alpha1.SourceKmsg
	return f
}

// TestCheckpointedCountsWaitForTheCursor: a checkpointed source's counts are
// published only after Seal, and all of them then.
func TestCheckpointedCountsWaitForTheCursor(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-ckpt", t.TempDir(), nil, withCheckpointed(0))
	f := kmsgXID("GPU-c0", "79")
	for range 3 {
		h.p.Report(f)
	}
	g.Consistently(func() error {
		return admin.Get(context.Background(), client.ObjectKey{Name: h.name(f)}, &gpuhealthv1alpha1.NodeHealthEvent{})
	}, 300*time.Millisecond).Should(Satisfy(apierrors.IsNotFound), "nothing is published before a cursor covers it")
	g.Expect(h.p.Sync(1)).To(Succeed())
	h.p.Seal(1)
	g.Eventually(h.event(f)).Should(count(3))

	// The next occurrences wait for the next generation.
	h.p.Report(f)
	h.p.Report(f)
	g.Consistently(h.event(f), 300*time.Millisecond).Should(count(3))
	g.Expect(h.p.Sync(2)).To(Succeed())
	h.p.Seal(2)
	g.Eventually(h.event(f)).Should(count(5))
}

// TestReplayDropsCountsTheCursorNeverCovered: after a crash between Sync
// and the cursor write, the spooled occurrences of the unwritten
// generation are dropped (the source reads them again); those of a written
// one are kept.
func TestReplayDropsCountsTheCursorNeverCovered(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	sp, _, _, err := spool.Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	spec := func(gpu string) gpuhealthv1alpha1.NodeHealthEventSpec {
		return gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: "node-replay-ckpt", Source: gpuhealthv1alpha1.SourceKmsg,
			Check: gpuhealthv1alpha1.CheckXID, Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu},
			Code: "79", Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionRebootNode}
	}
	now := time.Now()
	covered := spool.Record{Spec: spec("GPU-r1"), Base: -1, Pending: 7, Unsealed: 4, UnsealedGen: 5, FirstSeen: now, LastSeen: now}
	uncovered := spool.Record{Spec: spec("GPU-r2"), Base: -1, Pending: 7, Unsealed: 4, UnsealedGen: 6, FirstSeen: now, LastSeen: now}
	only := spool.Record{Spec: spec("GPU-r3"), Base: -1, Pending: 2, Unsealed: 2, UnsealedGen: 6, FirstSeen: now, LastSeen: now}
	for _, r := range []*spool.Record{&covered, &uncovered, &only} {
		_, err := sp.Put(r)
		g.Expect(err).NotTo(HaveOccurred())
	}

	h := start(t, "node-replay-ckpt", dir, nil, withCheckpointed(5))
	g.Eventually(h.event(kmsgXID("GPU-r1", "79"))).Should(count(7), "generation 5 was written: all seven count")
	g.Eventually(h.event(kmsgXID("GPU-r2", "79"))).Should(count(3), "generation 6 was not: its four are read again")
	g.Consistently(func() error {
		return admin.Get(context.Background(), client.ObjectKey{Name: h.name(kmsgXID("GPU-r3", "79"))}, &gpuhealthv1alpha1.NodeHealthEvent{})
	}, 300*time.Millisecond).Should(Satisfy(apierrors.IsNotFound), "a record of nothing but uncovered occurrences is dropped")
	g.Eventually(h.p.Pending).Should(BeZero())
}

// TestXID45FollowsTheXIDBeforeIt: NVIDIA's WORKFLOW_XID_45 through Report:
// after an XID 48 on the same GPU an XID 45 is Info; alone it resets.
func TestXID45FollowsTheXIDBeforeIt(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-xid45", t.TempDir(), nil)
	h.p.Report(kmsgXID("GPU-45a", "48"))
	h.p.Report(kmsgXID("GPU-45a", "45"))
	h.p.Report(kmsgXID("GPU-45b", "45"))

	named := func(gpu string, sev gpuhealthv1alpha1.Severity, act gpuhealthv1alpha1.Action) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: h.node, Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu}, Code: "45", Severity: sev, RecommendedAction: act}
		return func(g Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
			var e gpuhealthv1alpha1.NodeHealthEvent
			g.Expect(admin.Get(context.Background(), client.ObjectKey{Name: xid.EventName(&spec)}, &e)).To(Succeed())
			return &e
		}
	}
	g.Eventually(named("GPU-45a", gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone)).Should(count(1))
	e := named("GPU-45b", gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionResetGPU)(g)
	g.Expect(e.Spec.Message).To(ContainSubstring("solo XID 45"))
}

// TestOneXIDJudgedTwoWaysIsTwoEvents: an NVLink5 XID whose registers say
// reset is not counted into the harmless one's object.
func TestOneXIDJudgedTwoWaysIsTwoEvents(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-145", t.TempDir(), nil)
	harmless := kmsgXID("GPU-145", "145")
	harmless.Message = "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)"
	reset := kmsgXID("GPU-145", "145")
	reset.Message = "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"
	h.p.Report(harmless)
	h.p.Report(reset)
	h.p.Report(reset)
	list := func() map[gpuhealthv1alpha1.Severity]int64 {
		var l gpuhealthv1alpha1.NodeHealthEventList
		g.Expect(admin.List(context.Background(), &l)).To(Succeed())
		out := map[gpuhealthv1alpha1.Severity]int64{}
		for _, e := range l.Items {
			if e.Spec.NodeName == h.node {
				out[e.Spec.Severity] += e.Status.Count
			}
		}
		return out
	}
	g.Eventually(list).Should(Equal(map[gpuhealthv1alpha1.Severity]int64{
		gpuhealthv1alpha1.SeverityInfo: 1, gpuhealthv1alpha1.SeverityFatal: 2,
	}))
}
