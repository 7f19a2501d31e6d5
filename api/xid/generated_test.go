package xid

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// catalogDir is where NVIDIA's catalog sheets are: $GPUHEALTH_XID_CATALOG,
// or the reference data beside the repository.
func catalogDir() string {
	if d := os.Getenv("GPUHEALTH_XID_CATALOG"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "reference", "nvidia-xid-catalog")
}

// sheet reads a TSV sheet's data rows (after the header), without the
// row-number column, cells normalised as the generator does.
func sheet(t *testing.T, name string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(catalogDir(), name))
	if os.IsNotExist(err) {
		t.Skipf("NVIDIA's XID catalog is not at %s (set GPUHEALTH_XID_CATALOG)", catalogDir())
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for first := true; sc.Scan(); first = false {
		if first || strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		cells := strings.Split(sc.Text(), "\t")[1:]
		for i, c := range cells {
			cells[i] = strings.Join(strings.Fields(strings.ReplaceAll(c, `\n`, " ")), " ")
		}
		for len(cells) < 13 {
			cells = append(cells, "")
		}
		out = append(out, cells)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func yes(b bool) string {
	if b {
		return "YES"
	}
	return "NO"
}

// TestGeneratedCatalogEqualsNVIDIA compares the generated table with
// NVIDIA's sheet "Xids", row by row and cell by cell.
func TestGeneratedCatalogEqualsNVIDIA(t *testing.T) {
	want := sheet(t, "Xids.tsv")
	if len(want) != len(catalogRows) {
		t.Fatalf("the generated table has %d rows, NVIDIA's sheet %d: run make generate", len(catalogRows), len(want))
	}
	for i, r := range catalogRows {
		got := []string{"XID", strconv.Itoa(r.Code), r.Mnemonic, r.Description,
			yes(r.AppliesTo.A100), yes(r.AppliesTo.H100), yes(r.AppliesTo.B100), yes(r.AppliesTo.GB200),
			r.Immediate, r.Investigatory, r.XID154Linkage}
		for j, g := range got {
			if g != want[i][j] {
				t.Errorf("sheet Xids row %d column %d: generated %q, NVIDIA %q", i+2, j+2, g, want[i][j])
			}
		}
	}
}

// TestGeneratedDecodeEqualsNVIDIA compares the generated decode table with
// NVIDIA's sheet "Xid 144-150 Decode", row by row and cell by cell.
func TestGeneratedDecodeEqualsNVIDIA(t *testing.T) {
	want := sheet(t, "Xid_144-150_Decode.tsv")
	if len(want) != len(decodeRows) {
		t.Fatalf("the generated decode table has %d rows, NVIDIA's sheet %d: run make generate", len(decodeRows), len(want))
	}
	for i, r := range decodeRows {
		got := []string{strconv.Itoa(r.XID), r.Subcode, r.V1IntrInfo, r.V2IntrInfo, r.ErrorStatus, r.Immediate,
			r.V1Action2IntrInfo, r.V2Action2IntrInfo, r.Action2, r.Investigatory, r.Severity, r.Origin}
		for j, g := range got {
			if g != want[i][j] {
				t.Errorf("sheet Xid 144-150 Decode row %d column %d: generated %q, NVIDIA %q", i+2, j+2, g, want[i][j])
			}
		}
	}
}
