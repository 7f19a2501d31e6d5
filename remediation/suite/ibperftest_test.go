package suite

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// The fixtures in testdata/ibperftest are reports perftest printed, copied
// from public repositories (testdata/ibperftest/SOURCES.md); the
// expectations below are the facts SOURCES.md lists for them.

func TestParseIBPerftestRealReports(t *testing.T) {
	cases := []struct {
		file    string
		rows    int
		largest int64
		avg     float64 // Gb/s, the lowest at the largest size
		peak    float64
		n       int // rows at the largest size
		device  string
		errors  int
	}{
		{"cns_roce_write_bw_a_gbits_52g.txt", 23, 8388608, 52.52, 52.52, 1, "mlx5_0", 0},
		{"dranet_a3ultra_roce_write_bw_a_gbits_cuda_dmabuf.txt", 23, 8388608, 140.40, 140.55, 1, "mlx5_3", 0},
		{"dranet_a3ultra_roce_write_bw_a_gbits_completion_error.txt", 16, 65536, 381.41, 381.50, 1, "mlx5_3", 3},
		// MB/sec (2^20 bytes): 24056.72 × 2^20 × 8 / 10^9 = 201.80 Gb/s.
		{"superbench_ib_loopback_write_bw_8M_mb.txt", 2, 8388608, 201.80, 201.80, 2, "ib0", 0},
		// 23240.68 MB/sec = 194.96 Gb/s; server and client lines interleaved.
		{"superbench_ib_loopback_write_bw_all_sizes_mb_interleaved.txt", 24, 8388608, 194.96, 194.96, 2, "ib0", 0},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			g := NewWithT(t)
			r, err := ParseIBPerftest(fixture(t, "ibperftest", tc.file))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Rows).To(HaveLen(tc.rows))
			worst, n := r.Largest()
			g.Expect(worst.Bytes).To(Equal(tc.largest))
			g.Expect(worst.AvgGbps).To(Equal(tc.avg))
			g.Expect(worst.PeakGbps).To(Equal(tc.peak))
			g.Expect(n).To(Equal(tc.n))
			g.Expect(worst.Device).To(Equal(tc.device))
			g.Expect(r.ErrorCount).To(Equal(tc.errors))
		})
	}
}

// Rows built from perftest's format strings (RESULT_FMT, RESULT_FMT_G and
// REPORT_FMT in src/perftest_parameters.h) for one 8 MiB result: 392.42
// Gb/s is 46780.35 MiB/s, which perftest before 24.07 headed MB/sec.
const (
	ibGbitsReport = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n" +
		" 8388608    5000             392.56             392.42\t\t     0.005848\n"
	ibMiBReport = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n" +
		" 8388608    5000             46797.04            46780.35\t\t     0.005848\n"
	ibMBReport = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n" +
		" 8388608    5000             46797.04            46780.35\t\t     0.005848\n"
)

func TestParseIBPerftestShapes(t *testing.T) {
	cases := []struct {
		name    string
		out     string
		avg     float64
		devices []string
	}{
		{"Gb/sec header", ibGbitsReport, 392.42, nil},
		{"MiB/sec header (perftest 24.07 and later) gives the same Gb/s", ibMiBReport, 392.42, nil},
		{"MB/sec header (before 24.07) is the same unit", ibMBReport, 392.42, nil},
		{
			"a warning between the header and the row (stderr interleaved) is skipped",
			" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n" +
				"Conflicting CPU frequency values detected: 3902.477000 != 400.000000. CPU Frequency is not max.\n" +
				" 65536      5000             419.30             361.10 \t\t   0.005778\n",
			3.03, nil,
		},
		{
			"--cpu_util adds a column to the header and the row",
			" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]    CPU_Util[%]\n" +
				" 8388608    5000             392.56             392.42\t\t     0.005848\t    12.50\n",
			392.42, nil,
		},
		{
			"--report-per-port: the average is still the fourth column",
			" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]   BW Port1[Gb/sec]   MsgRate Port1[Mpps]   BW Port2[Gb/sec]   MsgRate Port2[Mpps]\n" +
				" 8388608    5000           390.00            389.00\t\t   0.005797        194.50            0.002898              194.50            0.002898\n",
			389, nil,
		},
		{
			"a QoS report puts #sl before #iterations",
			" #bytes    #sl      #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n" +
				" 8388608    3           5000           390.00            388.00                  0.005782\n",
			388, nil,
		},
		{
			"two HCAs run one after the other: the lower one is judged, with its device",
			" Dual-port       : OFF\t\tDevice         : mlx5_0\n" + ibGbitsReport +
				" Dual-port       : OFF\t\tDevice         : mlx5_1\n" +
				" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n" +
				" 8388608    5000             301.10             300.95\t\t     0.004485\n",
			300.95, []string{"mlx5_0", "mlx5_1"},
		},
		{
			"rows before any header have no unit and are skipped",
			" 8388608    5000             1.00             1.00\t\t     0.000015\n" + ibGbitsReport,
			392.42, nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r, err := ParseIBPerftest([]byte(tc.out))
			g.Expect(err).NotTo(HaveOccurred())
			worst, _ := r.Largest()
			g.Expect(worst.AvgGbps).To(Equal(tc.avg))
			g.Expect(r.ErrorCount).To(BeZero())
			for i, d := range tc.devices {
				g.Expect(r.Rows[i].Device).To(Equal(d))
			}
		})
	}
}

