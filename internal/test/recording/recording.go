// Package recording writes and reads a metrics recording: the gpuhealth_
// samples of a /metrics endpoint scraped again and again, one sample a
// line, as the end-to-end suite records the operator
// (e2e/framework.MetricsRecorder) and hack/dashboard draws it.
//
// The file is text. Its first line is Header; then each scrape is its
// samples, one a line as `<unix-ms> <series> <value>` (the series in the
// exposition format's notation, name{label="value",…}; the value as Go's
// strconv writes a float64, NaN and ±Inf included), followed by the line
// `<unix-ms> up 1`, or only `<unix-ms> up 0` for a scrape that failed:
// Prometheus's own `up` series. All lines of one scrape carry its start
// time. Lines starting with # are comments.
package recording

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
)

// Header is a recording's first line.
const Header = "# gpuhealth metrics recording v1: <unix-ms> <series> <value> per sample; <unix-ms> up 1|0 ends each scrape"

// Prefix is the name prefix of the metric families a recording keeps.
const Prefix = "gpuhealth_"

// Up is the series that ends each scrape: 1 when it succeeded, 0 when it
// failed.
const Up = "up"

// Writer writes a recording. Writes are buffered; Flush after each scrape
// to have the file usable while it grows.
type Writer struct {
	w      *bufio.Writer
	header bool
	line   []byte
}

// NewWriter returns a Writer that writes a recording to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w)}
}

// WriteScrape writes the samples of a scrape at ts (Parse's), then
// `up 1`.
func (w *Writer) WriteScrape(ts time.Time, samples []Sample) error {
	ms := ts.UnixMilli()
	for _, s := range samples {
		if err := w.write(ms, s.Labels, s.V); err != nil {
			return err
		}
	}
	return w.write(ms, labels.FromStrings(model.MetricNameLabel, Up), 1)
}

// WriteFailed writes a scrape at ts that failed: `up 0` and no sample.
func (w *Writer) WriteFailed(ts time.Time) error {
	return w.write(ts.UnixMilli(), labels.FromStrings(model.MetricNameLabel, Up), 0)
}

// Flush writes what is buffered.
func (w *Writer) Flush() error { return w.w.Flush() }

func (w *Writer) write(ms int64, l labels.Labels, v float64) error {
	if !w.header {
		if _, err := w.w.WriteString(Header + "\n"); err != nil {
			return err
		}
		w.header = true
	}
	b := strconv.AppendInt(w.line[:0], ms, 10)
	b = append(b, ' ')
	b = appendSeries(b, l)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	b = append(b, '\n')
	w.line = b
	_, err := w.w.Write(b)
	return err
}

// appendSeries appends l as name{label="value",…}, values quoted as PromQL
// reads them back.
func appendSeries(b []byte, l labels.Labels) []byte {
	b = append(b, l.Get(model.MetricNameLabel)...)
	b = append(b, '{')
	first := true
	l.Range(func(lb labels.Label) {
		if lb.Name == model.MetricNameLabel {
			return
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, lb.Name...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, lb.Value)
	})
	return append(b, '}')
}

// Sample is one sample of a scrape.
type Sample struct {
	Labels labels.Labels
	V      float64
}

// Parse returns the samples of the gpuhealth_ families of body, in the
// Prometheus text exposition format, in body's order. A classic histogram
// or summary is its _bucket (or quantile), _sum and _count series.
// Timestamps in body are ignored: a sample is taken at the scrape's time,
// as Prometheus does without honor_timestamps.
func Parse(body []byte) ([]Sample, error) {
	p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
	var out []Sample
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parsing the exposition: %w", err)
		}
		if entry != textparse.EntrySeries {
			continue
		}
		var l labels.Labels
		p.Labels(&l)
		if !strings.HasPrefix(l.Get(model.MetricNameLabel), Prefix) {
			continue
		}
		_, _, v := p.Series()
		out = append(out, Sample{Labels: l, V: v})
	}
}

