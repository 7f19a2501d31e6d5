package framework

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/internal/test/recording"
)

// TestMetricsRecorderRecordsScrapesAndFailures: the recorder keeps the
// gpuhealth_ samples of each scrape, records a failed scrape as up 0, and
// its file reads back after Stop and in its copy.
func TestMetricsRecorderRecordsScrapesAndFailures(t *testing.T) {
	g := NewWithT(t)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) == 2 {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("# TYPE gpuhealth_node_gpus gauge\ngpuhealth_node_gpus{node=\"gpu-1\"} 8\nworkqueue_depth 1\n"))
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	// A scrape slower than the interval counts as failed: 100 ms leaves a
	// loaded machine room to answer a local request in time.
	r, err := RecordMetrics(strings.TrimPrefix(srv.URL, "http://"), filepath.Join(dir, "metrics.txt"), 100*time.Millisecond)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(n.Load).WithTimeout(5 * time.Second).Should(BeNumerically(">=", 4))
	g.Expect(r.Stop()).To(Succeed())
	g.Expect(r.Stop()).To(Succeed(), "a second Stop is harmless")

	copied := filepath.Join(dir, "stable", "metrics.txt")
	g.Expect(r.CopyTo(copied)).To(Succeed())
	for _, path := range []string{r.Path, copied} {
		f, err := os.Open(path)
		g.Expect(err).NotTo(HaveOccurred())
		scrapes, err := recording.Read(f)
		_ = f.Close()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(len(scrapes)).To(BeNumerically(">=", 3))
		g.Expect(scrapes[0].Up).To(BeTrue())
		g.Expect(scrapes[0].Samples).To(HaveLen(1), "only gpuhealth_ families")
		g.Expect(scrapes[0].Samples[0].Labels.Get("node")).To(Equal("gpu-1"))
		g.Expect(scrapes[1].Up).To(BeFalse())
		g.Expect(scrapes[2].Up).To(BeTrue())
	}
}

func TestRecordMetricsRefusesABadInterval(t *testing.T) {
	_, err := RecordMetrics("localhost:1", filepath.Join(t.TempDir(), "m.txt"), 0)
	NewWithT(t).Expect(err).To(HaveOccurred())
}
