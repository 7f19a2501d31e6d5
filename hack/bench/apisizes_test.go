package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// client-go cancels a timed-out request on the transport beneath the
// counter, which it finds through the wrapper (else it only warns).
var _ utilnet.RoundTripperWrapper = writeCounter{}

// sizesText is the apiserver's size histograms as it writes them (buckets
// cut short): the request body sizes, the response sizes (GET and LIST)
// and the watch events.
const sizesText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="gpuhealth.dev",resource="nodehealthevents",scope="cluster",subresource="",verb="POST",version="v1alpha1"} 100
# HELP apiserver_request_body_size_bytes [ALPHA] Apiserver request body size in bytes broken out by resource and verb.
# TYPE apiserver_request_body_size_bytes histogram
apiserver_request_body_size_bytes_bucket{group="gpuhealth.dev",resource="nodehealthevents",verb="create",le="50000"} 100
apiserver_request_body_size_bytes_bucket{group="gpuhealth.dev",resource="nodehealthevents",verb="create",le="+Inf"} 100
apiserver_request_body_size_bytes_sum{group="gpuhealth.dev",resource="nodehealthevents",verb="create"} 60000
apiserver_request_body_size_bytes_count{group="gpuhealth.dev",resource="nodehealthevents",verb="create"} 100
apiserver_request_body_size_bytes_bucket{group="",resource="nodes",verb="patch",le="+Inf"} 7
apiserver_request_body_size_bytes_sum{group="",resource="nodes",verb="patch"} 700
apiserver_request_body_size_bytes_count{group="",resource="nodes",verb="patch"} 7
apiserver_request_body_size_bytes_bucket{group="",resource="nodes",verb="get",le="+Inf"} 1
apiserver_request_body_size_bytes_sum{group="",resource="nodes",verb="get"} 5
apiserver_request_body_size_bytes_count{group="",resource="nodes",verb="get"} 1
# HELP apiserver_response_sizes [STABLE] Response size distribution in bytes for each group, version, verb, resource, subresource, scope and component.
# TYPE apiserver_response_sizes histogram
apiserver_response_sizes_bucket{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1",le="+Inf"} 2
apiserver_response_sizes_sum{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 2.5e+06
apiserver_response_sizes_count{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_response_sizes_bucket{component="apiserver",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1",le="+Inf"} 9
apiserver_response_sizes_sum{component="apiserver",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 9000
apiserver_response_sizes_count{component="apiserver",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 9
# HELP apiserver_watch_events_sizes [BETA] Watch event size distribution in bytes
# TYPE apiserver_watch_events_sizes histogram
apiserver_watch_events_sizes_bucket{group="",resource="nodes",version="v1",le="+Inf"} 1000
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 3.2e+06
apiserver_watch_events_sizes_count{group="",resource="nodes",version="v1"} 1000
`

func TestParseAPIServerSnapshot(t *testing.T) {
	s, err := parseAPIServerSnapshot([]byte(sizesText))
	if err != nil {
		t.Fatal(err)
	}
	if s.bodyMetric != "apiserver_request_body_size_bytes" {
		t.Errorf("body metric %q", s.bodyMetric)
	}
	if got := s.bodyBytes[eventsKey]; got == nil || got.verbs["POST"] != 60000 || len(got.verbs) != 1 {
		t.Errorf("event body bytes %+v, want POST 60000", got)
	}
	// A read's body (a GET with one) is no write.
	if got := s.bodyBytes[resKey{resource: "nodes"}]; got == nil || got.verbs["PATCH"] != 700 || len(got.verbs) != 1 {
		t.Errorf("node body bytes %+v, want PATCH 700 alone", got)
	}
	nodes := resKey{resource: "nodes"}
	if s.listBytes[nodes].total() != 2.5e6 || s.lists[nodes].total() != 2 || len(s.listBytes) != 1 {
		t.Errorf("LIST bytes %v, lists %v; want nodes 2.5e6 in 2, and no GET", s.listBytes, s.lists)
	}
	if s.watchBytes[nodes].total() != 3.2e6 || s.watchEvents[nodes].total() != 1000 {
		t.Errorf("watch bytes %v, events %v", s.watchBytes, s.watchEvents)
	}
	if s.writes[eventsKey].total() != 100 {
		t.Errorf("writes %v", s.writes)
	}

	before, err := parseAPIServerSnapshot([]byte(strings.ReplaceAll(sizesText, `verb="create"} 60000`, `verb="create"} 10000`)))
	if err != nil {
		t.Fatal(err)
	}
	d := s.minus(before)
	if len(d.bodyBytes) != 1 || d.bodyBytes[eventsKey].total() != 50000 || d.bodyMetric != s.bodyMetric || len(d.listBytes) != 0 {
		t.Errorf("difference %+v, want only 50000 event body bytes", d)
	}
}

func TestRequestBodyBytesReadsTheOlderName(t *testing.T) {
	text := `# TYPE apiserver_request_body_sizes histogram
apiserver_request_body_sizes_bucket{resource="nodehealthevents.gpuhealth.dev",verb="create",le="+Inf"} 2
apiserver_request_body_sizes_sum{resource="nodehealthevents.gpuhealth.dev",verb="create"} 1200
apiserver_request_body_sizes_count{resource="nodehealthevents.gpuhealth.dev",verb="create"} 2
apiserver_request_body_sizes_bucket{resource="nodes",verb="update",le="+Inf"} 1
apiserver_request_body_sizes_sum{resource="nodes",verb="update"} 300
apiserver_request_body_sizes_count{resource="nodes",verb="update"} 1
`
	f, err := parseFamilies([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	b, name := requestBodyBytes(f)
	if name != "apiserver_request_body_sizes" || b[eventsKey].verbs["POST"] != 1200 || b[resKey{resource: "nodes"}].verbs["PUT"] != 300 {
		t.Errorf("read %v from %q", b, name)
	}
	if b, name := requestBodyBytes(metricFamilies{}); b != nil || name != "" {
		t.Errorf("without the histogram: %v from %q, want nothing", b, name)
	}
}

func TestByResourceFoldsSubresources(t *testing.T) {
	c := reqCounts{}
	c.add(resKey{resource: "nodes"}, "PATCH", 3, false)
	c.add(resKey{resource: "nodes", subresource: "status"}, "PATCH", 2, false)
	c.add(resKey{group: "coordination.k8s.io", resource: "leases"}, "PUT", 7, false)
	got := byResource(c)
	if len(got) != 2 || got[resKey{resource: "nodes"}] != 5 {
		t.Errorf("by resource %v, want nodes 5 and leases", got)
	}
	if w := withoutHeartbeats(got); w != 5 {
		t.Errorf("without heartbeats %v, want 5", w)
	}
}

func TestWriteCounterCountsWriteBodies(t *testing.T) {
	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if refuse.Load() {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	var n atomic.Int64
	c := &http.Client{Transport: writeCounter{next: http.DefaultTransport, bytes: &n}}
	do := func(method, body string) {
		req, err := http.NewRequest(method, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	do(http.MethodPost, "12345")
	do(http.MethodPatch, "678")
	do(http.MethodGet, "ignored")
	refuse.Store(true)
	do(http.MethodPost, "refused")
	if got := n.Load(); got != 8 {
		t.Errorf("counted %d bytes, want 8 (the POST's and the PATCH's)", got)
	}
}
