package xid

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// NVLink5 is what an XID 144 to 150 line says after the number. NVIDIA's
// format: "<subcode> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<IntrInfo>
// <ErrorStatus> <debug data>…)", sometimes after "pid=…, name=…, ".
type NVLink5 struct {
	// Subcode is the unit mnemonic, for example RLW_REMAP.
	Subcode string
	// Flag is "Fatal" or "Nonfatal" as printed; empty when missing.
	Flag string
	// Link is the link number, -1 when the line names none.
	Link int
	// IntrInfo and ErrorStatus are the first two registers; HasRegisters
	// says whether the line carried them.
	IntrInfo, ErrorStatus uint32
	HasRegisters          bool
}

var (
	nvlink5Flag = regexp.MustCompile(`(?:^|[\s,])([A-Za-z0-9_/]+)\s+(Fatal|Nonfatal|Non-fatal)\b`)
	nvlink5Link = regexp.MustCompile(`\bLink\s+(-?\d{1,4})\b`)
	nvlink5Regs = regexp.MustCompile(`\(\s*0x([0-9a-fA-F]{1,8})\s+0x([0-9a-fA-F]{1,8})`)
)

// ParseNVLink5 reads an NVLink5 XID line's text. ok is false when it has
// neither a severity flag nor registers.
func ParseNVLink5(message string) (NVLink5, bool) {
	n := NVLink5{Link: -1}
	if m := nvlink5Flag.FindStringSubmatch(message); m != nil {
		n.Subcode, n.Flag = m[1], m[2]
		if n.Flag == "Non-fatal" {
			n.Flag = "Nonfatal"
		}
	}
	if m := nvlink5Link.FindStringSubmatch(message); m != nil {
		n.Link, _ = strconv.Atoi(m[1])
	}
	if m := nvlink5Regs.FindStringSubmatch(message); m != nil {
		a, _ := strconv.ParseUint(m[1], 16, 32)
		b, _ := strconv.ParseUint(m[2], 16, 32)
		n.IntrInfo, n.ErrorStatus, n.HasRegisters = uint32(a), uint32(b), true
	}
	return n, n.Flag != "" || n.HasRegisters
}

// bitPattern is a decode sheet IntrInfo pattern: the bits that matter and
// their values.
type bitPattern struct {
	care, value uint32
	ok          bool
}

// compilePattern reads a pattern of '0', '1' and '-', most significant bit
// first, at most 32 long.
func compilePattern(s string) bitPattern {
	if s == "" || len(s) > 32 {
		return bitPattern{}
	}
	var p bitPattern
	for _, c := range s {
		p.care <<= 1
		p.value <<= 1
		switch c {
		case '0':
			p.care |= 1
		case '1':
			p.care |= 1
			p.value |= 1
		case '-':
		default:
			return bitPattern{}
		}
	}
	p.ok = true
	return p
}

func (p bitPattern) matches(v uint32) bool { return p.ok && v&p.care == p.value }

// compiledRow is a decode row ready to match.
type compiledRow struct {
	row              *DecodeRow
	v1, v2           bitPattern
	v1Alt, v2Alt     bitPattern
	statuses         []uint32 // empty: any
	statusUnreadable bool
}

var compiledRows = func() []compiledRow {
	out := make([]compiledRow, 0, len(decodeRows))
	for i := range decodeRows {
		r := &decodeRows[i]
		c := compiledRow{
			row: r,
			v1:  compilePattern(r.V1IntrInfo), v2: compilePattern(r.V2IntrInfo),
			v1Alt: compilePattern(r.V1Action2IntrInfo), v2Alt: compilePattern(r.V2Action2IntrInfo),
		}
		for _, s := range strings.Split(r.ErrorStatus, "/") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 32)
			if err != nil {
				c.statusUnreadable = true
				continue
			}
			c.statuses = append(c.statuses, uint32(v))
		}
		out = append(out, c)
	}
	return out
}()

// bucketRank orders the decode sheet's recovery actions by how much they do.
func bucketRank(b string) int {
	switch b {
	case bucketResetGPU:
		return 3
	case bucket154Eval:
		return 2
	case bucketIgnore:
		return 1
	}
	return 0
}

// Decode matches an NVLink5 XID's registers against NVIDIA's decode sheet,
// under both IntrInfo layouts (drivers before R575 and from R575 on; the
// line does not say which driver printed it). It returns the matched row
// and its recovery action (Action2 where its pattern matches); when rows
// under both layouts match, the one that does most wins. ok is false when
// no row matches.
func Decode(code int, n NVLink5) (row DecodeRow, layout string, action string, ok bool) {
	if !n.HasRegisters {
		return DecodeRow{}, "", "", false
	}
	best := -1
	for _, c := range compiledRows {
		named := 0
		if n.Subcode != "" && slices.Contains(strings.Split(c.row.Subcode, "/"), n.Subcode) {
			named = 10 // a row of the unit the line names beats a pattern match alone
		}
		if c.row.XID != code || c.statusUnreadable && len(c.statuses) == 0 {
			continue
		}
		if len(c.statuses) > 0 && !slices.Contains(c.statuses, n.ErrorStatus) {
			continue
		}
		for _, l := range []struct {
			name      string
			main, alt bitPattern
		}{{"V1 (<R575)", c.v1, c.v1Alt}, {"V2 (>=R575)", c.v2, c.v2Alt}} {
			if !l.main.matches(n.IntrInfo) && !l.alt.matches(n.IntrInfo) {
				continue
			}
			a := c.row.Immediate
			if l.alt.matches(n.IntrInfo) && c.row.Action2 != "" {
				a = c.row.Action2
			}
			if r := named + bucketRank(a); r > best {
				best, row, layout, action, ok = r, *c.row, l.name, a, true
			}
		}
	}
	return row, layout, action, ok
}

// decodeNVLink5 is NVIDIA's WORKFLOW_NVLINK5_ERR: the recovery action comes
// from the decode sheet row the line's registers match, else from the
// line's Fatal / Nonfatal flag.
func decodeNVLink5(code int, message string) (verdict, string) {
	n, parsed := ParseNVLink5(message)
	if row, layout, action, ok := Decode(code, n); ok {
		v, known := buckets[action]
		if !known {
			v = verdict{fatal, contactSupport, ""}
		}
		sev := row.Severity
		if sev == "" {
			sev = "no severity"
		}
		v.reason = fmt.Sprintf("NVLink5 decode: %s IntrInfo 0x%08x error status 0x%08x matches %s (%s, %s layout): %s",
			row.Subcode, n.IntrInfo, n.ErrorStatus, action, sev, layout, v.reason)
		return v, "DECODE_" + action
	}
	switch {
	case n.Flag == "Fatal":
		return verdict{fatal, resetGPU, "NVLink5 error the decode sheet does not match; the line says Fatal, and a fatal NVLink error leaves the GPU needing a reset"}, bucketNVLink5
	case n.Flag == "Nonfatal":
		return verdict{degraded, none, "NVLink5 error the decode sheet does not match; the line says Nonfatal: recorded, no action"}, bucketNVLink5
	case !parsed:
		return verdict{degraded, recertify, "NVLink5 error without the driver's registers (NVML carries none): recertification checks the links"}, bucketNVLink5
	}
	return verdict{degraded, recertify, "NVLink5 error without a severity flag the decode sheet does not match: recertification checks the links"}, bucketNVLink5
}
