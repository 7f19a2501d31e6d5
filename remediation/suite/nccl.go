package suite

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// NCCLRow is one message size of an nccl-tests report.
type NCCLRow struct {
	// Size is the message size in bytes; Count its elements.
	Size, Count int64
	// Type is the element type (float, half, …).
	Type string
	// TimeUS, AlgBW and BusBW are the out-of-place time (µs) and
	// bandwidths (GB/s).
	TimeUS, AlgBW, BusBW float64
	// InPlaceBusBW is the in-place bus bandwidth, when the report has it.
	InPlaceBusBW *float64
	// Wrong counts wrong results in both halves; -1 when the report says N/A
	// (validation off).
	Wrong int64
}

// NCCLReport is what an nccl-tests binary printed.
type NCCLReport struct {
	// Rows are the result rows in report order.
	Rows []NCCLRow
	// AvgBusBW is the "Avg bus bandwidth" footer, when present.
	AvgBusBW *float64
	// OutOfBounds is the "Out of bounds values" footer, -1 when absent.
	OutOfBounds int64
	// Wrong is the worst of the footer's out-of-bounds count and the rows'
	// wrong results.
	Wrong int64
}

// Largest is the row of the largest message size (the last of equals).
func (r *NCCLReport) Largest() NCCLRow {
	best := r.Rows[0]
	for _, row := range r.Rows[1:] {
		if row.Size >= best.Size {
			best = row
		}
	}
	return best
}

// maxNCCLLine bounds one line of a report; NCCL's own log lines can be long.
const maxNCCLLine = 64 << 10

// ParseNCCLTests reads the text report of an nccl-tests binary
// (all_reduce_perf, all_gather_perf, alltoall_perf, …): its result rows
//
//	size  count  type  [redop  [root]]  time algbw busbw #wrong  [time algbw busbw #wrong]
//
// (out-of-place, then in-place) and its "# Out of bounds values" and
// "# Avg bus bandwidth" footers. Other lines (the header, NCCL's INFO and
// WARN lines, mpirun's chatter) are skipped. A report without a result row
// is an error.
func ParseNCCLTests(out []byte) (*NCCLReport, error) {
	r := &NCCLReport{OutOfBounds: -1}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), maxNCCLLine)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "#"); ok {
			if err := r.footer(strings.TrimSpace(rest)); err != nil {
				return nil, err
			}
			continue
		}
		if row, ok := parseNCCLRow(strings.Fields(line)); ok {
			r.Rows = append(r.Rows, row)
			if row.Wrong > 0 {
				r.Wrong += row.Wrong
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the nccl-tests report: %w", err)
	}
	if len(r.Rows) == 0 {
		return nil, errors.New("not an nccl-tests report: no result row (size count type … busbw)")
	}
	if r.OutOfBounds < 0 {
		// Every nccl-tests version ends its table with it: without it the
		// report was cut short (or its output limit reached) and its
		// results were never checked.
		return nil, errors.New("a cut-short nccl-tests report: no \"# Out of bounds values\" line after the rows")
	}
	r.Wrong = max(r.Wrong, r.OutOfBounds)
	return r, nil
}

// footer reads the "Out of bounds values : N OK|FAILED" and
// "Avg bus bandwidth : X" lines.
func (r *NCCLReport) footer(s string) error {
	key, val, ok := strings.Cut(s, ":")
	if !ok {
		return nil
	}
	fields := strings.Fields(val)
	if len(fields) == 0 {
		return nil
	}
	switch strings.Join(strings.Fields(key), " ") {
	case "Out of bounds values":
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("nccl-tests report: bad out-of-bounds count %q", fields[0])
		}
		r.OutOfBounds = n
	case "Avg bus bandwidth":
		f, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || !finite(f) {
			return fmt.Errorf("nccl-tests report: bad average bus bandwidth %q", fields[0])
		}
		r.AvgBusBW = &f
	}
	return nil
}

// parseNCCLRow reads a result row; ok is false for any other line.
func parseNCCLRow(f []string) (NCCLRow, bool) {
	if len(f) < 7 {
		return NCCLRow{}, false
	}
	size, err1 := strconv.ParseInt(f[0], 10, 64)
	count, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || size < 0 || count < 0 || isNumber(f[2]) {
		return NCCLRow{}, false
	}
	row := NCCLRow{Size: size, Count: count, Type: f[2]}
	rest := f[3:]
	var halves [][]string
	switch {
	case len(rest) >= 8 && isHalf(rest[len(rest)-8:len(rest)-4]) && isHalf(rest[len(rest)-4:]):
		halves = [][]string{rest[len(rest)-8 : len(rest)-4], rest[len(rest)-4:]}
	case isHalf(rest[len(rest)-4:]):
		halves = [][]string{rest[len(rest)-4:]}
	default:
		return NCCLRow{}, false
	}
	for i, h := range halves {
		t, _ := strconv.ParseFloat(h[0], 64)
		alg, _ := strconv.ParseFloat(h[1], 64)
		bus, _ := strconv.ParseFloat(h[2], 64)
		if i == 0 {
			row.TimeUS, row.AlgBW, row.BusBW = t, alg, bus
		} else {
			row.InPlaceBusBW = &bus
		}
		switch w := wrongOf(h[3]); {
		case w < 0 && row.Wrong <= 0:
			row.Wrong = -1
		case w > 0:
			row.Wrong = max(row.Wrong, 0) + w
		case row.Wrong < 0:
			row.Wrong = 0
		}
	}
	return row, true
}

// isHalf says whether f is "time algbw busbw #wrong".
func isHalf(f []string) bool {
	if len(f) != 4 {
		return false
	}
	for _, s := range f[:3] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !finite(v) || v < 0 {
			return false
		}
	}
	return f[3] == "N/A" || isNumber(f[3])
}

// wrongOf reads a #wrong field: a count (printed with %g, so a large one
// reads 1.04858e+06), or N/A (-1). Older reports print the largest error
// instead (2e-07, below 1); the out-of-bounds footer judges those, so a
// value below 1 counts as 0.
func wrongOf(s string) int64 {
	if s == "N/A" {
		return -1
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return max(n, 0)
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 1 && f < 1e18 {
		return int64(f)
	}
	return 0
}

func isNumber(s string) bool {
	v, err := strconv.ParseFloat(s, 64)
	return err == nil && finite(v)
}

func finite(f float64) bool { return f-f == 0 }
