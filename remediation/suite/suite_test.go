package suite

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// The fixtures in testdata are reports the real tools printed, copied from
// public sources (testdata/*/SOURCES.md says where from and what each
// holds); the expectations below are the facts SOURCES.md lists for them.

func fixture(t *testing.T, parts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{"testdata"}, parts...)...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseNCCLTestsRealReports(t *testing.T) {
	cases := []struct {
		file           string
		largest        int64
		busbw, inplace float64
		avg            float64
		outOfBounds    int64
		wrong          int64
	}{
		{"h100_2node_16gpu_mpirun_8G.txt", 8589934592, 338.82, 337.35, 70.742, 0, 0},
		{"a100_1node_8gpu_g8_4G.txt", 4294967296, 232.44, 231.59, 66.2058, 0, 0},
		{"a100_1node_8proc_mpirun_4G_mpi_noise.txt", 4294967296, 232.81, 232.93, 72.7724, 0, 0},
		{"gh200_2node_v2.17.1_8_128M.txt", 134217728, 122.57, 123.11, 19.7866, 0, 0},
		{"gh200_2node_v2.18.2_1M_128M.txt", 134217728, 22.86, 22.88, 14.9966, 0, 0},
		{"gh200_2node_v2.17.8_wrong_FAILED_issue369.txt", 134217728, 22.87, 22.80, 4.79995, 4, 128},
		{"rtx3090_2node_inc_wrong_FAILED.txt", 536870912, 7.41, 7.35, 3.02663, 108, -1},
		{"v100_2node_16gpu_old_error_column_8G.txt", 8589934592, 9.93, 9.92, 5.16186, 0, 0},
		{"k80_2node_validation0_na.txt", 1073741824, 0.61, 0.61, 0.565546, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			g := NewWithT(t)
			r, err := ParseNCCLTests(fixture(t, "nccl", tc.file))
			g.Expect(err).NotTo(HaveOccurred())
			last := r.Largest()
			g.Expect(last.Size).To(Equal(tc.largest))
			g.Expect(last.BusBW).To(Equal(tc.busbw))
			g.Expect(last.InPlaceBusBW).To(HaveValue(Equal(tc.inplace)))
			g.Expect(r.AvgBusBW).To(HaveValue(Equal(tc.avg)))
			g.Expect(r.OutOfBounds).To(Equal(tc.outOfBounds))
			if tc.wrong >= 0 {
				g.Expect(r.Wrong).To(Equal(max(tc.wrong, tc.outOfBounds)))
			} else {
				g.Expect(r.Wrong).To(BeNumerically(">", tc.outOfBounds), "every row has wrong results")
			}
			// The footer's average is the mean of every row's two bus bandwidths.
			sum, n := 0.0, 0
			for _, row := range r.Rows {
				sum += row.BusBW + *row.InPlaceBusBW
				n += 2
			}
			g.Expect(sum/float64(n)).To(BeNumerically("~", tc.avg, 0.01), "every row was read")
		})
	}
}

// A large #wrong count is printed with %g: it still counts, footer or not.
func TestParseNCCLTestsWrongInExponentForm(t *testing.T) {
	g := NewWithT(t)
	r, err := ParseNCCLTests([]byte("   134217728      33554432     float     sum      -1   5871.07   22.86   22.86  1.04858e+06   5867.43   22.88   22.88       0\n# Out of bounds values : 0 OK\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Wrong).To(Equal(int64(1048580)))
}

func TestParseNCCLTestsAbortedRun(t *testing.T) {
	_, err := ParseNCCLTests(fixture(t, "nccl", "gh200_2node_v2.17.8_device_busy_abort_issue369.txt"))
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("no result row")))
}

func TestParseNCCLTestsRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":            "",
		"header only":      "# nThread 1 nGpus 8 minBytes 8 maxBytes 4294967296\n#\n",
		"bad footer count": "           8             2     float     sum      -1    36.81    0.00    0.00      0    35.83    0.00    0.00      0\n# Out of bounds values : x OK\n",
		"bad average":      "           8             2     float     sum      -1    36.81    0.00    0.00      0    35.83    0.00    0.00      0\n# Avg bus bandwidth    : NaN\n",
		"cut short":        "           8             2     float     sum      -1    36.81    0.00    0.00      0    35.83    0.00    0.00      0\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseNCCLTests([]byte(in))
			NewWithT(t).Expect(err).To(HaveOccurred())
		})
	}
}

func TestParseDCGMDiagRealReports(t *testing.T) {
	cases := []struct {
		file                    string
		passed, skipped, failed int
		failure                 string
		version                 string
	}{
		{"v4.2.3_gb10_r1_software_fail.json", 0, 0, 1, "software on GPU 0: Persistence Mode: Persistence mode for GPU 0 is disabled", "4.2.3"},
		{"v3.0-era_r2_1gpu_pass_virtualclient.json", 11, 0, 0, "", ""},
		{"v3.0-era_r3_1gpu_eud_skip_virtualclient.json", 15, 1, 0, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			g := NewWithT(t)
			r, err := ParseDCGMDiag(fixture(t, "dcgm", tc.file))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Passed).To(Equal(tc.passed))
			g.Expect(r.Skipped).To(Equal(tc.skipped))
			g.Expect(r.Failures).To(HaveLen(tc.failed))
			if tc.failure != "" {
				g.Expect(r.Failures[0]).To(ContainSubstring(tc.failure))
			}
			if tc.version != "" {
				g.Expect(r.Version).To(HavePrefix(tc.version))
			}
		})
	}
}

