package main

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

const apiserverText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="gpuhealth.dev",resource="nodehealthevents",scope="cluster",subresource="",verb="POST",version="v1alpha1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 9
apiserver_request_total_other{verb="PATCH"} 5
apiserver_request_duration_seconds_count{verb="PATCH"} 5
`

func TestAPIServerCounts(t *testing.T) {
	f, err := parseFamilies([]byte(apiserverText))
	if err != nil {
		t.Fatal(err)
	}
	w, err := apiserverCounts(f, writeVerbs)
	if err != nil {
		t.Fatal(err)
	}
	nodes := w[resKey{resource: "nodes"}]
	if nodes == nil || nodes.verbs["PATCH"] != 9 || nodes.failed != 2 {
		t.Fatalf("nodes = %+v, want PATCH 9 with 2 failed", nodes)
	}
	if got := w[resKey{resource: "nodes", subresource: "status"}].total(); got != 3 {
		t.Errorf("nodes/status = %v, want 3", got)
	}
	before := reqCounts{}
	before.add(resKey{resource: "nodes"}, "PATCH", 3, false)
	before.add(resKey{resource: "nodes"}, "PATCH", 1, true)
	d := w.minus(before)
	d.subtract(resKey{group: "gpuhealth.dev", resource: "nodehealthevents"}, "POST", 100)
	if len(d) != 2 || d[resKey{resource: "nodes"}].total() != 5 || d[resKey{resource: "nodes"}].failed != 1 {
		t.Errorf("delta = %v, want nodes 5 (1 failed) and nodes/status 3", d)
	}
	r, err := apiserverCounts(f, readVerbs)
	if err != nil {
		t.Fatal(err)
	}
	if len(r) != 1 || r[resKey{resource: "nodes"}].verbs["LIST"] != 4 {
		t.Errorf("reads = %v, want only nodes LIST 4 (discovery left out)", r)
	}
}

func TestParseSamples(t *testing.T) {
	s, err := parseSamples([]byte(`m{a="x\"y",b="1\\2",c="p\nq"} 2.5 1700000000`+"\nm 3\n"), "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || s[0].labels["a"] != `x"y` || s[0].labels["b"] != `1\2` || s[0].labels["c"] != "p\nq" || s[0].value != 2.5 || s[1].value != 3 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := parseSamples([]byte(`m{a="x} 1`), "m"); err == nil {
		t.Error("want an error for an unterminated label value")
	}
	// A typed histogram, as the apiserver writes it: its buckets are
	// read back by their series name, le included.
	h := `# HELP d_seconds latency
# TYPE d_seconds histogram
d_seconds_bucket{verb="POST",le="0.1"} 4
d_seconds_bucket{verb="POST",le="1"} 10
d_seconds_bucket{verb="POST",le="+Inf"} 11
d_seconds_sum{verb="POST"} 3.5
d_seconds_count{verb="POST"} 11
`
	b, err := parseSamples([]byte(h), "d_seconds_bucket")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, x := range b {
		if x.labels["verb"] != "POST" {
			t.Errorf("bucket %+v lost its labels", x)
		}
		got[x.labels["le"]] = x.value
	}
	if len(got) != 3 || got["0.1"] != 4 || got["1"] != 10 || got["+Inf"] != 11 {
		t.Errorf("buckets = %v, want 0.1:4 1:10 +Inf:11", got)
	}
	if c, err := parseSamples([]byte(h), "d_seconds_count"); err != nil || len(c) != 1 || c[0].value != 11 {
		t.Errorf("count = %+v, %v; want 11", c, err)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.9: 90 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond} {
		if got := percentile(s, p); got != want {
			t.Errorf("p%v = %v, want %v", p*100, got, want)
		}
	}
	if got := percentile(s[:1], 0.99); got != time.Millisecond {
		t.Errorf("p99 of one sample = %v", got)
	}
}

func TestEvictionStats(t *testing.T) {
	text := func(fast, slow, ok, refused, writes, conflicts float64) []byte {
		return []byte(fmt.Sprintf(`apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1",le="0.1"} %[1]v
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1",le="0.6"} %[1]v
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1",le="1"} %[2]v
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1",le="+Inf"} %[2]v
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="DELETE",version="v1",le="+Inf"} 99
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1"} %[3]v
apiserver_request_total{code="429",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="eviction",verb="POST",version="v1"} %[4]v
apiserver_request_total{code="200",component="apiserver",dry_run="",group="policy",resource="poddisruptionbudgets",scope="resource",subresource="status",verb="PUT",version="v1"} %[5]v
apiserver_request_total{code="409",component="apiserver",dry_run="",group="policy",resource="poddisruptionbudgets",scope="resource",subresource="status",verb="PUT",version="v1"} %[6]v
`, fast, slow, ok, refused, writes, conflicts))
	}
	before, err := parseEvictionStats(text(2, 2, 2, 0, 5, 1))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseEvictionStats(text(6, 12, 11, 1, 25, 9))
	if err != nil {
		t.Fatal(err)
	}
	d := after.minus(before)
	if d.evictions() != 10 || d.codes["201"] != 9 || d.codes["429"] != 1 {
		t.Errorf("evictions = %v by code %v, want 10 (9 201, 1 429)", d.evictions(), d.codes)
	}
	if d.statusWrites != 28 || d.conflicts != 8 {
		t.Errorf("status writes %v (conflicts %v), want 28 (8)", d.statusWrites, d.conflicts)
	}
	// 4 of the 10 within 0.1 s, the other 6 between 0.6 s and 1 s.
	if q := d.quantile(0.4); q != 0.1 {
		t.Errorf("p40 = %v, want 0.1", q)
	}
	if q := d.quantile(0.5); q != 1 {
		t.Errorf("p50 = %v, want 1", q)
	}
	if q := (evictionStats{latency: map[float64]float64{}}).quantile(0.5); q != 0 {
		t.Errorf("no evictions: p50 = %v, want 0", q)
	}
}

// TestParseMemSample reads the runtime's series from what client_golang's
// Go collector (the one every controller-runtime process registers)
// actually writes, a summary among them.
func TestParseMemSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	runtime.GC()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range families {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	s, err := parseMemSample(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if s.GCs < 1 || s.HeapAlloc <= 0 || s.HeapInuse < s.HeapAlloc/2 || s.NextGC <= 0 || s.Stack <= 0 || s.HeapIdle < s.HeapReleased || s.SoftLimit < 1<<62 {
		t.Errorf("parsed %+v from the Go collector", s)
	}
	if s.GCs > float64(ms.NumGC) {
		t.Errorf("GCs = %v, more than the runtime's %d", s.GCs, ms.NumGC)
	}
	if _, err := parseMemSample([]byte("go_memstats_heap_alloc_bytes 1\n")); err == nil {
		t.Error("want an error when a series is missing")
	}
}
