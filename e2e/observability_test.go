//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"

	"github.com/gpuhealth/gpuhealth/internal/test/promcheck"
)

// testShippedQueriesReadTheRealMetrics runs after the scenarios: it
// scrapes the real operator and monitors, loads what they export into
// Prometheus's engine (the monitors' series with the `node` label the
// shipped PodMonitor adds), evaluates the recording rules over it every
// minute, and runs every alert and every dashboard query over the result.
// Every metric an alert names must be exported (or recorded from exported
// ones) by now, and every dashboard query must return data, except the few
// that need an event the suite does not cause.
func testShippedQueriesReadTheRealMetrics(t *testing.T) {
	// Polled: a metric a controller publishes on its first pass may be a
	// scrape away.
	NewWithT(t).Eventually(func(g Gomega) { queriesReadMetrics(t, g) }).WithTimeout(time.Minute).WithPolling(5 * time.Second).Should(Succeed())
}

func queriesReadMetrics(t *testing.T, g Gomega) {
	t.Helper()
	var load strings.Builder
	load.WriteString("load 1m\n")
	exported := map[string]bool{}
	add := func(addr, node string) {
		body, err := scrape(addr)
		g.Expect(err).NotTo(HaveOccurred())
		for _, line := range strings.Split(body, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			series, value := line[:i], line[i+1:]
			v, err := strconv.ParseFloat(value, 64)
			g.Expect(err).NotTo(HaveOccurred(), line)
			name, _, _ := strings.Cut(series, "{")
			if !ours(name) || v != v { // NaN: a quantile of nothing
				continue
			}
			exported[name] = true
			if node != "" {
				if strings.Contains(series, "{") {
					series = strings.Replace(series, "{", fmt.Sprintf(`{node=%q,`, node), 1)
				} else {
					series += fmt.Sprintf(`{node=%q}`, node)
				}
			}
			fmt.Fprintf(&load, "\t%s %sx10\n", series, strconv.FormatFloat(v, 'f', -1, 64))
		}
	}
	add(env.Operator.Metrics, "")
	for node, m := range env.Monitors {
		add(m.Metrics, node)
	}
	storage := promqltest.LoadedStorage(t, load.String())
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 10_000_000)
	at := time.Unix(0, 0).UTC().Add(10 * time.Minute)
	query := rules.EngineQueryFunc(engine, storage)
	run := func(expr string) (int, error) {
		v, err := query(context.Background(), expr, at)
		return len(v), err
	}

	recording, err := promcheck.RecordingRules()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(promcheck.Record(context.Background(), query, storage, recording, time.Unix(0, 0).UTC(), at, time.Minute)).To(Succeed())
	for _, r := range recording {
		if n, err := run(r.Record); err == nil && n > 0 {
			exported[r.Record] = true
		}
	}

	// Metrics with a series only while something is wrong, which the
	// suite has put right by its end (or never makes).
	onlyWhileWrong := map[string]string{
		"gpuhealth_node_drift": "one series per drifted property; none when the pools agree",
		// NICPortDownCycle's fake adapters count no errors.
		"gpuhealth_monitor_nic_error_rate": "a series per counter only while it rises",
	}
	alerts, err := promcheck.Alerts()
	g.Expect(err).NotTo(HaveOccurred())
	for _, r := range alerts {
		_, err := run(r.Expr)
		g.Expect(err).NotTo(HaveOccurred(), r.Alert)
		names, err := promcheck.Metrics(r.Expr)
		g.Expect(err).NotTo(HaveOccurred())
		for _, n := range names {
			if _, ok := onlyWhileWrong[n]; ok {
				continue
			}
			g.Expect(exported).To(HaveKey(n), "%s reads %s, which the running processes export", r.Alert, n)
		}
	}

	// Queries that are empty until something the suite does not cause.
	mayBeEmpty := map[string]string{
		"Nodes not Healthy/A":                   "every node may be Healthy when the suite ends",
		"Nodes out of service/A":                "every node may be Healthy when the suite ends (a node has only its current phase's series)",
		"Spooled findings and publish errors/B": "no write to the apiserver failed",
		"GPUs out of service by phase/A":        "every node may be in service when the suite ends",
		"GPUs out of service by cause/A":        "every node may be in service when the suite ends",
		"GPUs out of service per node/A":        "every node may be in service when the suite ends",
		"GPU-hours lost (24h) by cause/A":       "only the last scrape is loaded: no GPU-hours when every node is in service then",
		"Stranded GPUs/B":                       "no ComputeDomain may be short of a member when the suite ends",
		// NICPortDownCycle put gpu-node-1's compute port back up.
		"Compute ports down/A":                              "every compute port is up when the suite ends",
		"Compute ports down or below their rate/A":          "every compute port is up and at its rate when the suite ends",
		"Compute ports down or below their rate/B":          "every compute port is up and at its rate when the suite ends",
		"Compute ports down or below their rate/C":          "every compute port is up and at its rate when the suite ends",
		"Port flaps in window (10 most)/A":                  "the one down may have left the flap window (10m) by the end",
		"Error counter rates (3 worst ports per counter)/A": "the fake adapters count no errors",
		// The last scrape is loaded as constant series, so no repair is an
		// increase within the window.
		"Time to repair (7d)/A": "the loaded histogram does not grow",
		"Time to repair (7d)/B": "the loaded histogram does not grow",
		"Time to repair (7d)/C": "the loaded histogram does not grow",
		"Time to repair (7d)/D": "the loaded histogram does not grow",
		// The slow-GPU row shows trouble the suite's idle GPUs do not
		// have when it ends (and the loaded clocks counter does not grow).
		"Clocks held down/A":                           "the loaded counter does not grow",
		"Busy GPUs on a PCIe link below its maximum/A": "the suite's GPUs idle",
		"Busy GPUs on a PCIe link below its maximum/B": "the suite's GPUs idle",
		"Row remaps pending or failed/A":               "no remap is pending in the suite",
		"Stack drift: outliers/A":                      "no node drifts when the suite ends",
	}
	queries, err := promcheck.DashboardQueries()
	g.Expect(err).NotTo(HaveOccurred())
	for _, q := range queries {
		key := q.Panel + "/" + q.RefID
		n, err := run(promcheck.Expand(q.Expr))
		g.Expect(err).NotTo(HaveOccurred(), key)
		if _, ok := mayBeEmpty[key]; !ok {
			g.Expect(n).To(BeNumerically(">", 0), "dashboard panel %s returns data from the real metrics: %s", key, q.Expr)
		}
	}
}

// ours says whether a metric is one the shipped rules and dashboard may
// read (gpuhealth's own and the controller libraries').
func ours(name string) bool {
	return strings.HasPrefix(name, "gpuhealth_") || promcheck.Library(name)
}

func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:gosec // a test URL on localhost
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", addr, resp.Status)
	}
	return string(b), err
}