func TestParseIBPerftestRejects(t *testing.T) {
	cases := []struct {
		name, out, err string
	}{
		{"empty", "", "no result row"},
		{"header only", ibGbitsReport[:strings.Index(ibGbitsReport, "\n")+1], "no result row"},
		{"a shell's error", "sh: 1: ib_write_bw: not found\n", "no result row"},
		{
			"the client could not reach the server",
			"Couldn't connect to 10.0.4.7:18515\n Unable to init the socket connection\n",
			"no perftest result: Couldn't connect to 10.0.4.7:18515; Unable to init the socket connection",
		},
		{"a function's own error", "ethernet_read_keys: Couldn't read remote address\n Unable to read to socket/rdma_cm\n", "ethernet_read_keys: Couldn't read remote address"},
		{"rdma_cm failed", "rdma_bind_addr failed\n", "rdma_bind_addr failed"},
		{
			"a latency tool's report",
			" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n" +
				" 2       1000          1.58           4.49         1.62     \t       1.64     \t0.10   \t\t2.01    \t\t4.49   \n",
			"latency report",
		},
		{"an unknown unit", " #bytes     #iterations    BW peak[GB/s]    BW average[GB/s]   MsgRate[Mpps]\n 65536  1000  12.41  12.38  0.198039\n", "no result row"},
		{"a negative bandwidth", " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536  1000  1.0  -1.0  0.1\n", "no result row"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIBPerftest([]byte(tc.out))
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.err)))
		})
	}
}

func TestIsPerftestError(t *testing.T) {
	g := NewWithT(t)
	for _, line := range []string{
		"Completion with error at client", "Failed status 10: wr_id 0 syndrom 0x88", "Couldn't connect to 10.0.4.7:18515",
		"Unable to init the socket connection", "Failed to exchange data between server and clients",
		"Error: BW result is below bw limit", "Port number 1 state is Down", "Can't produce a report",
		"ethernet_read_keys: Couldn't read remote address", "rdma_get_cm_events failed",
	} {
		g.Expect(isPerftestError(line)).To(BeTrue(), line)
	}
	for _, line := range []string{
		"Conflicting CPU frequency values detected: 3902.477000 != 400.000000. CPU Frequency is not max.",
		"WARNING: BW peak won't be measured in this run.", "Perftest doesn't supports CUDA tests with inline messages: inline size set to 0",
		"Changing to this MTU", "Max msg size in UD is MTU 4096", "* Waiting for client to connect... *",
		"Client closed connection", "local address: LID 0x02 QPN 0x0032 PSN 0x5f2841", "",
	} {
		g.Expect(isPerftestError(line)).To(BeFalse(), line)
	}
}

