package main

import (
	"bytes"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// writeVerbs are the apiserver_request_total verbs (and client-go methods)
// that change something; readVerbs are those that read without watching.
var (
	writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}
	readVerbs  = map[string]bool{"GET": true, "LIST": true}
)

// resKey is an API resource as apiserver_request_total labels it.
type resKey struct{ group, resource, subresource string }

// String is the resource as "resource.group/subresource".
func (k resKey) String() string {
	s := k.resource
	if k.group != "" {
		s += "." + k.group
	}
	if k.subresource != "" {
		s += "/" + k.subresource
	}
	return s
}

// reqCount is the requests to one resource, by verb, and how many failed.
type reqCount struct {
	verbs  map[string]float64
	failed float64
}

func (c *reqCount) total() float64 {
	t := 0.0
	for _, v := range c.verbs {
		t += v
	}
	return t
}

// reqCounts are request counters by resource.
type reqCounts map[resKey]*reqCount

func (w reqCounts) add(k resKey, verb string, v float64, failed bool) {
	c := w[k]
	if c == nil {
		c = &reqCount{verbs: map[string]float64{}}
		w[k] = c
	}
	c.verbs[verb] += v
	if failed {
		c.failed += v
	}
}

// minus returns the counters of w less those of before, without zeros.
func (w reqCounts) minus(before reqCounts) reqCounts {
	out := reqCounts{}
	for k, c := range w {
		b := before[k]
		for verb, v := range c.verbs {
			if b != nil {
				v -= b.verbs[verb]
			}
			if v != 0 {
				out.add(k, verb, v, false)
			}
		}
		if f := c.failed - failedOf(b); f != 0 && out[k] != nil {
			out[k].failed = f
		}
	}
	return out
}

func failedOf(c *reqCount) float64 {
	if c == nil {
		return 0
	}
	return c.failed
}

// subtract removes n writes of verb from k (the harness's own requests).
func (w reqCounts) subtract(k resKey, verb string, n float64) {
	if c := w[k]; c != nil {
		c.verbs[verb] -= n
		if c.verbs[verb] == 0 {
			delete(c.verbs, verb)
		}
		if len(c.verbs) == 0 {
			delete(w, k)
		}
	}
}

// apiserverCounts sums apiserver_request_total over verbs, by resource
// (requests for no resource, such as discovery, are left out).
func apiserverCounts(f metricFamilies, verbs map[string]bool) (reqCounts, error) {
	samples := f.samples("apiserver_request_total")
	if len(samples) == 0 {
		return nil, fmt.Errorf("no apiserver_request_total in the apiserver's /metrics")
	}
	w := reqCounts{}
	for _, s := range samples {
		verb := s.labels["verb"]
		if !verbs[verb] || s.labels["resource"] == "" {
			continue
		}
		k := resKey{group: s.labels["group"], resource: s.labels["resource"], subresource: s.labels["subresource"]}
		w.add(k, verb, s.value, !strings.HasPrefix(s.labels["code"], "2"))
	}
	return w, nil
}

// operatorKey holds the operator's own client writes, which client-go counts
// by HTTP method only.
var operatorKey = resKey{resource: "operator client"}

// clientWriteCounts sums client-go's rest_client_requests_total over write methods.
func clientWriteCounts(text []byte) (reqCounts, error) {
	samples, err := parseSamples(text, "rest_client_requests_total")
	if err != nil {
		return nil, err
	}
	w := reqCounts{}
	for _, s := range samples {
		method := s.labels["method"]
		if !writeVerbs[method] {
			continue
		}
		w.add(operatorKey, method, s.value, !strings.HasPrefix(s.labels["code"], "2"))
	}
	return w, nil
}

// sample is one series of a metric: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// parseSamples returns the samples of one metric from Prometheus text
// (see metricFamilies.samples).
func parseSamples(text []byte, name string) ([]sample, error) {
	f, err := parseFamilies(text)
	if err != nil {
		return nil, err
	}
	return f.samples(name), nil
}

// metricFamilies is a Prometheus text parsed once, so that several
// metrics can be read from it: the apiserver's /metrics runs to megabytes
// at thousands of nodes, and the bench reads a dozen series out of it.
type metricFamilies map[string]*dto.MetricFamily

// parseFamilies parses Prometheus text with expfmt.
func parseFamilies(text []byte) (metricFamilies, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics text: %w", err)
	}
	return families, nil
}

