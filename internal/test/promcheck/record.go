package promcheck

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
)

// recordingName is Prometheus's level:metric:operations convention for
// recorded series, with gpuhealth as the level: snake_case metric and
// operations parts (https://prometheus.io/docs/practices/rules/).
var recordingName = regexp.MustCompile(`^gpuhealth:[a-z]([a-z0-9_]*[a-z0-9])?:[a-z]([a-z0-9_]*[a-z0-9])?$`)

// CheckRecordingName says why name is not a gpuhealth recorded series'
// name (gpuhealth:<metric>:<operations>, snake_case parts), or returns nil.
func CheckRecordingName(name string) error {
	if !recordingName.MatchString(name) {
		return fmt.Errorf("recording rule %q: want gpuhealth:<metric>:<operations> with snake_case parts", name)
	}
	return nil
}

// Recorder evaluates recording rules step by step into a storage, as
// Prometheus's rule manager does for one group: the rules in order at one
// evaluation time, each one's samples committed before the next runs (so a
// rule reads the ones above it), and a stale marker for every series a rule
// returned last time and no longer returns (so it ends at once instead of
// lingering for the lookback delta). The zero value is not usable; call
// NewRecorder.
type Recorder struct {
	rules []*rules.RecordingRule
	// last holds, per rule, the series it returned at the previous Eval,
	// by their labels' string.
	last []map[string]labels.Labels
}

// NewRecorder parses the recording rules rs (alerts are refused).
func NewRecorder(rs []rulefmt.Rule) (*Recorder, error) {
	r := &Recorder{}
	for _, rule := range rs {
		if rule.Record == "" {
			return nil, fmt.Errorf("alert %s is not a recording rule", rule.Alert)
		}
		expr, err := Parser.ParseExpr(rule.Expr)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", rule.Record, err)
		}
		r.rules = append(r.rules, rules.NewRecordingRule(rule.Record, expr, labels.FromMap(rule.Labels)))
		r.last = append(r.last, map[string]labels.Labels{})
	}
	return r, nil
}

// Eval evaluates every rule at ts with query and appends the results to
// app.
func (r *Recorder) Eval(ctx context.Context, query rules.QueryFunc, app storage.Appendable, ts time.Time) error {
	stale := math.Float64frombits(value.StaleNaN)
	for i, rule := range r.rules {
		vector, err := rule.Eval(ctx, 0, ts, query, nil, 0)
		if err != nil {
			return fmt.Errorf("evaluating %s at %s: %w", rule.Name(), ts.UTC().Format(time.RFC3339), err)
		}
		a := app.Appender(ctx)
		seen := make(map[string]labels.Labels, len(vector))
		for _, s := range vector {
			seen[s.Metric.String()] = s.Metric
			if _, err := a.Append(0, s.Metric, s.T, s.F); err != nil {
				_ = a.Rollback()
				return fmt.Errorf("appending %s: %w", s.Metric, err)
			}
		}
		for key, l := range r.last[i] {
			if _, ok := seen[key]; ok {
				continue
			}
			if _, err := a.Append(0, l, ts.UnixMilli(), stale); err != nil {
				_ = a.Rollback()
				return fmt.Errorf("marking %s stale: %w", l, err)
			}
		}
		if err := a.Commit(); err != nil {
			return fmt.Errorf("committing %s: %w", rule.Name(), err)
		}
		r.last[i] = seen
	}
	return nil
}

// Record evaluates the recording rules rs into app at every step from
// start to end, both included.
func Record(ctx context.Context, query rules.QueryFunc, app storage.Appendable, rs []rulefmt.Rule, start, end time.Time, step time.Duration) error {
	if step <= 0 {
		return fmt.Errorf("step %s: want a positive step", step)
	}
	r, err := NewRecorder(rs)
	if err != nil {
		return err
	}
	for ts := start; !ts.After(end); ts = ts.Add(step) {
		if err := r.Eval(ctx, query, app, ts); err != nil {
			return err
		}
	}
	return nil
}
