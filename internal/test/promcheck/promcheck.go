// Package promcheck checks the PromQL the project ships (alert and
// recording rules in config/prometheus, the dashboard in config/grafana)
// against Prometheus's own parser and against the metrics gpuhealth really
// exports, so a renamed metric breaks a test instead of silently emptying a
// panel or an alert. It also evaluates the recording rules over stored
// series as Prometheus's rule manager would, for the tests and the
// dashboard picture (hack/dashboard).
package promcheck

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// External lists the metrics of libraries gpuhealth's processes register
// (controller-runtime, client-go's leader election and workqueues) that the
// shipped PromQL may use.
var External = map[string]bool{
	"leader_election_master_status":                true,
	"workqueue_depth":                              true,
	"workqueue_queue_duration_seconds":             true,
	"workqueue_work_duration_seconds":              true,
	"workqueue_retries_total":                      true,
	"controller_runtime_reconcile_total":           true,
	"controller_runtime_reconcile_errors_total":    true,
	"controller_runtime_reconcile_time_seconds":    true,
	"controller_runtime_active_workers":            true,
	"controller_runtime_max_concurrent_reconciles": true,
}

// histogramSuffixes are the series a histogram exports beside its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// metricName matches the Name of a prometheus.*Opts literal, or the name
// a custom collector's prometheus.NewDesc gives.
var metricName = regexp.MustCompile(`(?:Name:\s+|NewDesc\(\s*)"(gpuhealth_[a-z0-9_]+)"`)

// declaredNames returns the gpuhealth_* metric names the Go source src
// declares.
func declaredNames(src []byte) []string {
	var out []string
	for _, m := range metricName.FindAllSubmatch(src, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// RepoRoot is the repository's root, found from this file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Known returns the gpuhealth_* metric names declared in the non-test Go
// files of the operator's and the monitor's packages (prometheus.*Opts
// literals and custom collectors' descriptors), and the names the
// recording rules of config/prometheus/rules.yaml record (which alerts and
// panels read like any other metric).
func Known() (map[string]bool, error) {
	known, err := exportedNames()
	if err != nil {
		return nil, err
	}
	recording, err := RecordingRules()
	if err != nil {
		return nil, err
	}
	for _, r := range recording {
		known[r.Record] = true
	}
	return known, nil
}

// exportedNames returns the gpuhealth_* metric names declared in the
// non-test Go files of the operator's and the monitor's packages.
func exportedNames() (map[string]bool, error) {
	known := map[string]bool{}
	root := RepoRoot()
	for _, dir := range []string{"controllers", "monitors", "remediation", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, name := range declaredNames(b) {
				known[name] = true
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("no gpuhealth_ metric found under %s", root)
	}
	return known, nil
}

// Parser parses PromQL as a default Prometheus server does.
var Parser = parser.NewParser(parser.Options{})

// Metrics parses expr and returns the metric names its selectors name.
func Metrics(expr string) ([]string, error) {
	e, err := Parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
			seen[vs.Name] = true
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

// Unknown returns the metric names expr uses that no gpuhealth process
// exports.
func Unknown(expr string, known map[string]bool) ([]string, error) {
	names, err := Metrics(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if !exported(n, known) {
			out = append(out, n)
		}
	}
	return out, nil
}

func exported(name string, known map[string]bool) bool {
	return inSet(name, known) || Library(name)
}

// Library says whether name is a series of a library metric on the
// External list.
func Library(name string) bool { return inSet(name, External) }

// inSet says whether name, or the histogram it is a series of, is in set.
func inSet(name string, set map[string]bool) bool {
	if set[name] {
		return true
	}
	for _, s := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, s); ok && set[base] {
			return true
		}
	}
	return false
}

// RulesFile is the shipped PrometheusRule.
var RulesFile = filepath.Join(RepoRoot(), "config", "prometheus", "rules.yaml")

// Alerts returns the alerting rules of config/prometheus/rules.yaml, in
// file order.
func Alerts() ([]rulefmt.Rule, error) {
	return filterRules(func(r rulefmt.Rule) bool { return r.Alert != "" })
}

// RecordingRules returns the recording rules of
// config/prometheus/rules.yaml, in file order: the order Prometheus
// evaluates them in, so a rule may read the ones before it.
func RecordingRules() ([]rulefmt.Rule, error) {
	return filterRules(func(r rulefmt.Rule) bool { return r.Record != "" })
}

func filterRules(keep func(rulefmt.Rule) bool) ([]rulefmt.Rule, error) {
	all, err := Rules()
	if err != nil {
		return nil, err
	}
	var out []rulefmt.Rule
	for _, r := range all {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Rules reads config/prometheus/rules.yaml and returns all its rules, in
// file order, checked by Prometheus's own rule loader.
func Rules() ([]rulefmt.Rule, error) {
	path := RulesFile
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obj struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s: a %s %s, want a monitoring.coreos.com/v1 PrometheusRule", path, obj.APIVersion, obj.Kind)
	}
	spec, err := yaml.Marshal(obj.Spec)
	if err != nil {
		return nil, err
	}
	groups, errs := rulefmt.Parse(spec, false, model.LegacyValidation, Parser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %v", path, errs)
	}
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// DashboardFile is the shipped Grafana dashboard.
var DashboardFile = filepath.Join(RepoRoot(), "config", "grafana", "gpuhealth-dashboard.json")

// Query is one query of a dashboard panel: the title of the row the panel
// sits under ("" above the first row), the panel's title, type and unit
// (Grafana's, for example percentunit or s; "" when not set), the query's
// refId, expression and legend format as written.
type Query struct {
	Row, Panel, Type, Unit, RefID, Expr, Legend string
}

// DashboardQueries returns every query of the shipped dashboard, as written,
// in the dashboard's order.
func DashboardQueries() ([]Query, error) {
	b, err := os.ReadFile(DashboardFile)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title       string `json:"title"`
			Type        string `json:"type"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr   string `json:"expr"`
				RefID  string `json:"refId"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	var out []Query
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		for _, t := range p.Targets {
			out = append(out, Query{Row: row, Panel: p.Title, Type: p.Type, Unit: p.FieldConfig.Defaults.Unit, RefID: t.RefID, Expr: t.Expr, Legend: t.Legend})
		}
	}
	return out, nil
}

// Variable matches a Grafana variable reference in a query.
var Variable = regexp.MustCompile(`\$\{?(\w+)\}?`)

// Builtins are Grafana's own variables the queries may use, with the value
// Expand gives them.
var Builtins = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

// Expand replaces a query's variables as Grafana would with "All" selected.
func Expand(expr string) string {
	return Variable.ReplaceAllStringFunc(expr, func(m string) string {
		if v, ok := Builtins[Variable.FindStringSubmatch(m)[1]]; ok {
			return v
		}
		return ".*"
	})
}
