// Command testjob is the container the real-node end-to-end tier runs as
// gpuhealth's reset, reboot, certification and recertification Jobs and as
// a workload: it says what it is, optionally prints a report in the shape a
// real tool prints, waits, and exits with the code it is told.
//
//	testjob [--sleep 3s] [--exit-code 0] [--serve] [--report dcgm-diag|nccl-tests] [name]
//
// --serve runs until SIGTERM (a workload pod) instead of exiting.
//
// --report dcgm-diag prints what `dcgmi diag -r 2 -j` prints with DCGM 4
// (the "DCGM Diagnostic" document: software, pcie and memory per GPU);
// TESTJOB_DCGM_FAIL names a test that fails on GPU 0.
//
// --report nccl-tests prints what nccl-tests 2.18's all_reduce_perf -b 8
// -e 4G -f 2 -g 8 prints, every row in its printf layout, the bus bandwidth
// rising to TESTJOB_BUSBW GB/s (default 400) at 4 GiB; TESTJOB_WRONG puts
// that many wrong results in the largest row.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	sleep := flag.Duration("sleep", 0, "How long to wait before exiting.")
	code := flag.Int("exit-code", 0, "The exit code.")
	serve := flag.Bool("serve", false, "Run until SIGTERM or SIGINT, then exit 0.")
	report := flag.String("report", "", "Print a report in a real tool's shape: dcgm-diag or nccl-tests.")
	flag.Parse()
	host, _ := os.Hostname()
	switch *report {
	case "":
		fmt.Printf("testjob %v in pod %s: sleep %s, exit code %d\n", flag.Args(), host, *sleep, *code)
	case "dcgm-diag":
		fmt.Println(dcgmReport(os.Getenv("TESTJOB_DCGM_FAIL"), 8))
	case "nccl-tests":
		busbw, err := strconv.ParseFloat(envOr("TESTJOB_BUSBW", "400"), 64)
		wrong, err2 := strconv.Atoi(envOr("TESTJOB_WRONG", "0"))
		if err != nil || err2 != nil {
			fmt.Fprintln(os.Stderr, "testjob: TESTJOB_BUSBW must be a number and TESTJOB_WRONG an integer")
			os.Exit(2)
		}
		fmt.Print(ncclReport(host, busbw, wrong))
	default:
		fmt.Fprintf(os.Stderr, "testjob: unknown report %q\n", *report)
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if *serve {
		s := <-sigs
		fmt.Printf("testjob: %s, exiting\n", s)
		return
	}
	select {
	case <-time.After(*sleep):
	case s := <-sigs:
		fmt.Fprintf(os.Stderr, "testjob: %s before the sleep ended\n", s)
	}
	if *report == "" {
		fmt.Printf("testjob: exiting with %d\n", *code)
	}
	os.Exit(*code)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// dcgmReport is DCGM 4's diagnostic JSON for level 2 on gpus GPUs; the
// test named fail fails on GPU 0 with the persistence-mode warning DCGM
// 4.2.3 prints.
func dcgmReport(fail string, gpus int) string {
	type warning struct {
		Category int    `json:"error_category"`
		ID       int    `json:"error_id"`
		Severity int    `json:"error_severity"`
		Warning  string `json:"warning"`
	}
	type result struct {
		Group    string    `json:"entity_group"`
		GroupID  int       `json:"entity_group_id"`
		ID       int       `json:"entity_id"`
		Status   string    `json:"status"`
		Warnings []warning `json:"warnings,omitempty"`
	}
	type summary struct {
		Status string `json:"status"`
	}
	type test struct {
		Name    string   `json:"name"`
		Results []result `json:"results"`
		Summary summary  `json:"test_summary"`
	}
	type category struct {
		Category string `json:"category"`
		Tests    []test `json:"tests"`
	}
	mk := func(name string) test {
		t := test{Name: name, Summary: summary{Status: "Pass"}}
		for i := range gpus {
			r := result{Group: "GPU", GroupID: 1, ID: i, Status: "Pass"}
			if name == fail && i == 0 {
				r.Status = "Fail"
				r.Warnings = []warning{{Category: 8, ID: 29, Severity: 5, Warning: "Persistence Mode: Persistence mode for GPU 0 is disabled."}}
				t.Summary.Status = "Fail"
			}
			t.Results = append(t.Results, r)
		}
		return t
	}
	doc := map[string]any{
		"DCGM Diagnostic": map[string]any{"test_categories": []category{
			{Category: "Deployment", Tests: []test{mk("software")}},
			{Category: "Integration", Tests: []test{mk("pcie")}},
			{Category: "Hardware", Tests: []test{mk("memory")}},
		}},
		"metadata": map[string]string{"version": "4.2.3", "Driver Version Detected": "580.82.09"},
	}
	b, _ := json.MarshalIndent(doc, "", "\t")
	return string(b)
}

// ncclReport is all_reduce_perf's report for 8 GPUs in one process, sizes
// 8 B to 4 GiB, bus bandwidth rising to peak GB/s.
func ncclReport(host string, peak float64, wrong int) string {
	var b strings.Builder
	b.WriteString("# nccl-tests version 2.18.2 nccl-headers=23007 nccl-library=23007\n")
	b.WriteString("# Collective test starting: all_reduce_perf\n")
	b.WriteString("# nThread 1 nGpus 8 minBytes 8 maxBytes 4294967296 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n#\n# Using devices\n")
	for i := range 8 {
		fmt.Fprintf(&b, "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%04x:%02x:%02x] NVIDIA H100 80GB HBM3\n", i, 4242, host, i, 0, 0x18+i, 0)
	}
	b.WriteString("#\n#                                                              out-of-place                       in-place          \n")
	b.WriteString("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n")
	b.WriteString("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n")
	const maxSize = int64(4) << 30
	sum, n := 0.0, 0
	for size := int64(8); size <= maxSize; size *= 2 {
		// Bandwidth saturates with size, as real reports do.
		busbw := peak * float64(size) / float64(size+(64<<20))
		if size == maxSize {
			busbw = peak
		}
		algbw := busbw / (2 * 7.0 / 8)
		us := float64(size) / (algbw * 1e3)
		w := 0
		if size == maxSize {
			w = wrong
		}
		fmt.Fprintf(&b, "%12d  %12d  %8s  %6s  %6d  %7s  %6s  %6s  %6d  %7s  %6s  %6s  %6d\n",
			size, size/4, "float", "sum", -1, num(us, 7), num(algbw, 6), num(busbw, 6), w, num(us, 7), num(algbw, 6), num(busbw, 6), w)
		sum += 2 * busbw
		n += 2
	}
	oob := "OK"
	if wrong > 0 {
		oob = "FAILED"
	}
	fmt.Fprintf(&b, "# Out of bounds values : %d %s\n# Avg bus bandwidth    : %s \n#\n# Collective test concluded: all_reduce_perf\n#\n", 2*wrong, oob, strconv.FormatFloat(sum/float64(n), 'g', 6, 64))
	return b.String()
}

// num formats v as nccl-tests 2.17.3+ does: the shortest of %.2f, %.1f and
// %.0f that fits width characters.
func num(v float64, width int) string {
	for _, prec := range []int{2, 1, 0} {
		if s := strconv.FormatFloat(v, 'f', prec, 64); len(s) <= width {
			return s
		}
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
