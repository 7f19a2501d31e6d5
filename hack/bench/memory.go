package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// memSample is the operator's memory at one instant: the kernel's resident
// set of its process and the Go runtime's own account (its /metrics), so
// that a peak can be split into what is live, what is garbage not yet
// collected, and what the runtime holds on to.
type memSample struct {
	At  time.Duration // since the sampler started
	RSS float64       // VmRSS
	// HeapAlloc is the heap's allocated bytes: live objects and garbage not
	// yet swept; HeapInuse the spans holding them; NextGC the heap size at
	// which the next collection ends (the GC's goal); HeapIdle, less
	// HeapReleased, what the runtime keeps mapped for later; Stack the
	// goroutine stacks; GCs the collections so far.
	HeapAlloc, HeapInuse, HeapIdle, HeapReleased, NextGC, Stack float64
	GCs                                                         float64
	// SoftLimit is the runtime's soft memory limit (math.MaxInt64 bytes
	// when none is set).
	SoftLimit float64
}

// memStats are the Go runtime's series the sampler reads.
var memStats = []struct {
	name string
	set  func(*memSample, float64)
}{
	{"go_memstats_heap_alloc_bytes", func(s *memSample, v float64) { s.HeapAlloc = v }},
	{"go_memstats_heap_inuse_bytes", func(s *memSample, v float64) { s.HeapInuse = v }},
	{"go_memstats_heap_idle_bytes", func(s *memSample, v float64) { s.HeapIdle = v }},
	{"go_memstats_heap_released_bytes", func(s *memSample, v float64) { s.HeapReleased = v }},
	{"go_memstats_next_gc_bytes", func(s *memSample, v float64) { s.NextGC = v }},
	{"go_memstats_stack_inuse_bytes", func(s *memSample, v float64) { s.Stack = v }},
	{"go_gc_duration_seconds_count", func(s *memSample, v float64) { s.GCs = v }},
	{"go_gc_gomemlimit_bytes", func(s *memSample, v float64) { s.SoftLimit = v }},
}

// parseMemSample reads the runtime's series out of a /metrics text.
func parseMemSample(text []byte) (memSample, error) {
	var s memSample
	for _, m := range memStats {
		samples, err := parseSamples(text, m.name)
		if err != nil {
			return s, err
		}
		if len(samples) != 1 {
			return s, fmt.Errorf("the operator's metrics have %d series %s, want 1", len(samples), m.name)
		}
		m.set(&s, samples[0].value)
	}
	return s, nil
}

// memProfile is what a memory sampler saw: the largest resident set, the
// runtime's statistics read nearest it, the largest heap and GC goal among
// the reads, and how many collections ran.
type memProfile struct {
	Samples int // RSS readings
	Scrapes int // reads of the runtime's statistics
	PeakRSS float64
	PeakAt  time.Duration
	// Peak is the runtime's statistics at the last read while the RSS was
	// at its largest so far: at or at most scrapeEvery before PeakAt.
	Peak     memSample
	MaxAlloc float64
	MaxGoal  float64
	GCs      float64 // collections between the first and the last read
	// PeakHeapProfile is the operator's heap profile read with Peak.
	PeakHeapProfile []byte
	// Limit is the container memory limit the operator was told of (0:
	// none).
	Limit float64
}

// scrapeEvery is the shortest time between two reads of the operator's
// /metrics: a read makes it build every node's gauges, which at thousands
// of nodes is work of its own, so the sampler reads the RSS often and the
// runtime's statistics only when the RSS reaches a new high, at most this
// often.
const scrapeEvery = 2 * time.Second

// sampleMemory reads the RSS of the operator (process pid) every
// interval, and its runtime's statistics as scrapeEvery allows, until stop
// is called, which returns what it saw. With heapProfile it also keeps the
// heap profile read with the statistics nearest the peak. limit is the
// container memory limit the operator was told of, for the report. A
// failed read is skipped: the process is busy, and the next one counts.
func sampleMemory(ctx context.Context, op *operator, pid int, interval time.Duration, limit float64, heapProfile bool) (stop func() memProfile) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		prof        = memProfile{Limit: limit}
		first, last memSample
		lastScrape  time.Time
	)
	start := time.Now()
	scrape := func(ctx context.Context) (memSample, bool) {
		text, err := op.metrics(ctx)
		if err != nil {
			return memSample{}, false
		}
		s, err := parseMemSample(text)
		if err != nil {
			return memSample{}, false
		}
		lastScrape = time.Now()
		s.At, s.RSS = time.Since(start), processRSS(pid)
		if prof.Scrapes == 0 {
			first = s
		}
		last = s
		prof.Scrapes++
		prof.MaxAlloc = max(prof.MaxAlloc, s.HeapAlloc)
		prof.MaxGoal = max(prof.MaxGoal, s.NextGC)
		return s, true
	}
	take := func() {
		rss := processRSS(pid)
		if rss == 0 {
			return
		}
		prof.Samples++
		if rss <= prof.PeakRSS {
			return
		}
		prof.PeakRSS, prof.PeakAt = rss, time.Since(start)
		if time.Since(lastScrape) < scrapeEvery {
			return
		}
		s, ok := scrape(ctx)
		if !ok {
			return
		}
		prof.Peak = s
		if heapProfile {
			// The heap as the last collection left it (no collection is
			// forced): what is live near the peak.
			if b, err := op.get(ctx, op.pprofURL+"/heap", "heap profile"); err == nil {
				prof.PeakHeapProfile = b
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			take()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() memProfile {
		cancel()
		<-done
		// One last read for the collections counted, on a context of its own.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		scrape(ctx)
		prof.GCs = last.GCs - first.GCs
		return prof
	}
}

// heapSample is the operator's memory at steady state, read just after a
// forced collection: Live is the heap then (HeapAlloc: what survived the
// collection, and what the profile's writing allocated since), Inuse the
// spans holding it, RSS the process's resident set.
type heapSample struct {
	Live, Inuse, RSS float64
}

// liveHeap forces a collection in the operator and returns its heap's
// allocated and in-use bytes right after it. They come from the
// runtime.MemStats that the heap profile's text form (debug=1) ends with,
// read by the profile's handler just after the collection it forced: the
// operator's /metrics would count what the scrape itself allocates, every
// node's gauges, tens of megabytes at thousands of nodes.
func (op *operator) liveHeap(ctx context.Context) (alloc, inuse float64, err error) {
	text, err := op.get(ctx, op.pprofURL+"/heap?gc=1&debug=1", "heap profile")
	if err != nil {
		return 0, 0, err
	}
	st := profileMemStats(text)
	alloc, ok := st["HeapAlloc"]
	if !ok {
		return 0, 0, fmt.Errorf("the operator's heap profile has no runtime.MemStats HeapAlloc (was it written with debug=1?)")
	}
	return alloc, st["HeapInuse"], nil
}

// profileMemStats reads the "# Name = value" lines of runtime.MemStats at
// the end of a heap profile's text form; lines that are not a number (the
// per-size-class tables, the pause list) are left out.
func profileMemStats(text []byte) map[string]float64 {
	out := map[string]float64{}
	_, stats, ok := strings.Cut(string(text), "# runtime.MemStats\n")
	if !ok {
		return out
	}
	for line := range strings.Lines(stats) {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "# "), " = ")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
		}
	}
	return out
}