func TestJudgeIBPerftest(t *testing.T) {
	const modelLabel = "feature.node.kubernetes.io/hca-model"
	cx7 := map[string]string{modelLabel: "ConnectX-7"}
	ib := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserIBPerftest, IBPerftest: &gpuhealthv1alpha1.IBPerftestThresholds{
		ModelLabel: modelLabel,
		Models:     []gpuhealthv1alpha1.HCAModelThreshold{{Model: "ConnectX-7", MinBandwidthGbps: 360}},
	}}
	withIBDefault := func(gbps int32) gpuhealthv1alpha1.ResultParser {
		p, th := ib, *ib.IBPerftest
		th.DefaultMinBandwidthGbps = ptr.To(gbps)
		p.IBPerftest = &th
		return p
	}
	cases := []struct {
		name      string
		p         gpuhealthv1alpha1.ResultParser
		succeeded bool
		out       string
		labels    map[string]string
		passed    bool
		message   string
	}{
		{"at the threshold for the model", ib, true, ibGbitsReport, cx7, true, "bandwidth 392.42 Gb/s at 8388608 B reaches the 360 Gb/s threshold for ConnectX-7"},
		{"the MiB/sec report of the same run passes alike", ib, true, ibMiBReport, cx7, true, "bandwidth 392.42 Gb/s at 8388608 B reaches the 360 Gb/s threshold"},
		{
			"below the threshold", ib, true, string(fixture(t, "ibperftest", "dranet_a3ultra_roce_write_bw_a_gbits_cuda_dmabuf.txt")), cx7, false,
			"bandwidth 140.4 Gb/s at 8388608 B on mlx5_3 is below the 360 Gb/s threshold for ConnectX-7",
		},
		{
			"the lowest of a loopback pair's results is judged", withIBDefault(190), true, string(fixture(t, "ibperftest", "superbench_ib_loopback_write_bw_all_sizes_mb_interleaved.txt")), nil, true,
			"bandwidth 194.96 Gb/s at 8388608 B on ib0 (the lowest of 2 results at that size) reaches the 190 Gb/s threshold for an unlabelled HCA model",
		},
		{
			"perftest printed an error after its results", withIBDefault(1), true, string(fixture(t, "ibperftest", "dranet_a3ultra_roce_write_bw_a_gbits_completion_error.txt")), nil, false,
			"perftest reported an error: Completion with error at client; Failed status 10: wr_id 0 syndrom 0x88; and 1 more (largest result: bandwidth 381.41 Gb/s at 65536 B on mlx5_3)",
		},
		{"no results", ib, false, "Couldn't connect to 10.0.4.7:18515\n", cx7, false, "job failed: exit 3; no perftest result: Couldn't connect to 10.0.4.7:18515"},
		{"good results but the job failed", ib, false, ibGbitsReport, cx7, false, "the test did not succeed (job failed: exit 3)"},
		{"model not listed, no default", ib, true, ibGbitsReport, map[string]string{modelLabel: "ConnectX-6"}, false, `but no threshold for HCA model "ConnectX-6" (set parser.ibPerftest.models or defaultMinBandwidthGbps)`},
		{"model not listed: the default", withIBDefault(180), true, ibGbitsReport, map[string]string{modelLabel: "ConnectX-6"}, true, "reaches the 180 Gb/s threshold for ConnectX-6"},
		{"no model label: the default", withIBDefault(180), true, ibGbitsReport, nil, true, "reaches the 180 Gb/s threshold for an unlabelled HCA model"},
		{
			"only a default, no model label", gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserIBPerftest, IBPerftest: &gpuhealthv1alpha1.IBPerftestThresholds{DefaultMinBandwidthGbps: ptr.To[int32](400)}},
			true, ibGbitsReport, cx7, false, "is below the 400 Gb/s threshold for an unlabelled HCA model",
		},
		{"no thresholds at all", gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserIBPerftest}, true, ibGbitsReport, cx7, false, `no threshold for HCA model ""`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			v := Judge(tc.p, tc.succeeded, "job failed: exit 3", []byte(tc.out), "", nil, tc.labels)
			g.Expect(v.Passed).To(Equal(tc.passed), v.Message)
			g.Expect(v.Message).To(ContainSubstring(tc.message))
		})
	}
}

func TestJudgeIBPerftestMeasurements(t *testing.T) {
	p := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserIBPerftest, IBPerftest: &gpuhealthv1alpha1.IBPerftestThresholds{DefaultMinBandwidthGbps: ptr.To[int32](50)}}
	v := Judge(p, true, "", fixture(t, "ibperftest", "cns_roce_write_bw_a_gbits_52g.txt"), "", nil, nil)
	NewWithT(t).Expect(v.Measurements).To(Equal([]gpuhealthv1alpha1.Measurement{
		{Name: "bandwidth", Value: "52.52", Unit: "Gb/s"},
		{Name: "peakBandwidth", Value: "52.52", Unit: "Gb/s"},
		{Name: "largestSize", Value: "8388608", Unit: "B"},
		{Name: "minBandwidth", Value: "50", Unit: "Gb/s"},
	}))
}
