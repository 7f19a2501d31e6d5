package suite

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// IBPerftestRow is one result line of a perftest bandwidth report.
type IBPerftestRow struct {
	// Bytes is the message size; Iterations how many messages were sent.
	Bytes, Iterations int64
	// PeakGbps and AvgGbps are the peak and the average bandwidth in Gb/s
	// (10^9 bits per second). A MiB/sec report's values are converted and
	// rounded to 0.01 Gb/s, the precision --report_gbits prints. The peak
	// is 0 when perftest did not measure it (-D, --run_infinitely).
	PeakGbps, AvgGbps float64
	// Device is the HCA the last test banner before the row named
	// ("Device : mlx5_0"); empty when no banner came first.
	Device string
}

// IBPerftestReport is what perftest's bandwidth tools printed.
type IBPerftestReport struct {
	// Rows are the result lines in report order: one per message size and
	// run (a loopback pair's server and client may both print one).
	Rows []IBPerftestRow
	// Errors are the first lines (at most maxIBPerftestErrors, each cut to
	// 160 characters) in which perftest said it failed; ErrorCount counts
	// them all.
	Errors     []string
	ErrorCount int
}

// Largest returns the row of the largest message size with the lowest
// average bandwidth (the first of equals) and how many rows have that size.
// The report has at least one row.
func (r *IBPerftestReport) Largest() (worst IBPerftestRow, n int) {
	size := r.Rows[0].Bytes
	for _, row := range r.Rows[1:] {
		size = max(size, row.Bytes)
	}
	for _, row := range r.Rows {
		if row.Bytes != size {
			continue
		}
		if n == 0 || row.AvgGbps < worst.AvgGbps {
			worst = row
		}
		n++
	}
	return worst, n
}

// perftest prints MiB/sec unless --report_gbits: print_report_bw in
// src/perftest_parameters.c divides by format_factor = 0x100000 (2^20
// bytes) for MBS and 125000000 (10^9 bits) for GBS, and its usage text
// says "MiB=2^20 byte, while Gb=10^9 bits". Headers before perftest 24.07
// wrote the same unit as "MB/sec" (commit 1d202bb renamed it MiB/sec).
const mibPerSecInGbps = 1 << 20 * 8 / 1e9

// maxIBPerftestErrors bounds the error lines kept; the verdict shows two.
const maxIBPerftestErrors = 8

// maxPerftestLine bounds one line of a report, as for nccl-tests: perftest's
// own lines are short, but a wrapper script or a CUDA library may print
// long ones.
const maxPerftestLine = 64 << 10

// ParseIBPerftest reads the text report of perftest's bandwidth tools
// (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw): the result lines
// under a header
//
//	#bytes  #iterations  BW peak[Gb/sec|MiB/sec|MB/sec]  BW average[…]  MsgRate[Mpps]  [more]
//
// (the column count and the bandwidth columns are taken from the header,
// so --report-per-port, QoS and --cpu_util reports read too), the device
// each test banner names, and the lines in which perftest says it failed
// (stderr, which a pod's log interleaves: "Couldn't connect …", "Unable to
// init the socket connection", "Completion with error at client", "Failed
// to …"). Its warnings ("Conflicting CPU frequency values detected",
// "WARNING: …") and everything else are skipped. A report without a result
// row is an error that quotes perftest's errors; so is a latency tool's
// report (…_lat), which has no bandwidth to judge.
func ParseIBPerftest(out []byte) (*IBPerftestReport, error) {
	r := &IBPerftestReport{}
	var (
		hdr     *perftestHeader
		device  string
		latency bool
	)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), maxPerftestLine)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#bytes"):
			var lat bool
			hdr, lat = parsePerftestHeader(line)
			latency = latency || lat
		case strings.HasPrefix(line, "Dual-port"):
			// " Dual-port : OFF\t\tDevice : mlx5_0" opens every test's
			// banner (ctx_print_test_info).
			if _, dev, ok := strings.Cut(line, "Device"); ok {
				if _, name, ok := strings.Cut(dev, ":"); ok {
					device = strings.TrimSpace(name)
				}
			}
		case isPerftestError(line):
			if len(r.Errors) < maxIBPerftestErrors {
				r.Errors = append(r.Errors, gpuhealthv1alpha1.Truncate(line, 160))
			}
			r.ErrorCount++
		case hdr != nil:
			if row, ok := hdr.row(strings.Fields(line)); ok {
				row.Device = device
				r.Rows = append(r.Rows, row)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the perftest report: %w", err)
	}
	if len(r.Rows) > 0 {
		return r, nil
	}
	switch {
	case len(r.Errors) > 0:
		return nil, fmt.Errorf("no perftest result: %s", gpuhealthv1alpha1.FirstN(r.Errors, 2, "; "))
	case latency:
		return nil, errors.New("a perftest latency report (t_min … t_avg[usec]) has no bandwidth to judge: run ib_write_bw, ib_read_bw or ib_send_bw")
	}
	return nil, errors.New("not a perftest bandwidth report: no result row under a \"#bytes #iterations BW peak[…] BW average[…]\" header")
}

