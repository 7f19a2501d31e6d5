package main

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/remediation/suite"
)

// The reports testjob prints are read by the operator's parsers as real
// reports are: the numbers it was told come back out.
func TestReportsParse(t *testing.T) {
	g := NewWithT(t)
	r, err := suite.ParseNCCLTests([]byte(ncclReport("node-1", 87.5, 0)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Rows).To(HaveLen(30), "8 B to 4 GiB, factor 2")
	g.Expect(r.Largest().Size).To(Equal(int64(4) << 30))
	g.Expect(r.Largest().BusBW).To(Equal(87.5))
	g.Expect(r.Wrong).To(BeZero())
	g.Expect(r.AvgBusBW).NotTo(BeNil())

	r, err = suite.ParseNCCLTests([]byte(ncclReport("node-1", 400, 3)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Wrong).To(Equal(int64(6)))

	d, err := suite.ParseDCGMDiag([]byte(dcgmReport("", 8)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Passed).To(Equal(24))
	g.Expect(d.Failures).To(BeEmpty())
	g.Expect(d.Version).To(Equal("4.2.3"))

	d, err = suite.ParseDCGMDiag([]byte(dcgmReport("memory", 8)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Failures).To(ConsistOf(ContainSubstring("memory on GPU 0: Persistence Mode")))
}