func TestParseDCGMDiagShapes(t *testing.T) {
	g := NewWithT(t)
	_, err := ParseDCGMDiag(fixture(t, "dcgm", "v4_8gpu_r3_diagnostic_test_fragment_issue215.txt"))
	g.Expect(err).To(HaveOccurred(), "a fragment is no report")

	r, err := ParseDCGMDiag([]byte(`{"DCGM GPU Diagnostic": {"version": "3.3.9", "runtime_error": "Unable to connect to host engine"}}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Failures).To(ConsistOf("runtime error: Unable to connect to host engine"))

	r, err = ParseDCGMDiag([]byte("Started host engine version 3.3.9 using port number: 5555\n" +
		`{"iterations": [{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{"name": "PCIe", "results": [{"gpu_id": "0", "status": "Pass"}]}]}]}},` +
		`{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{"name": "PCIe", "results": [{"gpu_id": "0", "status": "Fail", "info": "bandwidth low"}]}]}]}}], "Overall Result": "Fail"}`))
	g.Expect(err).NotTo(HaveOccurred(), "text before the JSON is skipped")
	g.Expect(r.Passed).To(Equal(1))
	g.Expect(r.Failures).To(ConsistOf("PCIe on GPU 0: bandwidth low"))

	r, err = ParseDCGMDiag([]byte(`{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 2, "status": "Weird"}]}]}]}}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Failures).To(ConsistOf(`memory on GPU 2 (status "Weird")`), "an unknown status is no pass")

	for _, bad := range []string{"", "dcgmi: command not found", "{", `{"DCGM GPU Diagnostic": {}}`, `[]`} {
		_, err := ParseDCGMDiag([]byte(bad))
		g.Expect(err).To(HaveOccurred(), "%q", bad)
	}
}

func TestJudge(t *testing.T) {
	h100 := map[string]string{DefaultProductLabel: "NVIDIA-H100-80GB-HBM3"}
	nccl := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests, NCCL: &gpuhealthv1alpha1.NCCLThresholds{
		Products: []gpuhealthv1alpha1.ProductThreshold{{Product: "NVIDIA-H100-80GB-HBM3", MinBusBandwidthGBps: 300}},
	}}
	h100Report := fixture(t, "nccl", "h100_2node_16gpu_mpirun_8G.txt")
	dcgm := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserDCGMDiag}
	cases := []struct {
		name      string
		p         gpuhealthv1alpha1.ResultParser
		succeeded bool
		out       []byte
		outErr    error
		labels    map[string]string
		passed    bool
		message   string
	}{
		{"exit code 0", gpuhealthv1alpha1.ResultParser{}, true, nil, nil, nil, true, "exited 0"},
		{"exit code not 0", gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserExitCode}, false, nil, nil, nil, false, "job failed: exit 3"},
		{"nccl over the threshold", nccl, true, h100Report, nil, h100, true, "bus bandwidth 338.82 GB/s at 8589934592 B reaches the 300 GB/s threshold for NVIDIA-H100-80GB-HBM3"},
		{"nccl under the threshold", withThreshold(nccl, 400), true, h100Report, nil, h100, false, "below the 400 GB/s threshold"},
		{"nccl, product not listed, no default", nccl, true, h100Report, nil, map[string]string{DefaultProductLabel: "NVIDIA-B200"}, false, `no threshold for GPU product "NVIDIA-B200"`},
		{"nccl, product not listed, the default", withDefault(nccl, 100), true, h100Report, nil, nil, true, "an unlabelled GPU product"},
		{"nccl with wrong results", withDefault(nccl, 1), true, fixture(t, "nccl", "rtx3090_2node_inc_wrong_FAILED.txt"), nil, nil, false, "wrong results"},
		{"nccl good but the job failed", nccl, false, h100Report, nil, h100, false, "did not succeed (job failed: exit 3)"},
		{"nccl aborted", nccl, false, fixture(t, "nccl", "gh200_2node_v2.17.8_device_busy_abort_issue369.txt"), nil, h100, false, "no result row"},
		{"nccl output gone", nccl, true, nil, errors.New("no output: pod gone"), h100, false, "no output: pod gone"},
		{"dcgm pass", dcgm, true, fixture(t, "dcgm", "v3.0-era_r3_1gpu_eud_skip_virtualclient.json"), nil, nil, true, "15 passed, 1 skipped"},
		{"dcgm fail", dcgm, false, fixture(t, "dcgm", "v4.2.3_gb10_r1_software_fail.json"), nil, nil, false, "1 failed: software on GPU 0"},
		{"dcgm pass, dcgmi failed", dcgm, false, fixture(t, "dcgm", "v3.0-era_r2_1gpu_pass_virtualclient.json"), nil, nil, false, "dcgmi did not succeed"},
		{"dcgm not json", dcgm, true, []byte("Error: unable to establish a connection to the specified host: 10.0.0.1\n"), nil, nil, false, "not a dcgmi diag JSON report"},
		{"unknown parser", gpuhealthv1alpha1.ResultParser{Type: "magic"}, true, nil, nil, nil, false, "unknown parser"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			v := Judge(tc.p, tc.succeeded, "job failed: exit 3", tc.out, "", tc.outErr, tc.labels)
			g.Expect(v.Passed).To(Equal(tc.passed), v.Message)
			g.Expect(v.Message).To(ContainSubstring(tc.message))
		})
	}
}

func withThreshold(p gpuhealthv1alpha1.ResultParser, gbps int32) gpuhealthv1alpha1.ResultParser {
	n := *p.NCCL
	n.Products = []gpuhealthv1alpha1.ProductThreshold{{Product: n.Products[0].Product, MinBusBandwidthGBps: gbps}}
	p.NCCL = &n
	return p
}

func withDefault(p gpuhealthv1alpha1.ResultParser, gbps int32) gpuhealthv1alpha1.ResultParser {
	n := *p.NCCL
	n.DefaultMinBusBandwidthGBps = ptr.To(gbps)
	p.NCCL = &n
	return p
}
