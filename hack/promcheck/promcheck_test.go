package promcheck

import (
	"testing"

	. "github.com/onsi/gomega"
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
