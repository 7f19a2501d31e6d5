package recording

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// exposition is a scrape as client_golang writes it: HELP and TYPE lines,
// a gauge with a label value holding spaces and quotes, a histogram, and
// a library metric that a recording leaves out.
const exposition = `# HELP gpuhealth_node_gpus The nvidia.com/gpu allocatable of each managed node.
# TYPE gpuhealth_node_gpus gauge
gpuhealth_node_gpus{node="gpu-1"} 8
gpuhealth_node_gpus{node="a \"b\" c"} 4
# TYPE gpuhealth_node_repair_duration_seconds histogram
gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="60"} 0
gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="+Inf"} 1
gpuhealth_node_repair_duration_seconds_sum{action="ResetGPU",outcome="recertified"} 75.5
gpuhealth_node_repair_duration_seconds_count{action="ResetGPU",outcome="recertified"} 1
# TYPE workqueue_depth gauge
workqueue_depth{name="nodehealth"} 3
gpuhealth_quantile NaN
`

func TestWriteAndReadBack(t *testing.T) {
	g := NewWithT(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	t0 := time.UnixMilli(1_700_000_000_000)
	samples, err := Parse([]byte(exposition))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(samples).To(HaveLen(7), "the gpuhealth_ samples only")
	g.Expect(w.WriteScrape(t0, samples)).To(Succeed())
	g.Expect(w.WriteFailed(t0.Add(2 * time.Second))).To(Succeed())
	g.Expect(w.WriteScrape(t0.Add(4*time.Second), samples[:1])).To(Succeed())
	g.Expect(w.Flush()).To(Succeed())

	text := buf.String()
	g.Expect(text).To(HavePrefix(Header + "\n"))
	g.Expect(text).To(ContainSubstring("1700000000000 gpuhealth_node_gpus{node=\"gpu-1\"} 8\n"))
	g.Expect(text).To(ContainSubstring("1700000000000 up{} 1\n"))
	g.Expect(text).To(ContainSubstring("1700000002000 up{} 0\n"))
	g.Expect(text).NotTo(ContainSubstring("workqueue_depth"))

	scrapes, err := Read(strings.NewReader(text))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(scrapes).To(HaveLen(3))
	g.Expect(scrapes[0].T).To(Equal(t0.UnixMilli()))
	g.Expect(scrapes[0].Up).To(BeTrue())
	g.Expect(scrapes[0].Samples).To(HaveLen(7))
	g.Expect(scrapes[0].Samples[1].Labels.Get("node")).To(Equal(`a "b" c`))
	g.Expect(scrapes[0].Samples[2].Labels.Get("le")).To(Equal("60.0"), "normalised as Prometheus scrapes it")
	g.Expect(scrapes[0].Samples[4].V).To(Equal(75.5))
	g.Expect(math.IsNaN(scrapes[0].Samples[6].V)).To(BeTrue())
	g.Expect(scrapes[1].Up).To(BeFalse())
	g.Expect(scrapes[1].Samples).To(BeEmpty())
	g.Expect(scrapes[2].Time()).To(Equal(t0.Add(4 * time.Second).UTC()))
}

func TestParseRefusesABrokenExposition(t *testing.T) {
	_, err := Parse([]byte("gpuhealth_a{x=} 1\n"))
	NewWithT(t).Expect(err).To(HaveOccurred())
}

func TestReadKeepsARecordingCutShort(t *testing.T) {
	g := NewWithT(t)
	scrapes, err := Read(strings.NewReader(Header + "\n1000 gpuhealth_a{} 1\n1000 up{} 1\n3000 gpuhealth_a{} 2\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(scrapes).To(HaveLen(2))
	g.Expect(scrapes[1].Samples).To(HaveLen(1))
	g.Expect(scrapes[1].Up).To(BeTrue())
}

func TestReadRefusesBrokenLines(t *testing.T) {
	for _, line := range []string{"1000", "x gpuhealth_a{} 1", "1000 gpuhealth_a{} one", "1000 gpuhealth_a{b=} 1"} {
		_, err := Read(strings.NewReader(line + "\n"))
		NewWithT(t).Expect(err).To(HaveOccurred(), line)
	}
}

// TestLoaderMarksEndedSeriesStale: a series a scrape no longer has, and
// every series after a failed scrape, ends at once.
func TestLoaderMarksEndedSeriesStale(t *testing.T) {
	g := NewWithT(t)
	storage := promqltest.LoadedStorage(t, "")
	query := rules.EngineQueryFunc(promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000), storage)
	text := Header + "\n" +
		"0 gpuhealth_a{x=\"1\"} 1\n0 gpuhealth_a{x=\"2\"} 2\n0 up{} 1\n" +
		"2000 gpuhealth_a{x=\"1\"} 1\n2000 up{} 1\n" +
		"4000 up{} 0\n"
	scrapes, err := Read(strings.NewReader(text))
	g.Expect(err).NotTo(HaveOccurred())
	var l Loader
	for _, s := range scrapes {
		g.Expect(l.Append(context.Background(), storage, s)).To(Succeed())
	}
	count := func(ms int64) int {
		v, err := query(context.Background(), "gpuhealth_a", time.UnixMilli(ms))
		g.Expect(err).NotTo(HaveOccurred())
		return len(v)
	}
	g.Expect(count(1000)).To(Equal(2))
	g.Expect(count(3000)).To(Equal(1))
	g.Expect(count(5000)).To(Equal(0))
}
