package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpuhealth/gpuhealth/internal/test/promcheck"
	"github.com/gpuhealth/gpuhealth/internal/test/recording"
)

// options are one drawing's inputs.
type options struct {
	// in is the recording, out the PNG written.
	in, out string
	// row is the title of the dashboard row whose panels are drawn.
	row string
	// step is the evaluation and query step; 0 takes the recording's
	// scrape interval.
	step time.Duration
}

// result says what a drawing held.
type result struct {
	panels, withData int
	span, step       time.Duration
}

// lookback is Prometheus's default query lookback delta; the recording's
// stale markers end a series before it.
const lookback = 5 * time.Minute

// run draws o.row of the shipped dashboard from the recording o.in into
// o.out.
func run(ctx context.Context, o options) (result, error) {
	scrapes, err := readRecording(o.in)
	if err != nil {
		return result{}, err
	}
	if len(scrapes) == 0 {
		return result{}, fmt.Errorf("%s holds no scrape", o.in)
	}
	queries, err := promcheck.DashboardQueries()
	if err != nil {
		return result{}, err
	}
	ps := rowPanels(queries, o.row)
	if len(ps) == 0 {
		return result{}, fmt.Errorf("the dashboard has no panel in row %q", o.row)
	}
	recordingRules, err := promcheck.RecordingRules()
	if err != nil {
		return result{}, err
	}
	step := o.step
	if step <= 0 {
		step = scrapeInterval(scrapes)
	}

	dir, err := os.MkdirTemp("", "gpuhealth-dashboard-")
	if err != nil {
		return result{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	db, err := openStorage(dir)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = db.Close() }()
	engine := newEngine(step)

	start, end := scrapes[0].Time(), scrapes[len(scrapes)-1].Time()
	if err := loadAndRecord(ctx, db, engine, scrapes, recordingRules, step); err != nil {
		return result{}, err
	}
	for i := range ps {
		if err := ps[i].query(ctx, engine, db, start, end, step); err != nil {
			return result{}, err
		}
	}
	f, err := os.Create(o.out)
	if err != nil {
		return result{}, err
	}
	if err := drawGrid(f, o.row, ps, end.Sub(start)); err != nil {
		_ = f.Close()
		return result{}, err
	}
	if err := f.Close(); err != nil {
		return result{}, err
	}
	res := result{panels: len(ps), span: end.Sub(start), step: step}
	for _, p := range ps {
		if len(p.series) > 0 {
			res.withData++
		}
	}
	return res, nil
}

func readRecording(path string) ([]recording.Scrape, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	scrapes, err := recording.Read(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return scrapes, nil
}

// scrapeInterval is the median time between the recording's scrapes (a
// few slow scrapes do not move it), at least a second; 15 s, Prometheus's
// default, for a recording of one scrape.
func scrapeInterval(scrapes []recording.Scrape) time.Duration {
	if len(scrapes) < 2 {
		return 15 * time.Second
	}
	d := make([]int64, 0, len(scrapes)-1)
	for i := 1; i < len(scrapes); i++ {
		d = append(d, scrapes[i].T-scrapes[i-1].T)
	}
	slices.Sort(d)
	// Whole seconds: Grafana's and Prometheus's steps are.
	return max(time.Duration(d[len(d)/2])*time.Millisecond, time.Second).Round(time.Second)
}

// openStorage opens an empty TSDB in dir that takes samples up to a day
// out of order, so rule results may land behind the scrapes.
func openStorage(dir string) (*tsdb.DB, error) {
	opts := tsdb.DefaultOptions()
	opts.RetentionDuration = 0
	opts.OutOfOrderTimeWindow = (24 * time.Hour).Milliseconds()
	return tsdb.Open(dir, slog.New(slog.DiscardHandler), nil, opts, nil)
}

func newEngine(step time.Duration) *promql.Engine {
	return promql.NewEngine(promql.EngineOpts{
		Logger:        slog.New(slog.DiscardHandler),
		MaxSamples:    50_000_000,
		Timeout:       10 * time.Minute,
		LookbackDelta: lookback,
		// A subquery without a step takes the evaluation step.
		NoStepSubqueryIntervalFn: func(int64) int64 { return step.Milliseconds() },
	})
}

// loadAndRecord interleaves the scrapes and the recording rules as a
// Prometheus server would: before each evaluation, from the first scrape
// every step to the last, the scrapes up to that time are in the storage.
func loadAndRecord(ctx context.Context, db storage.Storage, engine promql.QueryEngine, scrapes []recording.Scrape, rs []rulefmt.Rule, step time.Duration) error {
	recorder, err := promcheck.NewRecorder(rs)
	if err != nil {
		return err
	}
	query := rules.EngineQueryFunc(engine, db)
	var loader recording.Loader
	next := 0
	start, end := scrapes[0].Time(), scrapes[len(scrapes)-1].Time()
	for ts := start; !ts.After(end); ts = ts.Add(step) {
		for ; next < len(scrapes) && !scrapes[next].Time().After(ts); next++ {
			if err := loader.Append(ctx, db, scrapes[next]); err != nil {
				return err
			}
		}
		if err := recorder.Eval(ctx, query, db, ts); err != nil {
			return err
		}
	}
	for ; next < len(scrapes); next++ {
		if err := loader.Append(ctx, db, scrapes[next]); err != nil {
			return err
		}
	}
	return nil
}

// panel is one dashboard panel to draw: its queries and, once queried,
// its series.
type panel struct {
	title, unit string
	queries     []promcheck.Query
	series      []series
}

// series is one line of a panel: its legend and its points (minutes from
// the start, value).
type series struct {
	name   string
	points [][2]float64
}

// rowPanels groups the queries of the panels under row by panel, in the
// dashboard's order.
func rowPanels(qs []promcheck.Query, row string) []panel {
	var out []panel
	for _, q := range qs {
		if q.Row != row {
			continue
		}
		if n := len(out); n == 0 || out[n-1].title != q.Panel {
			out = append(out, panel{title: q.Panel, unit: q.Unit})
		}
		out[len(out)-1].queries = append(out[len(out)-1].queries, q)
	}
	return out
}

// query runs the panel's queries over [start, end] at step, as Grafana's
// range queries do, into p.series.
func (p *panel) query(ctx context.Context, engine promql.QueryEngine, db storage.Queryable, start, end time.Time, step time.Duration) error {
	for _, q := range p.queries {
		rq, err := engine.NewRangeQuery(ctx, db, nil, promcheck.Expand(q.Expr), start, end, step)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", p.title, q.RefID, err)
		}
		res := rq.Exec(ctx)
		if res.Err != nil {
			rq.Close()
			return fmt.Errorf("%s/%s: %w", p.title, q.RefID, res.Err)
		}
		// A range query's result is always a matrix.
		m, err := res.Matrix()
		if err != nil {
			rq.Close()
			return fmt.Errorf("%s/%s: %w", p.title, q.RefID, err)
		}
		sort.Sort(m)
		for _, s := range m {
			line := series{name: legend(q.Legend, s.Metric)}
			for _, pt := range s.Floats {
				if math.IsNaN(pt.F) || math.IsInf(pt.F, 0) {
					continue
				}
				line.points = append(line.points, [2]float64{float64(pt.T-start.UnixMilli()) / 60_000, pt.F})
			}
			if len(line.points) > 0 {
				p.series = append(p.series, line)
			}
		}
		rq.Close()
	}
	return nil
}

// templateVar matches a legend format's {{label}}.
var templateVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legend renders a Grafana legend format for a series: each {{label}}
// becomes the label's value; an empty format (or one that renders to
// nothing) is the series' labels.
func legend(format string, l labels.Labels) string {
	out := strings.Join(strings.Fields(templateVar.ReplaceAllStringFunc(format, func(m string) string {
		return l.Get(templateVar.FindStringSubmatch(m)[1])
	})), " ")
	if out == "" {
		out = l.DropReserved(func(n string) bool { return n == model.MetricNameLabel }).String()
	}
	return out
}
