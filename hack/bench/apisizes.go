package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// apiserverSnapshot is what the bench reads of the apiserver's /metrics at
// one instant; the difference of two is what the apiserver did between.
type apiserverSnapshot struct {
	// writes and reads count requests (apiserver_request_total) by
	// resource and verb.
	writes, reads reqCounts
	// bodyBytes are the bytes of write requests' bodies by resource and
	// HTTP verb, from the request body size histogram's _sum; bodyMetric
	// names that histogram ("" when the apiserver exposes none).
	bodyBytes  reqCounts
	bodyMetric string
	// listBytes and lists are the LIST responses the apiserver sent, bytes
	// and number, by resource (apiserver_response_sizes).
	listBytes, lists reqCounts
	// watchBytes and watchEvents are the watch events it sent, to every
	// watcher, by resource (apiserver_watch_events_sizes). With client-go's
	// WatchListClient (on by default since 1.35) an informer's initial
	// list streams as watch events, not as a LIST.
	watchBytes, watchEvents reqCounts
}

// apiserverSnapshot reads the apiserver's /metrics.
func (h *harness) apiserverSnapshot(ctx context.Context) (apiserverSnapshot, error) {
	b, err := h.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiserverSnapshot{}, fmt.Errorf("reading the apiserver's /metrics: %w", err)
	}
	return parseAPIServerSnapshot(b)
}

// parseAPIServerSnapshot reads an apiserverSnapshot out of the apiserver's
// /metrics text.
func parseAPIServerSnapshot(text []byte) (apiserverSnapshot, error) {
	var s apiserverSnapshot
	f, err := parseFamilies(text)
	if err != nil {
		return s, err
	}
	if s.writes, err = apiserverCounts(f, writeVerbs); err != nil {
		return s, err
	}
	if s.reads, err = apiserverCounts(f, readVerbs); err != nil {
		return s, err
	}
	s.bodyBytes, s.bodyMetric = requestBodyBytes(f)
	s.listBytes, s.lists = sizeSums(f, "apiserver_response_sizes", listKey)
	s.watchBytes, s.watchEvents = sizeSums(f, "apiserver_watch_events_sizes", watchKey)
	return s, nil
}

// minus is what the apiserver did between before and s.
func (s apiserverSnapshot) minus(before apiserverSnapshot) apiserverSnapshot {
	return apiserverSnapshot{
		writes:      s.writes.minus(before.writes),
		reads:       s.reads.minus(before.reads),
		bodyBytes:   s.bodyBytes.minus(before.bodyBytes),
		bodyMetric:  s.bodyMetric,
		listBytes:   s.listBytes.minus(before.listBytes),
		lists:       s.lists.minus(before.lists),
		watchBytes:  s.watchBytes.minus(before.watchBytes),
		watchEvents: s.watchEvents.minus(before.watchEvents),
	}
}

// sizeKey says which series of a size histogram count, under which
// resource and verb.
type sizeKey func(labels map[string]string) (k resKey, verb string, ok bool)

// sizeSums sums a size histogram's _sum (bytes) and _count (requests or
// events) by resource and verb, over the series key accepts.
func sizeSums(f metricFamilies, name string, key sizeKey) (bytes, count reqCounts) {
	bytes, count = reqCounts{}, reqCounts{}
	for _, s := range f.samples(name + "_sum") {
		if k, verb, ok := key(s.labels); ok {
			bytes.add(k, verb, s.value, false)
		}
	}
	for _, s := range f.samples(name + "_count") {
		if k, verb, ok := key(s.labels); ok {
			count.add(k, verb, s.value, false)
		}
	}
	return bytes, count
}

// bodySizeMetrics are the names the apiserver's request body size
// histogram goes by: apiserver_request_body_size_bytes, labelled by group,
// resource and verb, in current releases, and apiserver_request_body_sizes,
// with the resource written resource.group, in older ones. The first the
// apiserver exposes is read.
var bodySizeMetrics = []struct {
	name  string
	split bool // the group is in the resource label
}{
	{"apiserver_request_body_size_bytes", false},
	{"apiserver_request_body_sizes", true},
}

// requestBodyBytes sums the request body size histogram by resource and
// HTTP verb, and names the histogram read ("" when there is none).
func requestBodyBytes(f metricFamilies) (reqCounts, string) {
	for _, m := range bodySizeMetrics {
		if _, ok := f[m.name]; !ok {
			continue
		}
		b, _ := sizeSums(f, m.name, bodyKey(m.split))
		return b, m.name
	}
	return nil, ""
}

// bodyVerbs map the body size histogram's verbs to the HTTP verbs that
// apiserver_request_total counts, so both read alike in the tables.
var bodyVerbs = map[string]string{"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE", "delete_collection": "DELETECOLLECTION"}

// bodyKey keys the body size histogram's series by resource (it has no
// subresource label: a status write counts under its object's resource).
func bodyKey(split bool) sizeKey {
	return func(l map[string]string) (resKey, string, bool) {
		verb, ok := bodyVerbs[l["verb"]]
		group, resource := l["group"], l["resource"]
		if split {
			resource, group, _ = strings.Cut(resource, ".")
		}
		return resKey{group: group, resource: resource}, verb, ok && resource != ""
	}
}

// listKey keeps the LIST responses of apiserver_response_sizes, which
// also holds GETs.
func listKey(l map[string]string) (resKey, string, bool) {
	k := resKey{group: l["group"], resource: l["resource"], subresource: l["subresource"]}
	return k, "LIST", l["verb"] == "LIST" && k.resource != ""
}

// watchKey keys apiserver_watch_events_sizes by resource.
func watchKey(l map[string]string) (resKey, string, bool) {
	k := resKey{group: l["group"], resource: l["resource"]}
	return k, "WATCH", k.resource != ""
}

// byResource totals counters by group and resource, subresources folded
// in, so that request counts (which have subresources) and body bytes
// (which do not) line up.
func byResource(c reqCounts) map[resKey]float64 {
	out := map[resKey]float64{}
	for k, v := range c {
		out[resKey{group: k.group, resource: k.resource}] += v.total()
	}
	return out
}

// writeCounter counts the bytes of the write requests' bodies that the
// harness's clients send, so that its own creates can be taken out of the
// apiserver's request body sizes. A request refused with 429 (API
// Priority and Fairness) never reaches the handler that counts bodies, so
// neither does it here.
type writeCounter struct {
	next  http.RoundTripper
	bytes *atomic.Int64
}

func (c writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && writeVerbs[req.Method] && req.ContentLength > 0 && resp.StatusCode != http.StatusTooManyRequests {
		c.bytes.Add(req.ContentLength)
	}
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport beneath, to
// cancel a request that timed out.
func (c writeCounter) WrappedRoundTripper() http.RoundTripper { return c.next }
