package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// State is what the agent knows about one source.
type State string

// Source states.
const (
	// StateRunning: the source is running.
	StateRunning State = "Running"
	// StateUnavailable: the source cannot run on this node (a library or
	// device is missing); the agent runs without it.
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

// Agent runs sources and reports their findings.
type Agent struct {
	// Sources to run.
	Sources []monitors.Source
	// Report receives every finding (the pipeline's Report).
	Report monitors.Reporter
	// Log receives the agent's logs.
	Log logr.Logger

	mu     sync.Mutex
	states map[string]sourceState
}

type sourceState struct {
	state State
	err   error
}

// Run runs every source until ctx is done. A source that returns early
// does not stop the others.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range a.Sources {
		a.set(s.Name(), StateRunning, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Run(ctx, a.Report)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, monitors.ErrUnavailable):
				a.Log.Info("Source cannot run on this node; continuing without it", "source", s.Name(), "reason", err.Error())
				a.set(s.Name(), StateUnavailable, err)
			default:
				if err == nil {
					err = errors.New("stopped without an error")
				}
				a.Log.Error(err, "Source died", "source", s.Name())
				a.set(s.Name(), StateFailed, err)
			}
		}()
	}
	wg.Wait()
	return nil
}

func (a *Agent) set(name string, st State, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.states == nil {
		a.states = map[string]sourceState{}
	}
	a.states[name] = sourceState{state: st, err: err}
	up := 0.0
	if st == StateRunning {
		up = 1
	}
	sourceUp.WithLabelValues(name).Set(up)
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
// kubelet restarts the agent. An unavailable source does not fail it (a
// restart would not make a missing library appear).
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
