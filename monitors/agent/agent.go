package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// State is what the agent knows about one source.
type State string

// Source states.
const (
	// StateRunning: the source is running.
	StateRunning State = "Running"
	// StateUnavailable: the source cannot run on this node now (a library or
	// device is missing); the agent runs without it and tries it again.
	StateUnavailable State = "Unavailable"
	// StateFailed: the source stopped with an error; the health check fails.
	StateFailed State = "Failed"
)

// sourceUp is 1 while a source runs and 0 when it is unavailable or died.
var sourceUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "gpuhealth_monitor_source_up",
	Help: "Whether a configured source is running (1) or unavailable on this node or died (0).",
}, []string{"source"})

func init() {
	metrics.Registry.MustRegister(sourceUp)
}

// Retry defaults for unavailable sources.
const (
	DefaultRetryInterval    = 15 * time.Second
	DefaultMaxRetryInterval = 5 * time.Minute
	// settle is how long a retried source must run before the agent counts
	// it as running: a try that fails at once must not flip the metric.
	settle = 5 * time.Second
)

// Agent runs sources and reports their findings.
type Agent struct {
	// Sources to run.
	Sources []monitors.Source
	// Report receives every finding (the pipeline's Report).
	Report monitors.Reporter
	// Log receives the agent's logs.
	Log logr.Logger
	// RetryInterval is the first wait before an unavailable source is tried
	// again; each further try waits twice as long, up to MaxRetryInterval.
	// The NVIDIA driver often loads after the agent starts on a booting
	// node (the GPU Operator installs it from a container), and a source
	// tried only once would stay off until the pod restarts. Zero means
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// MaxRetryInterval caps the wait; zero means DefaultMaxRetryInterval.
	MaxRetryInterval time.Duration
	// Clock times the retries; nil means the real clock.
	Clock clock.WithDelayedExecution

	mu     sync.Mutex
	states map[string]sourceState
}

type sourceState struct {
	state State
	err   error
	// try is the retry now running, which may still count as running once
	// it lasts; -1 when none (a first run, or the try ended).
	try int
}

// Run runs every source until ctx is done. A source that returns early
// does not stop the others; an unavailable one is tried again with backoff.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range a.Sources {
		a.set(s.Name(), StateRunning, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.supervise(ctx, s)
		}()
	}
	wg.Wait()
	return nil
}

// supervise runs one source until ctx is done or the source dies.
func (a *Agent) supervise(ctx context.Context, s monitors.Source) {
	clk := a.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	first := a.RetryInterval
	if first <= 0 {
		first = DefaultRetryInterval
	}
	wait := first
	maxWait := a.MaxRetryInterval
	if maxWait <= 0 {
		maxWait = DefaultMaxRetryInterval
	}
	var lastReason string
	for try := 0; ; try++ {
		// A retry counts as running once it has lasted settle.
		var settled clock.Timer
		if try > 0 {
			a.beginTry(s.Name(), try)
			settled = clk.AfterFunc(settle, func() {
				if a.settle(s.Name(), try) {
					a.Log.Info("Source is available now", "source", s.Name(), "tries", try+1)
				}
			})
		}
		err := s.Run(ctx, a.Report)
		if settled != nil && !settled.Stop() {
			// It ran for a while before it stopped: should it become
			// unavailable again, the backoff starts afresh.
			wait = first
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, monitors.ErrUnavailable):
			a.set(s.Name(), StateUnavailable, err)
			if reason := err.Error(); reason != lastReason {
				a.Log.Info("Source cannot run on this node now; continuing without it and trying again", "source", s.Name(), "err", err, "retryIn", wait.String())
				lastReason = reason
			} else {
				a.Log.V(1).Info("Source still cannot run on this node", "source", s.Name(), "err", err, "retryIn", wait.String())
			}
		default:
			if err == nil {
				err = errors.New("stopped without an error")
			}
			a.Log.Error(err, "Source died", "source", s.Name())
			a.set(s.Name(), StateFailed, err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-clk.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// set records a source's state; it also ends the source's try, so a try's
// settle timer that fires late changes nothing.
func (a *Agent) set(name string, st State, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setLocked(name, sourceState{state: st, err: err, try: -1})
}

func (a *Agent) setLocked(name string, st sourceState) {
	if a.states == nil {
		a.states = map[string]sourceState{}
	}
	a.states[name] = st
	up := 0.0
	if st.state == StateRunning {
		up = 1
	}
	sourceUp.WithLabelValues(name).Set(up)
}

// beginTry records that retry n of a source runs; its state stays as it was
// until the try settles.
func (a *Agent) beginTry(name string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.states[name]
	st.try = n
	a.setLocked(name, st)
}

// settle marks retry n of a source running, unless that try already ended;
// it says whether it did.
func (a *Agent) settle(name string, n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.states[name].try != n {
		return false
	}
	a.setLocked(name, sourceState{state: StateRunning, try: n})
	return true
}

// States returns each source's state, by name.
func (a *Agent) States() map[string]State {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]State{}
	for n, s := range a.states {
		out[n] = s.state
	}
	return out
}

// Healthz is the liveness check: it fails when a source died, so that the
// kubelet restarts the agent. An unavailable source does not fail it: the
// agent tries it again itself.
func (a *Agent) Healthz(_ *http.Request) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var failed []string
	for n, s := range a.states {
		if s.state == StateFailed {
			failed = append(failed, fmt.Sprintf("%s: %v", n, s.err))
		}
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		return fmt.Errorf("sources died: %s", strings.Join(failed, "; "))
	}
	return nil
}
