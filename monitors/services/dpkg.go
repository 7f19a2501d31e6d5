package services

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DpkgStatusPath is the host's package database on Debian and Ubuntu, as
// the host sees it.
const DpkgStatusPath = "/var/lib/dpkg/status"

// maxDpkgLine is the longest line ParseDpkgStatus keeps. Package, Version
// and Status lines are short; longer lines are long descriptions or
// garbage, and only their start is looked at.
const maxDpkgLine = 64 << 10

// Debian's package name and version syntax (Debian Policy 5.6.1, 5.6.12),
// checked so that a damaged file does not yield names or versions that
// cannot be real. A version may carry an epoch ("1:") and a revision
// ("-0ubuntu1").
var (
	dpkgPackageName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	dpkgVersion     = regexp.MustCompile(`^[0-9A-Za-z.+~:_-]+$`)
)

// maxDpkgValue bounds a package name or version; real ones are far shorter.
const maxDpkgValue = 256

// ParseDpkgStatus reads a dpkg status file (/var/lib/dpkg/status) and
// returns the Version of each installed package by its Package name.
//
// The file is a list of stanzas separated by blank lines (lines of spaces
// and tabs count as blank); a stanza is "Name: value" fields, whose
// continuation lines start with a space or a tab (deb822(5)). Field names
// are matched without regard to case. A package is installed when its
// Status field's flag is "ok" and its status word "installed", whatever the
// selection ("install", or "hold" for a pinned package, or
// "deinstall"/"purge" not carried out yet): that is what dpkg-query's
// ${db:Status-Status} calls installed. A package installed for several
// architectures keeps the first stanza's version.
//
// It is lenient, because a file damaged or being rewritten by dpkg must not
// stop the agent: CRLF line ends are accepted, lines that are no field and
// comments ("#") are skipped, and a stanza whose Package or Version is not
// valid Debian syntax, or that repeats one of the fields used, is skipped
// (only the first 64 KiB of a longer line are looked at). The error is
// r's, other than io.EOF.
func ParseDpkgStatus(r io.Reader) (map[string]string, error) {
	br := bufio.NewReaderSize(r, 4096)
	out := map[string]string{}
	var st dpkgStanza
	for {
		line, truncated, err := readDpkgLine(br)
		if len(line) > 0 || !errors.Is(err, io.EOF) {
			st.line(line, truncated, out)
		}
		if err != nil {
			st.end(out)
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

// dpkgStanza collects the fields ParseDpkgStatus uses from one stanza.
type dpkgStanza struct {
	pkg, version, status string
	// seen holds which of the three fields the stanza had.
	seen [3]bool
	// invalid is set when a field used is repeated or too long.
	invalid bool
}

// line adds one line, without its line end, to the stanza; a blank line
// ends it.
func (st *dpkgStanza) line(line []byte, truncated bool, out map[string]string) {
	if len(bytes.Trim(line, " \t")) == 0 {
		st.end(out)
		return
	}
	if line[0] == ' ' || line[0] == '\t' || line[0] == '#' {
		return // a continuation line (no field used has one) or a comment
	}
	name, value, ok := bytes.Cut(line, []byte(":"))
	if !ok {
		return
	}
	var i int
	switch {
	case strings.EqualFold(string(name), "Package"):
		i = 0
	case strings.EqualFold(string(name), "Version"):
		i = 1
	case strings.EqualFold(string(name), "Status"):
		i = 2
	default:
		return
	}
	if st.seen[i] || truncated {
		st.invalid = true
	}
	st.seen[i] = true
	v := string(bytes.TrimSpace(value))
	switch i {
	case 0:
		st.pkg = v
	case 1:
		st.version = v
	case 2:
		st.status = v
	}
}

// end records the stanza's package when it is installed and valid, and
// starts a new stanza.
func (st *dpkgStanza) end(out map[string]string) {
	defer func() { *st = dpkgStanza{} }()
	if st.invalid || !validDpkgPackage(st.pkg) || !validDpkgVersion(st.version) || !dpkgInstalled(st.status) {
		return
	}
	if _, dup := out[st.pkg]; !dup {
		out[st.pkg] = st.version
	}
}

func validDpkgPackage(s string) bool {
	return len(s) <= maxDpkgValue && dpkgPackageName.MatchString(s)
}

func validDpkgVersion(s string) bool {
	return len(s) <= maxDpkgValue && dpkgVersion.MatchString(s)
}

// dpkgInstalled reads a Status field: "<selection> <flag> <status>".
func dpkgInstalled(status string) bool {
	f := strings.Fields(status)
	return len(f) == 3 && f[1] == "ok" && f[2] == "installed"
}

// readDpkgLine returns the next line without its line end ("\n" or
// "\r\n"), at most maxDpkgLine bytes of it (truncated says so; the rest is
// read and dropped), and io.EOF with the last line when it has no line
// end, or alone at the end.
func readDpkgLine(br *bufio.Reader) (line []byte, truncated bool, err error) {
	// Two bytes more than kept, for the line end.
	const keep = maxDpkgLine + 2
	total := 0
	for {
		chunk, err := br.ReadSlice('\n')
		total += len(chunk)
		if room := keep - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		truncated = total > len(line)
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > maxDpkgLine {
			line, truncated = line[:maxDpkgLine], true
		}
		return line, truncated, err
	}
}

// Names of the packages that install the daemons, in NVIDIA's CUDA
// repositories and in Ubuntu's archive: nvidia-fabricmanager-<branch> and
// nvidia-imex-<branch> (for example nvidia-fabricmanager-570), and the
// same without a branch in the repositories that dropped the branch from
// the name (NVIDIA's from branch 580, Ubuntu's from 590). Not counted:
// cuda-drivers-fabricmanager-<branch>, a meta-package that pulls in the
// driver and nvidia-fabricmanager-<branch>; nvidia-fabricmanager-dev-*,
// the SDK's headers; and nvlsm, NVLink Subnet Manager, versioned by date.
const (
	fabricManagerPackage = "nvidia-fabricmanager"
	imexPackage          = "nvidia-imex"
)

// Versions returns the versions of Fabric Manager and IMEX among installed
// packages (ParseDpkgStatus's result): the upstream part of the package
// version (without epoch and Debian revision: 580.159.03 for
// 580.159.03-0ubuntu0.25.10.1), which is the driver version they must
// match, as NVML and nvidia-smi print it. When several packages qualify (a
// transitional package beside the one it points to), the highest version
// wins. Empty means not installed.
func Versions(pkgs map[string]string) (fabricManager, imex string) {
	return newestUpstream(pkgs, fabricManagerPackage), newestUpstream(pkgs, imexPackage)
}

// newestUpstream is the highest upstream version of the packages named
// base or base-<branch>.
func newestUpstream(pkgs map[string]string, base string) string {
	var best string
	names := make([]string, 0, len(pkgs))
	for name := range pkgs {
		names = append(names, name)
	}
	slices.Sort(names) // equal versions: the result does not depend on map order
	for _, name := range names {
		if !isBranchPackage(name, base) {
			continue
		}
		if v := upstreamVersion(pkgs[name]); v != "" && (best == "" || compareVersions(v, best) > 0) {
			best = v
		}
	}
	return best
}

// isBranchPackage reports whether name is base or base-<digits>.
func isBranchPackage(name, base string) bool {
	if name == base {
		return true
	}
	branch, ok := strings.CutPrefix(name, base+"-")
	if !ok || branch == "" {
		return false
	}
	for _, c := range branch {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// upstreamVersion drops a Debian version's epoch ("1:") and revision (from
// the last "-").
func upstreamVersion(v string) string {
	if epoch, rest, ok := strings.Cut(v, ":"); ok {
		if _, err := strconv.ParseUint(epoch, 10, 32); err == nil {
			v = rest
		}
	}
	if i := strings.LastIndexByte(v, '-'); i > 0 {
		v = v[:i]
	}
	return v
}

// compareVersions compares dotted versions part by part, numerically where
// both parts are numbers; a version with more parts is higher when the
// others are equal. It is enough for NVIDIA's versions (580.159.03), not
// a full Debian version comparison.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		na, ea := strconv.ParseUint(pa[i], 10, 64)
		nb, eb := strconv.ParseUint(pb[i], 10, 64)
		var c int
		if ea == nil && eb == nil {
			c = cmp.Compare(na, nb)
		} else {
			c = strings.Compare(pa[i], pb[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(pa), len(pb))
}
