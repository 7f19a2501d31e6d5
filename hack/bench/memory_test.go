package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestSampleMemory runs the sampler against this test process, served as
// the operator serves itself: the Go collector on /metrics and Go's heap
// profile under /debug/pprof.
func TestSampleMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the RSS is read from /proc")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	var heapReads atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/heap", func(w http.ResponseWriter, r *http.Request) {
		heapReads.Add(1)
		pprof.Handler("heap").ServeHTTP(w, r)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	op := &operator{metricsURL: srv.URL + "/metrics", pprofURL: srv.URL + "/debug/pprof"}

	for _, wantProfile := range []bool{false, true} {
		heapReads.Store(0)
		stop := sampleMemory(context.Background(), op, os.Getpid(), 10*time.Millisecond, 200<<20, wantProfile)
		// Grow the resident set so that the RSS reaches a high while sampled.
		keep := make([][]byte, 0, 64)
		for range 20 {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
			time.Sleep(5 * time.Millisecond)
		}
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
		p := stop()
		runtime.KeepAlive(keep)

		if p.Samples < 5 || p.PeakRSS <= 0 || p.PeakAt <= 0 {
			t.Errorf("profile %+v: want several RSS readings and a peak", p)
		}
		// The first high is scraped; the rest come within scrapeEvery; the
		// final read adds one.
		if p.Scrapes != 2 || p.Peak.HeapAlloc <= 0 || p.Peak.RSS <= 0 || p.MaxGoal < p.Peak.NextGC {
			t.Errorf("profile %+v: want the statistics read at the first high and at the end", p)
		}
		if p.GCs < 1 {
			t.Errorf("GCs = %v, want the forced collection counted", p.GCs)
		}
		if p.Limit != 200<<20 {
			t.Errorf("Limit = %v, want the limit passed in", p.Limit)
		}
		if got := heapReads.Load() > 0 || p.PeakHeapProfile != nil; got != wantProfile {
			t.Errorf("heap profile read: %v (%d reads), want %v", got, heapReads.Load(), wantProfile)
		}
	}
}

// TestLiveHeap reads this test process's heap as the operator serves it,
// through Go's own heap profile handler: a collection forced, and the
// runtime.MemStats its text form ends with.
func TestLiveHeap(t *testing.T) {
	srv := httptest.NewServer(pprof.Handler("heap"))
	defer srv.Close()
	// The handler serves every path; liveHeap asks for pprofURL/heap.
	op := &operator{pprofURL: srv.URL}
	keep := make([]byte, 32<<20)
	alloc, inuse, err := op.liveHeap(context.Background())
	runtime.KeepAlive(keep)
	if err != nil {
		t.Fatal(err)
	}
	if alloc < 32<<20 || inuse < alloc/2 {
		t.Errorf("live heap %.0f, in use %.0f: want at least the 32 MiB kept", alloc, inuse)
	}
}

func TestProfileMemStats(t *testing.T) {
	text := `heap profile: 1: 64 [2: 128] @ heap/1048576
1: 64 [2: 128] @ 0x1 0x2
#	0x1	main.f+0x1	/x.go:1

# runtime.MemStats
# Alloc = 1000
# HeapAlloc = 1000
# HeapInuse = 4096
# BySize = [{0 0 0} {8 1 1}]
# PauseNs = [1 2 3]
# NumGC = 7
`
	st := profileMemStats([]byte(text))
	if st["HeapAlloc"] != 1000 || st["HeapInuse"] != 4096 || st["NumGC"] != 7 || len(st) != 4 {
		t.Errorf("read %v", st)
	}
	if st := profileMemStats([]byte("heap profile: 1: 64 [2: 128] @ heap/1048576\n")); len(st) != 0 {
		t.Errorf("read %v from a profile without MemStats", st)
	}
}