// samples returns the samples of one metric. name is a series name as the
// text writes it: a histogram's buckets are name_bucket with their le
// label, as its _count and _sum are (and a summary's).
func (f metricFamilies) samples(name string) []sample {
	var out []sample
	for _, mf := range f {
		for _, m := range mf.GetMetric() {
			labels := func(extra ...string) map[string]string {
				l := make(map[string]string, len(m.GetLabel())+1)
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				for i := 0; i+1 < len(extra); i += 2 {
					l[extra[i]] = extra[i+1]
				}
				return l
			}
			switch h := m.GetHistogram(); {
			case mf.GetType() == dto.MetricType_HISTOGRAM && h != nil:
				base := mf.GetName()
				switch name {
				case base + "_bucket":
					// expfmt keeps a count as an integer or, when any is
					// fractional, every one as a float: one of the two is set.
					inf := false
					for _, b := range h.GetBucket() {
						inf = inf || math.IsInf(b.GetUpperBound(), 1)
						out = append(out, sample{labels(model.BucketLabel, formatBound(b.GetUpperBound())),
							float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()})
					}
					if !inf {
						out = append(out, sample{labels(model.BucketLabel, "+Inf"), float64(h.GetSampleCount()) + h.GetSampleCountFloat()})
					}
				case base + "_count":
					out = append(out, sample{labels(), float64(h.GetSampleCount()) + h.GetSampleCountFloat()})
				case base + "_sum":
					out = append(out, sample{labels(), h.GetSampleSum()})
				}
			case mf.GetType() == dto.MetricType_SUMMARY && m.GetSummary() != nil:
				switch name {
				case mf.GetName() + "_count":
					out = append(out, sample{labels(), float64(m.GetSummary().GetSampleCount())})
				case mf.GetName() + "_sum":
					out = append(out, sample{labels(), m.GetSummary().GetSampleSum()})
				}
			case mf.GetName() != name:
			case m.GetCounter() != nil:
				out = append(out, sample{labels(), m.GetCounter().GetValue()})
			case m.GetGauge() != nil:
				out = append(out, sample{labels(), m.GetGauge().GetValue()})
			case m.GetUntyped() != nil:
				out = append(out, sample{labels(), m.GetUntyped().GetValue()})
			}
		}
	}
	return out
}

// formatBound writes a bucket bound as the text format's le label does.
func formatBound(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// evictionStats is what the apiserver's /metrics says of the evictions it
// served and of the PodDisruptionBudget status writes behind them. An
// eviction writes the budget's status at the resourceVersion it read and,
// on a conflict, waits 500 ms (±10%) before it reads again: the conflicts
// and the latency buckets show that wait.
type evictionStats struct {
	// latency is the cumulative count of eviction POSTs by bucket bound.
	latency map[float64]float64
	// codes counts eviction POSTs by HTTP code.
	codes map[string]float64
	// statusWrites and conflicts count PodDisruptionBudget status PUTs
	// (every client: the evictions' own and the disruption controller's),
	// and those answered 409.
	statusWrites, conflicts float64
}

// parseEvictionStats reads evictionStats from the apiserver's /metrics.
func parseEvictionStats(text []byte) (evictionStats, error) {
	st := evictionStats{latency: map[float64]float64{}, codes: map[string]float64{}}
	buckets, err := parseSamples(text, "apiserver_request_duration_seconds_bucket")
	if err != nil {
		return st, err
	}
	for _, s := range buckets {
		if s.labels["verb"] != "POST" || s.labels["resource"] != "pods" || s.labels["subresource"] != "eviction" {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			return st, fmt.Errorf("apiserver_request_duration_seconds_bucket le=%q: %w", s.labels["le"], err)
		}
		st.latency[le] += s.value
	}
	requests, err := parseSamples(text, "apiserver_request_total")
	if err != nil {
		return st, err
	}
	for _, s := range requests {
		switch {
		case s.labels["verb"] == "POST" && s.labels["resource"] == "pods" && s.labels["subresource"] == "eviction":
			st.codes[s.labels["code"]] += s.value
		case s.labels["verb"] == "PUT" && s.labels["resource"] == "poddisruptionbudgets" && s.labels["subresource"] == "status":
			st.statusWrites += s.value
			if s.labels["code"] == "409" {
				st.conflicts += s.value
			}
		}
	}
	return st, nil
}

// minus returns the stats of the requests served since before.
func (st evictionStats) minus(before evictionStats) evictionStats {
	out := evictionStats{latency: map[float64]float64{}, codes: map[string]float64{},
		statusWrites: st.statusWrites - before.statusWrites, conflicts: st.conflicts - before.conflicts}
	for le, v := range st.latency {
		out.latency[le] = v - before.latency[le]
	}
	for code, v := range st.codes {
		if d := v - before.codes[code]; d != 0 {
			out.codes[code] = d
		}
	}
	return out
}

// evictions is the number of eviction POSTs.
func (st evictionStats) evictions() float64 {
	n := 0.0
	for _, v := range st.codes {
		n += v
	}
	return n
}

// quantile returns the bucket bound under which a share q of the evictions
// finished (+Inf when the last bucket is needed), 0 without evictions.
func (st evictionStats) quantile(q float64) float64 {
	total := st.latency[math.Inf(1)]
	if total == 0 {
		return 0
	}
	bounds := make([]float64, 0, len(st.latency))
	for le := range st.latency {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	for _, le := range bounds {
		if st.latency[le] >= q*total {
			return le
		}
	}
	return math.Inf(1)
}
