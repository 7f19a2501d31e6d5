package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSpreadOf(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	got := spreadOf(s)
	want := spread{P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if got != want {
		t.Errorf("spread %+v, want %+v", got, want)
	}
	if s[0] != 100*time.Millisecond {
		t.Error("spreadOf sorted its argument")
	}
	if got := spreadOf(nil); got != (spread{}) {
		t.Errorf("spread of nothing %+v", got)
	}
}

func TestElapsedSkipsUnsetInstants(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	got := elapsed([]time.Time{at(0), at(10), {}, at(30)}, []time.Time{at(50), {}, at(40), at(35)})
	if len(got) != 2 || got[0] != 50*time.Millisecond || got[1] != 5*time.Millisecond {
		t.Errorf("elapsed %v, want [50ms 5ms]", got)
	}
}

func TestBytesOf(t *testing.T) {
	for b, want := range map[float64]string{512: "512 B", 10239: "10239 B", 20 * 1024: "20.0 KiB", 30 * mib: "30.0 MiB"} {
		if got := bytesOf(b); got != want {
			t.Errorf("bytesOf(%v) = %q, want %q", b, got, want)
		}
	}
}

func TestSkippedPhases(t *testing.T) {
	o := options{nodes: 10000, idle: time.Second, latencySamples: 1, detectSamples: 1, wave: 100, backlog: true, backlogMaxNodes: 5000}
	if got := o.skippedPhases(); len(got) != 1 || got[0] != "backlog (N > -backlog-max-nodes 5000)" || o.runsBacklog() {
		t.Errorf("at 10,000 nodes: %q", got)
	}
	o.nodes = 5000
	if got := o.skippedPhases(); len(got) != 0 || !o.runsBacklog() {
		t.Errorf("at 5,000 nodes: %q", got)
	}
	o.backlogMaxNodes, o.nodes = 0, 20000
	if !o.runsBacklog() {
		t.Error("-backlog-max-nodes 0 skipped the backlog")
	}
	o = options{nodes: 100}
	if got := strings.Join(o.skippedPhases(), "; "); got != "idle CPU (-idle 0); single events (-latency-samples 0); detection (-detect-samples 0); fault wave (-wave 0); backlog (-backlog=false)" {
		t.Errorf("everything off: %q", got)
	}
}

// TestCurveWithPhasesSkipped renders the scale curve's tables and figure
// with a size that skipped the backlog and the wave, as a 10,000-node run
// does: its ratios read n/a, and its curves go without those points.
func TestCurveWithPhasesSkipped(t *testing.T) {
	small := &results{N: 1000, PodsPerNode: 1, Raw: time.Second, Operator: 2 * time.Second, BacklogCreates: time.Second, Backlog: 3 * time.Second,
		BurstLatency: []time.Duration{time.Millisecond, 2 * time.Millisecond}, Heap: heapSample{Live: 20 * mib, Inuse: 25 * mib, RSS: 60 * mib},
		Transitions: 1000, BodyMetric: "apiserver_request_body_size_bytes", BodyBytes: reqCounts{}, Writes: reqCounts{},
		Wave:    &waveResult{Nodes: 100, Pods: 10, EvictionsPerSecond: 20, PerNode: []time.Duration{time.Second}, Whole: time.Second},
		RSSPeak: map[string]float64{"gpuhealth-operator": 90 * mib}}
	small.Writes.add(resKey{resource: "nodes"}, "PATCH", 3000, false)
	small.BodyBytes.add(resKey{resource: "nodes"}, "PATCH", 3000*1024, false)
	big := &results{N: 10000, PodsPerNode: 1, Raw: 10 * time.Second, Operator: 30 * time.Second,
		BurstLatency: []time.Duration{time.Second}, Heap: heapSample{Live: 150 * mib, RSS: 400 * mib},
		RSSPeak: map[string]float64{"gpuhealth-operator": 500 * mib}, Skipped: []string{"backlog (N > -backlog-max-nodes 5000)", "fault wave (-wave 0)"}}
	all := []*results{small, big}
	md := curveMarkdown(all)
	for _, want := range []string{"| **n/a** |", "| skipped |", "backlog (N > -backlog-max-nodes 5000); fault wave (-wave 0) |", "| 1000 | 1.0 ms / 2.0 ms / 2.0 ms | 3.00 | 3072 B |", "| 20.0 / 60.0 MiB |", "| 15.0 / 40.0 MiB | skipped |", "| backlog | n/a |", "| live heap at steady state | 14.4 MiB |", "| RSS at steady state | 37.8 MiB |"} {
		if !strings.Contains(md, want) {
			t.Errorf("curve lacks %q:\n%s", want, md)
		}
	}
	if v := big.bytesPerTransition(); !math.IsNaN(v) {
		t.Errorf("bytes per transition without the histogram: %v, want NaN", v)
	}
	png := filepath.Join(t.TempDir(), "scale.png")
	if err := plotCurve(all, png); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(png); err != nil || st.Size() == 0 {
		t.Fatalf("no figure: %v", err)
	}
}