// Scrape is one scrape of a recording.
type Scrape struct {
	// T is when it started, in Unix milliseconds.
	T int64
	// Up is false for a scrape that failed (it has no samples).
	Up      bool
	Samples []Sample
}

// Time is the scrape's start.
func (s Scrape) Time() time.Time { return time.UnixMilli(s.T).UTC() }

// metricParser reads a line's series back.
var metricParser = parser.NewParser(parser.Options{})

// Read parses a recording into its scrapes, in order. Samples after the
// last `up` line (a recording cut short) make a last scrape of their own.
func Read(r io.Reader) ([]Scrape, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	var out []Scrape
	cur := Scrape{T: math.MinInt64}
	n := 0
	// Scrapes repeat the same series: parse each once.
	seen := map[string]labels.Labels{}
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ms, l, v, err := parseLine(line, seen)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if cur.T != ms && len(cur.Samples) > 0 {
			out = append(out, Scrape{T: cur.T, Up: true, Samples: cur.Samples})
			cur.Samples = nil
		}
		cur.T = ms
		if l.Get(model.MetricNameLabel) == Up {
			out = append(out, Scrape{T: ms, Up: v == 1, Samples: cur.Samples})
			cur.Samples = nil
			continue
		}
		cur.Samples = append(cur.Samples, Sample{Labels: l, V: v})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(cur.Samples) > 0 {
		out = append(out, Scrape{T: cur.T, Up: true, Samples: cur.Samples})
	}
	return out, nil
}

// parseLine splits `<unix-ms> <series> <value>`; the series may hold
// spaces inside its quoted label values. seen caches parsed series.
func parseLine(line string, seen map[string]labels.Labels) (int64, labels.Labels, float64, error) {
	i, j := strings.IndexByte(line, ' '), strings.LastIndexByte(line, ' ')
	if i < 0 || j <= i {
		return 0, labels.EmptyLabels(), 0, fmt.Errorf("want <unix-ms> <series> <value>, got %q", line)
	}
	ms, err := strconv.ParseInt(line[:i], 10, 64)
	if err != nil {
		return 0, labels.EmptyLabels(), 0, fmt.Errorf("timestamp: %w", err)
	}
	v, err := strconv.ParseFloat(line[j+1:], 64)
	if err != nil {
		return 0, labels.EmptyLabels(), 0, fmt.Errorf("value: %w", err)
	}
	series := line[i+1 : j]
	if l, ok := seen[series]; ok {
		return ms, l, v, nil
	}
	l, err := metricParser.ParseMetric(series)
	if err != nil {
		return 0, labels.EmptyLabels(), 0, fmt.Errorf("series %q: %w", series, err)
	}
	seen[series] = l
	return ms, l, v, nil
}

// Loader appends scrapes to a storage as Prometheus's scrape loop would:
// each scrape's samples at its time, and a stale marker for every series
// the previous scrape had and this one lacks (every series, when the
// scrape failed), so a series that ends is gone at once rather than for
// the query lookback. The zero value is ready to use; feed it the scrapes
// in order.
type Loader struct {
	last map[string]labels.Labels
}

// Append appends one scrape to app.
func (l *Loader) Append(ctx context.Context, app storage.Appendable, s Scrape) error {
	a := app.Appender(ctx)
	seen := make(map[string]labels.Labels, len(s.Samples))
	for _, sm := range s.Samples {
		seen[sm.Labels.String()] = sm.Labels
		if _, err := a.Append(0, sm.Labels, s.T, sm.V); err != nil {
			_ = a.Rollback()
			return fmt.Errorf("appending %s at %d: %w", sm.Labels, s.T, err)
		}
	}
	stale := math.Float64frombits(value.StaleNaN)
	for key, lb := range l.last {
		if _, ok := seen[key]; ok {
			continue
		}
		if _, err := a.Append(0, lb, s.T, stale); err != nil {
			_ = a.Rollback()
			return fmt.Errorf("marking %s stale at %d: %w", lb, s.T, err)
		}
	}
	l.last = seen
	return a.Commit()
}
