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
