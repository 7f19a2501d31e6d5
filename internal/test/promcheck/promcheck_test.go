package promcheck

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

func TestKnownFindsTheExportedMetrics(t *testing.T) {
	g := NewWithT(t)
	known, err := Known()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(known).To(HaveKey("gpuhealth_nodehealth_phase"), "operator")
	g.Expect(known).To(HaveKey("gpuhealth_monitor_publish_latency_seconds"), "monitor")
	g.Expect(known).NotTo(HaveKey("gpuhealth_nodehealth_phases"))
}

func TestUnknown(t *testing.T) {
	g := NewWithT(t)
	known := map[string]bool{"gpuhealth_a": true, "gpuhealth_h_seconds": true}
	got, err := Unknown(`sum(rate(gpuhealth_h_seconds_bucket[5m])) + gpuhealth_a + gpuhealth_typo + workqueue_depth`, known)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal([]string{"gpuhealth_typo"}))
	_, err = Unknown(`sum(gpuhealth_a`, known)
	g.Expect(err).To(HaveOccurred())
}

func TestKnownHasTheRecordedSeries(t *testing.T) {
	g := NewWithT(t)
	known, err := Known()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(known).To(HaveKey("gpuhealth:goodput:ratio_avg1h"))
}

func TestRulesSplitIntoAlertsAndRecordingRules(t *testing.T) {
	g := NewWithT(t)
	all, err := Rules()
	g.Expect(err).NotTo(HaveOccurred())
	alerts, err := Alerts()
	g.Expect(err).NotTo(HaveOccurred())
	recording, err := RecordingRules()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(alerts).NotTo(BeEmpty())
	g.Expect(recording).NotTo(BeEmpty())
	g.Expect(len(alerts) + len(recording)).To(Equal(len(all)))
	for _, r := range alerts {
		g.Expect(r.Record).To(BeEmpty())
	}
}

func TestCheckRecordingName(t *testing.T) {
	cases := []struct {
		name, record string
		ok           bool
	}{
		{name: "level, metric and operations", record: "gpuhealth:node_gpus:sum", ok: true},
		{name: "operations with a window", record: "gpuhealth:goodput:ratio_avg1h", ok: true},
		{name: "another level", record: "job:node_gpus:sum"},
		{name: "no operations", record: "gpuhealth:node_gpus"},
		{name: "four parts", record: "gpuhealth:node:gpus:sum"},
		{name: "camel case", record: "gpuhealth:nodeGPUs:sum"},
		{name: "a trailing underscore", record: "gpuhealth:node_gpus_:sum"},
		{name: "a plain metric name", record: "gpuhealth_node_gpus"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckRecordingName(c.record)
			if c.ok {
				NewWithT(t).Expect(err).NotTo(HaveOccurred())
			} else {
				NewWithT(t).Expect(err).To(HaveOccurred())
			}
		})
	}
}

// TestRecordChainsRulesAndMarksStale: a rule reads the one above it at
// the same evaluation time, and a series a rule stops returning ends at
// once instead of lingering for the lookback delta.
func TestRecordChainsRulesAndMarksStale(t *testing.T) {
	g := NewWithT(t)
	storage := promqltest.LoadedStorage(t, "load 1m\n\tgpuhealth_a{x=\"1\"} 1x5 stale\n\tgpuhealth_a{x=\"2\"} 2x10\n")
	query := rules.EngineQueryFunc(promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000), storage)
	rs := []rulefmt.Rule{
		{Record: "gpuhealth:a:sum_by_x", Expr: "sum by (x) (gpuhealth_a)"},
		{Record: "gpuhealth:a:sum", Expr: "sum(gpuhealth:a:sum_by_x)"},
	}
	start := time.Unix(0, 0).UTC()
	g.Expect(Record(context.Background(), query, storage, rs, start, start.Add(10*time.Minute), time.Minute)).To(Succeed())
	at := func(expr string, m time.Duration) []float64 {
		v, err := query(context.Background(), expr, start.Add(m*time.Minute))
		g.Expect(err).NotTo(HaveOccurred())
		var out []float64
		for _, s := range v {
			out = append(out, s.F)
		}
		return out
	}
	g.Expect(at("gpuhealth:a:sum", 0)).To(Equal([]float64{3}), "the second rule read the first at the same time")
	g.Expect(at("gpuhealth:a:sum", 7)).To(Equal([]float64{2}))
	g.Expect(at(`gpuhealth:a:sum_by_x{x="1"}`, 7)).To(BeEmpty(), "stale at once")

	_, err := NewRecorder([]rulefmt.Rule{{Alert: "A", Expr: "up"}})
	g.Expect(err).To(HaveOccurred())
	g.Expect(Record(context.Background(), query, storage, rs, start, start, 0)).NotTo(Succeed())
}

func TestDashboardQueriesKnowTheirRow(t *testing.T) {
	g := NewWithT(t)
	qs, err := DashboardQueries()
	g.Expect(err).NotTo(HaveOccurred())
	rows := map[string]int{}
	for _, q := range qs {
		g.Expect(q.Row).NotTo(BeEmpty(), q.Panel)
		g.Expect(q.Type).NotTo(Equal("row"))
		rows[q.Row]++
	}
	g.Expect(rows).To(HaveKey("Goodput"))
	g.Expect(rows).To(HaveKey("Fleet"))
}

func TestDeclaredNames(t *testing.T) {
	g := NewWithT(t)
	src := []byte(`
	a = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_a",
	}, nil)
	b = prometheus.NewDesc("gpuhealth_b", "help", nil, nil)
	c = prometheus.NewDesc(
		"gpuhealth_c", "help", nil, nil)
	d = prometheus.GaugeOpts{Name: "other_d"}
	e = fmt.Sprint("gpuhealth_e")`)
	g.Expect(declaredNames(src)).To(Equal([]string{"gpuhealth_a", "gpuhealth_b", "gpuhealth_c"}))
}
