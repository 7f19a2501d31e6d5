package main

import (
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"gonum.org/v1/plot/vg"

	"github.com/gpuhealth/gpuhealth/internal/test/promcheck"
	"github.com/gpuhealth/gpuhealth/internal/test/recording"
)

// writeRecording writes a recording of minutes minutes, a scrape every 10
// s, of what scrape(minute) returns (the exposition format), and returns
// its path.
func writeRecording(t *testing.T, minutes int, scrape func(m float64) string) string {
	t.Helper()
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "operator-metrics.txt")
	f, err := os.Create(path)
	g.Expect(err).NotTo(HaveOccurred())
	w := recording.NewWriter(f)
	start := time.UnixMilli(1_700_000_000_000)
	for s := 0; s <= minutes*60; s += 10 {
		ts := start.Add(time.Duration(s) * time.Second)
		if s == 120 {
			g.Expect(w.WriteFailed(ts)).To(Succeed(), "the operator restarting")
			continue
		}
		samples, err := recording.Parse([]byte(scrape(float64(s) / 60)))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.WriteScrape(ts, samples)).To(Succeed())
	}
	g.Expect(w.Flush()).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
	return path
}

// fleet is four nodes of eight GPUs; gpu-1 is out for an XID 79 from
// minute 5 to 10 (quarantined, then recertifying), stranding 24 GPUs of
// its ComputeDomain, and its repair is observed at minute 10.
func fleet(m float64) string {
	var b strings.Builder
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&b, "gpuhealth_node_gpus{node=\"gpu-%d\"} 8\n", i)
	}
	switch {
	case m >= 5 && m < 7:
		b.WriteString(`gpuhealth_node_gpus_out_of_service{node="gpu-1",phase="Quarantined",cause="fault",check="XID",code="79"} 8` + "\n")
	case m >= 7 && m < 10:
		b.WriteString(`gpuhealth_node_gpus_out_of_service{node="gpu-1",phase="Recertifying",cause="fault",check="XID",code="79"} 8` + "\n")
	}
	if m >= 5 && m < 10 {
		b.WriteString(`gpuhealth_computedomain_stranded_gpus{computedomain="team-a/train"} 24` + "\n")
	}
	repaired := 0
	if m >= 10 {
		repaired = 1
	}
	for _, le := range []string{"60", "600", "+Inf"} {
		fmt.Fprintf(&b, "gpuhealth_node_repair_duration_seconds_bucket{action=\"ResetGPU\",outcome=\"recertified\",le=%q} %d\n", le, repaired)
	}
	return b.String()
}

func goodputPanels(t *testing.T) int {
	t.Helper()
	qs, err := promcheck.DashboardQueries()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return len(rowPanels(qs, "Goodput"))
}

// TestDrawsTheGoodputRow: a 20-minute recording becomes one PNG with a
// tile for each panel of the Goodput row, each with data.
func TestDrawsTheGoodputRow(t *testing.T) {
	g := NewWithT(t)
	in := writeRecording(t, 20, fleet)
	out := filepath.Join(t.TempDir(), "dashboard.png")
	res, err := run(context.Background(), options{in: in, out: out, row: "Goodput"})
	g.Expect(err).NotTo(HaveOccurred())
	n := goodputPanels(t)
	g.Expect(n).To(BeNumerically(">=", 6))
	g.Expect(res.panels).To(Equal(n))
	g.Expect(res.step).To(Equal(10 * time.Second))
	g.Expect(res.span).To(Equal(20 * time.Minute))
	g.Expect(res.withData).To(Equal(n), "every panel of the row has data")

	f, err := os.Open(out)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	img, err := png.Decode(f)
	g.Expect(err).NotTo(HaveOccurred())
	rows := (n + columns - 1) / columns
	g.Expect(img.Bounds().Dx()).To(Equal(int(columns * tileWidth / 72 * dpi)))
	g.Expect(img.Bounds().Dy()).To(Equal(int((vg.Length(rows)*tileHeight + titleHeight) / 72 * dpi)))
}

// TestDrawsPanelsWithoutData: a recording without the goodput metrics
// still draws every panel, each saying "no data".
func TestDrawsPanelsWithoutData(t *testing.T) {
	g := NewWithT(t)
	in := writeRecording(t, 3, func(float64) string { return "gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Healthy\"} 1\n" })
	out := filepath.Join(t.TempDir(), "dashboard.png")
	res, err := run(context.Background(), options{in: in, out: out, row: "Goodput"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.panels).To(Equal(goodputPanels(t)))
	g.Expect(res.withData).To(BeZero())
	st, err := os.Stat(out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Size()).To(BeNumerically(">", 0))
}

func TestRunRefusesBadInput(t *testing.T) {
	g := NewWithT(t)
	out := filepath.Join(t.TempDir(), "dashboard.png")
	_, err := run(context.Background(), options{in: filepath.Join(t.TempDir(), "missing.txt"), out: out, row: "Goodput"})
	g.Expect(err).To(HaveOccurred())
	empty := filepath.Join(t.TempDir(), "empty.txt")
	g.Expect(os.WriteFile(empty, []byte(recording.Header+"\n"), 0o600)).To(Succeed())
	_, err = run(context.Background(), options{in: empty, out: out, row: "Goodput"})
	g.Expect(err).To(MatchError(ContainSubstring("no scrape")))
	in := writeRecording(t, 1, fleet)
	_, err = run(context.Background(), options{in: in, out: out, row: "No such row"})
	g.Expect(err).To(MatchError(ContainSubstring("no panel")))
}

func TestLegend(t *testing.T) {
	cases := []struct {
		name, format, want string
		labels             labels.Labels
	}{
		{name: "labels replaced", format: "{{cause}} {{check}} {{code}}", want: "fault XID 79",
			labels: labels.FromStrings("cause", "fault", "check", "XID", "code", "79")},
		{name: "missing labels leave no gaps", format: "{{cause}} {{check}} {{code}}", want: "maintenance",
			labels: labels.FromStrings("cause", "maintenance")},
		{name: "plain text", format: "p50", want: "p50", labels: labels.EmptyLabels()},
		{name: "no format: the labels", format: "", want: `{node="gpu-1"}`,
			labels: labels.FromStrings(model.MetricNameLabel, "gpuhealth_x", "node", "gpu-1")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			NewWithT(t).Expect(legend(c.format, c.labels)).To(Equal(c.want))
		})
	}
}

func TestSegmentsBreakAtGaps(t *testing.T) {
	g := NewWithT(t)
	pts := [][2]float64{{0, 1}, {1, 1}, {2, 1}, {5, 2}, {6, 2}}
	g.Expect(segments(pts)).To(Equal([][][2]float64{{{0, 1}, {1, 1}, {2, 1}}, {{5, 2}, {6, 2}}}))
	g.Expect(segments(pts[:1])).To(HaveLen(1))
}

func TestScrapeInterval(t *testing.T) {
	g := NewWithT(t)
	at := func(ms ...int64) []recording.Scrape {
		var out []recording.Scrape
		for _, m := range ms {
			out = append(out, recording.Scrape{T: m})
		}
		return out
	}
	g.Expect(scrapeInterval(at(0, 2000, 4010, 6000, 30000))).To(Equal(2*time.Second), "the median, not a slow scrape")
	g.Expect(scrapeInterval(at(0, 100, 200))).To(Equal(time.Second), "at least a second")
	g.Expect(scrapeInterval(at(0))).To(Equal(15 * time.Second))
}
