package suite

import (
	"os"
	"path/filepath"
	"testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func seed(f *testing.F, dir string) {
	f.Helper()
	files, _ := filepath.Glob(filepath.Join("testdata", dir, "*"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
}

// FuzzParseNCCLTests: any output gives a report with rows or an error, never
// a panic, and a report's largest row is one of its rows.
func FuzzParseNCCLTests(f *testing.F) {
	seed(f, "nccl")
	f.Fuzz(func(t *testing.T, out []byte) {
		r, err := ParseNCCLTests(out)
		if err != nil {
			return
		}
		if len(r.Rows) == 0 {
			t.Fatal("a report without rows")
		}
		last := r.Largest()
		if last.BusBW < 0 || last.Size < 0 {
			t.Fatalf("negative values: %+v", last)
		}
		v := Judge(gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests}, true, "", out, "", nil, nil)
		if v.Passed {
			t.Fatal("passed without a threshold")
		}
	})
}

// FuzzParseDCGMDiag: any output gives a report or an error, never a panic;
// a report with failures never passes.
func FuzzParseDCGMDiag(f *testing.F) {
	seed(f, "dcgm")
	f.Fuzz(func(t *testing.T, out []byte) {
		r, err := ParseDCGMDiag(out)
		if err != nil {
			return
		}
		v := Judge(gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserDCGMDiag}, true, "", out, "", nil, nil)
		if len(r.Failures) > 0 && v.Passed {
			t.Fatalf("passed with failures %v", r.Failures)
		}
	})
}

// FuzzParseIBPerftest: any output gives a report with rows or an error,
// never a panic; every bandwidth is finite and not negative, the judged row
// is a row of the largest size, and a report in which perftest printed an
// error never passes, even with a zero threshold.
func FuzzParseIBPerftest(f *testing.F) {
	seed(f, "ibperftest")
	f.Add([]byte(ibMiBReport))
	f.Fuzz(func(t *testing.T, out []byte) {
		r, err := ParseIBPerftest(out)
		if err != nil {
			return
		}
		if len(r.Rows) == 0 {
			t.Fatal("a report without rows")
		}
		largest := int64(0)
		for _, row := range r.Rows {
			if !finite(row.AvgGbps) || !finite(row.PeakGbps) || row.AvgGbps < 0 || row.PeakGbps < 0 || row.Bytes <= 0 {
				t.Fatalf("bad row %+v", row)
			}
			largest = max(largest, row.Bytes)
		}
		worst, n := r.Largest()
		if worst.Bytes != largest || n < 1 {
			t.Fatalf("judged %+v (%d at that size), largest size %d", worst, n, largest)
		}
		p := gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserIBPerftest}
		if v := Judge(p, true, "", out, "", nil, nil); v.Passed {
			t.Fatal("passed without a threshold")
		}
		p.IBPerftest = &gpuhealthv1alpha1.IBPerftestThresholds{DefaultMinBandwidthGbps: new(int32)}
		if v := Judge(p, true, "", out, "", nil, nil); v.Passed == (r.ErrorCount > 0) {
			t.Fatalf("passed=%v with %d errors: %s", v.Passed, r.ErrorCount, v.Message)
		}
	})
}