// perftestHeader is where a bandwidth header puts its columns.
type perftestHeader struct {
	// columns is how many values a row has; bytes, iterations, peak and
	// avg index them (peak is -1 when the header has none).
	columns, bytes, iterations, peak, avg int
	// factor turns the header's unit into Gb/s (1 for Gb/sec).
	factor float64
}

// parsePerftestHeader reads a "#bytes …" header. hdr is nil for anything
// but a bandwidth header with a known unit; latency says the header is a
// latency tool's (t_min[usec] … or t_avg[usec] tps average).
func parsePerftestHeader(line string) (hdr *perftestHeader, latency bool) {
	cols := perftestColumns(line)
	h := &perftestHeader{columns: len(cols), bytes: -1, iterations: -1, peak: -1, avg: -1}
	unit := ""
	for i, c := range cols {
		switch {
		case c == "#bytes":
			h.bytes = i
		case c == "#iterations" || c == "iterations":
			h.iterations = i
		case strings.HasPrefix(c, "BW peak["):
			h.peak = i
		case strings.HasPrefix(c, "BW average["):
			h.avg, unit = i, strings.TrimSuffix(strings.TrimPrefix(c, "BW average["), "]")
		case strings.HasPrefix(c, "t_"):
			latency = true
		}
	}
	switch unit {
	case "Gb/sec":
		h.factor = 1
	case "MiB/sec", "MB/sec":
		h.factor = mibPerSecInGbps
	default:
		return nil, latency
	}
	if h.bytes != 0 || h.iterations < 0 {
		return nil, latency
	}
	return h, latency
}

// perftestColumns splits a header into its column names. Names are
// "#bytes", "#iterations", "BW peak[Gb/sec]", "MsgRate Port1[Mpps]",
// "99% percentile[usec]": a word that neither starts with '#' nor ends a
// bracket belongs to the next word. Splitting on words, not on runs of
// spaces, reads a header whose spacing a paste or a terminal changed.
func perftestColumns(line string) []string {
	var cols []string
	pending := ""
	for _, w := range strings.Fields(line) {
		if pending != "" {
			w = pending + " " + w
			pending = ""
		}
		if strings.HasPrefix(w, "#") || strings.HasSuffix(w, "]") {
			cols = append(cols, w)
			continue
		}
		pending = w
	}
	if pending != "" {
		cols = append(cols, pending)
	}
	return cols
}

// row reads a result line; ok is false for any other line.
func (h *perftestHeader) row(f []string) (IBPerftestRow, bool) {
	if len(f) != h.columns {
		return IBPerftestRow{}, false
	}
	size, err1 := strconv.ParseInt(f[h.bytes], 10, 64)
	iters, err2 := strconv.ParseInt(f[h.iterations], 10, 64)
	if err1 != nil || err2 != nil || size <= 0 || iters < 0 {
		return IBPerftestRow{}, false
	}
	avg, ok := h.gbps(f[h.avg])
	if !ok {
		return IBPerftestRow{}, false
	}
	peak := 0.0
	if h.peak >= 0 {
		if peak, ok = h.gbps(f[h.peak]); !ok {
			return IBPerftestRow{}, false
		}
	}
	return IBPerftestRow{Bytes: size, Iterations: iters, PeakGbps: peak, AvgGbps: avg}, true
}

// gbps reads a bandwidth in the header's unit as Gb/s.
func (h *perftestHeader) gbps(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !finite(v) || v < 0 || v > 1e12 {
		return 0, false
	}
	if h.factor != 1 {
		v = math.Round(v*h.factor*100) / 100
	}
	return v, true
}

// perftestErrorPrefixes begin the lines in which perftest says it failed
// (its fprintf(stderr, …) messages in src/*.c and the NOTIFY_COMP_ERROR_*
// macros of src/perftest_resources.h). Its warnings are not among them:
// "Conflicting CPU frequency values detected" (get_clock.c; it then uses
// the sampled frequency), "WARNING: BW peak won't be measured in this
// run.", "Perftest doesn't supports CUDA tests with inline messages".
var perftestErrorPrefixes = []string{
	"Couldn't", "Could not", "Unable to", "Failed", "failed to", "Completion with", "A completion with",
	"Error", "Problems with", "Problem in", "Can't", "Cannot", "Test exited", "Bad wc", "Poll Receive CQ",
	"Parser function exited with Error", "Invalid Command", "VALIDATION: ERROR", "Port number",
}

// isPerftestError says whether line (trimmed) is perftest saying it failed:
// one of perftestErrorPrefixes, a function's own words
// ("ethernet_read_keys: Couldn't read remote address") or an rdma_cm call
// that failed ("rdma_bind_addr failed").
func isPerftestError(line string) bool {
	for _, p := range perftestErrorPrefixes {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.Contains(f[0], "_") {
		return false
	}
	if fn, ok := strings.CutSuffix(f[0], ":"); ok && isIdentifier(fn) {
		return strings.HasPrefix(f[1], "Couldn't") || strings.HasPrefix(f[1], "Failed") || strings.HasPrefix(f[1], "failed")
	}
	return isIdentifier(f[0]) && strings.HasPrefix(f[1], "failed")
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}
