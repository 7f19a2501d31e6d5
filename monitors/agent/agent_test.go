package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// flaky is unavailable for its first `missing` runs (a driver that has not
// loaded yet), then runs until cancelled; with `dies` it fails instead.
type flaky struct {
	name    string
	missing int32
	dies    bool
	runs    atomic.Int32
}

func (f *flaky) Name() string { return f.name }

func (f *flaky) Run(ctx context.Context, _ monitors.Reporter) error {
	n := f.runs.Add(1)
	if f.dies {
		return errors.New("broken")
	}
	if n <= f.missing {
		return monitors.Unavailable("libnvidia-ml.so.1 not found")
	}
	<-ctx.Done()
	return nil
}

// start runs the agent on a fake clock and returns the clock.
func start(t *testing.T, a *Agent) *clocktesting.FakeClock {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	a.Clock, a.Log, a.Report = clk, logr.Discard(), func(monitors.Finding) {}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return clk
}

// TestUnavailableSourceIsTriedAgainWithBackoff: a source whose library is
// missing at start is tried again after 1 s, 2 s, 4 s, 4 s (the cap), and
// counts as running once a try has lasted a few seconds.
func TestUnavailableSourceIsTriedAgainWithBackoff(t *testing.T) {
	g := NewWithT(t)
	src := &flaky{name: "retry-nvml", missing: 4}
	a := &Agent{Sources: []monitors.Source{src}, RetryInterval: time.Second, MaxRetryInterval: 4 * time.Second}
	clk := start(t, a)
	up := func() float64 { return testutil.ToFloat64(sourceUp.WithLabelValues(src.name)) }

	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		g.Eventually(src.runs.Load).Should(BeEquivalentTo(i + 1))
		g.Eventually(func() State { return a.States()[src.name] }).Should(Equal(StateUnavailable))
		g.Expect(up()).To(BeZero())
		g.Expect(a.Healthz(nil)).To(Succeed(), "an unavailable source does not fail liveness")
		g.Eventually(clk.HasWaiters).Should(BeTrue())
		clk.Step(wait - time.Millisecond)
		g.Consistently(src.runs.Load, 50*time.Millisecond).Should(BeEquivalentTo(i+1), "not before %s", wait)
		clk.Step(time.Millisecond)
	}
	g.Eventually(src.runs.Load).Should(BeEquivalentTo(5))
	g.Consistently(up, 50*time.Millisecond).Should(BeZero(), "a try counts as running only once it lasts")
	g.Eventually(clk.HasWaiters).Should(BeTrue())
	clk.Step(settle)
	g.Eventually(up).Should(BeEquivalentTo(1))
	g.Expect(a.States()[src.name]).To(Equal(StateRunning))
}

// TestDeadSourceIsNotTriedAgain: a source that fails (not unavailable)
// fails liveness, so the kubelet restarts the agent; the agent does not.
func TestDeadSourceIsNotTriedAgain(t *testing.T) {
	g := NewWithT(t)
	src := &flaky{name: "retry-dead", dies: true}
	a := &Agent{Sources: []monitors.Source{src}, RetryInterval: time.Second}
	clk := start(t, a)
	g.Eventually(func() State { return a.States()[src.name] }).Should(Equal(StateFailed))
	g.Expect(a.Healthz(nil)).To(MatchError(ContainSubstring("retry-dead: broken")))
	clk.Step(time.Hour)
	g.Consistently(src.runs.Load, 100*time.Millisecond).Should(BeEquivalentTo(1))
}

// TestLateSettleChangesNothing: a retry's settle timer that fires after the
// try ended (the source died right at the mark) leaves the state the end
// set, so a dead source is never reported running.
func TestLateSettleChangesNothing(t *testing.T) {
	g := NewWithT(t)
	a := &Agent{}
	a.set("late", StateUnavailable, monitors.Unavailable("no library"))
	a.beginTry("late", 1)
	a.set("late", StateFailed, errors.New("broken"))
	g.Expect(a.settle("late", 1)).To(BeFalse())
	g.Expect(a.States()["late"]).To(Equal(StateFailed))
	g.Expect(testutil.ToFloat64(sourceUp.WithLabelValues("late"))).To(BeZero())
	g.Expect(a.Healthz(nil)).To(HaveOccurred())

	a.beginTry("late", 2)
	g.Expect(a.settle("late", 2)).To(BeTrue(), "a try still running settles")
	g.Expect(a.States()["late"]).To(Equal(StateRunning))
}
