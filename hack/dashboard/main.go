// Command dashboard draws a row of the Grafana dashboard
// (config/grafana/gpuhealth-dashboard.json, the Goodput row by default)
// from a metrics recording (internal/test/recording; the end-to-end suite records
// the operator's), without Prometheus or Grafana: it loads the recorded
// scrapes into a Prometheus TSDB as a scrape loop would, evaluates the
// recording rules of config/prometheus/rules.yaml over the run at the
// recording's scrape interval as Prometheus's rule manager would, runs
// each panel's queries over the run as range queries, and plots every
// panel (line charts, titled as in Grafana, time in minutes from the
// recording's start) into one PNG grid. A panel without data says so.
//
//	go run ./hack/dashboard -in _output/e2e/operator-metrics.txt -out docs/dashboard.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	in := flag.String("in", "", "the metrics recording (make e2e leaves one in _output/e2e/operator-metrics.txt)")
	out := flag.String("out", "docs/dashboard.png", "the PNG to write")
	row := flag.String("row", "Goodput", "the dashboard row whose panels to draw")
	step := flag.Duration("step", 0, "the rule evaluation and query step; 0 takes the recording's scrape interval")
	flag.Parse()
	if *in == "" {
		fmt.Fprintln(os.Stderr, "usage: dashboard -in RECORDING [-out PNG] [-row TITLE] [-step DURATION]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	res, err := run(ctx, options{in: *in, out: *out, row: *row, step: *step})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	fmt.Printf("drew %d panels of row %q (%d with data) over %s at a %s step from %s into %s\n",
		res.panels, *row, res.withData, res.span.Round(time.Second), res.step, *in, *out)
}
