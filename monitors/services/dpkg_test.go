package services

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	. "github.com/onsi/gomega"
)

// readTestdata returns a file of testdata.
func readTestdata(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

func TestParseDpkgStatus(t *testing.T) {
	hostFile := readTestdata(t, "dpkg-status")
	hostWant := map[string]string{
		"base-files":                      "13ubuntu10.3",
		"libc6":                           "2.39-0ubuntu8.4",
		"nvidia-fabricmanager-570":        "570.172.08-0ubuntu1",
		"cuda-drivers-fabricmanager-570":  "570.172.08-0ubuntu1",
		"nvidia-fabricmanager-550":        "570.172.08-0ubuntu1",
		"nvidia-imex-570":                 "570.172.08-0ubuntu1",
		"nvlsm":                           "2025.10.14-1",
		"nvidia-compute-utils-570-server": "570.172.08-0ubuntu0.24.04.1",
	}
	long := strings.Repeat("x", 3*maxDpkgLine)
	cases := []struct {
		name string
		in   string
		want map[string]string
	}{
		{
			name: "a host's status file: installed and held packages, not removed or half-configured ones",
			in:   hostFile,
			want: hostWant,
		},
		{
			name: "the same with CRLF line ends",
			in:   strings.ReplaceAll(hostFile, "\n", "\r\n"),
			want: hostWant,
		},
		{
			name: "the last stanza without a final line end",
			in:   "Package: a1\nStatus: install ok installed\nVersion: 1.0",
			want: map[string]string{"a1": "1.0"},
		},
		{
			name: "stanzas separated by a line of blanks, extra blank lines, fields in any case and order",
			in:   "\n\nversion:  2:1.2-3 \npackage: b1\nSTATUS: install  ok  installed\n \t \nPackage: b2\nVersion: 0.1\nStatus: install ok installed\n\n\n",
			want: map[string]string{"b1": "2:1.2-3", "b2": "0.1"},
		},
		{
			name: "continuation lines that look like fields belong to the field before",
			in:   "Package: c1\nDescription: a\n Package: evil\n Version: 9\n Status: install ok installed\nStatus: install ok installed\nVersion: 1\n",
			want: map[string]string{"c1": "1"},
		},
		{
			name: "garbage lines and comments are skipped",
			in:   "# comment\n\x00\xff\xfe\nno colon here\nPackage: d1\n:\nVersion: 1\nStatus: install ok installed\n",
			want: map[string]string{"d1": "1"},
		},
		{
			name: "a stanza that repeats a field used is skipped",
			in:   "Package: e1\nVersion: 1\nVersion: 2\nStatus: install ok installed\n\nPackage: e2\nVersion: 1\nStatus: install ok installed\n",
			want: map[string]string{"e2": "1"},
		},
		{
			name: "names and versions that are not Debian's syntax are skipped",
			in: "Package: F1\nVersion: 1\nStatus: install ok installed\n\n" +
				"Package: f\nVersion: 1\nStatus: install ok installed\n\n" +
				"Package: f3\nVersion: 1 2\nStatus: install ok installed\n\n" +
				"Package: f4\nVersion:\nStatus: install ok installed\n\n" +
				"Package: f5\nStatus: install ok installed\n\n" +
				"Package: f6\nVersion: 1\n\n" +
				"Package: f7\nVersion: 1\nStatus: install reinstreq installed\n\n" +
				"Package: f8\nVersion: 1\nStatus: installed\n\n" +
				"Package: f9\nVersion: 1.0~rc1+dfsg-2\nStatus: install ok installed\n",
			want: map[string]string{"f9": "1.0~rc1+dfsg-2"},
		},
		{
			name: "a huge description does not matter; a huge version skips its stanza",
			in: "Package: g1\nVersion: 1\nStatus: install ok installed\nDescription: " + long + "\n " + long + "\n\n" +
				"Package: g2\nVersion: 1" + long + "\nStatus: install ok installed\n\n" +
				"Package: g3\nVersion: 3\nStatus: install ok installed\n",
			want: map[string]string{"g1": "1", "g3": "3"},
		},
		{
			name: "a line exactly as long as kept, then a field",
			in:   "Package: h1\nVersion: 1\nStatus: install ok installed\nX-Long: " + strings.Repeat("y", maxDpkgLine-len("X-Long: ")) + "\nX-Other: 1\n",
			want: map[string]string{"h1": "1"},
		},
		{
			name: "empty",
			in:   "",
			want: map[string]string{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := ParseDpkgStatus(strings.NewReader(tc.in))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
			// Read a byte at a time, the result is the same.
			got, err = ParseDpkgStatus(iotest.OneByteReader(strings.NewReader(tc.in)))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestParseDpkgStatusReadError(t *testing.T) {
	g := NewWithT(t)
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("Package: a1\nVersion: 1\nStatus: install ok installed\n\nPackage: a2\n"), iotest.ErrReader(boom))
	got, err := ParseDpkgStatus(r)
	g.Expect(err).To(MatchError(boom))
	g.Expect(got).To(Equal(map[string]string{"a1": "1"}))
}

func TestVersions(t *testing.T) {
	cases := []struct {
		name     string
		pkgs     map[string]string
		wantFM   string
		wantIMEX string
	}{
		{
			name: "branch packages of Ubuntu's archive; the meta-package and the SDK are not counted",
			pkgs: map[string]string{
				"nvidia-fabricmanager-570":       "570.172.08-0ubuntu1",
				"cuda-drivers-fabricmanager-570": "570.999.99-0ubuntu1",
				"nvidia-fabricmanager-dev-570":   "570.999.99-0ubuntu1",
				"nvidia-imex-570":                "1:570.172.08-0ubuntu1",
				"nvidia-imex-ctl":                "999",
			},
			wantFM:   "570.172.08",
			wantIMEX: "570.172.08",
		},
		{
			name:     "unversioned names of NVIDIA's repository",
			pkgs:     map[string]string{"nvidia-fabricmanager": "580.105.08-1", "nvidia-imex": "580.105.08-1"},
			wantFM:   "580.105.08",
			wantIMEX: "580.105.08",
		},
		{
			name: "a transitional package beside the real one: the highest version wins, numerically",
			pkgs: map[string]string{
				"nvidia-fabricmanager-525": "525.125.06-0ubuntu1",
				"nvidia-fabricmanager-535": "535.309.01-0ubuntu0.24.04.1",
				"nvidia-fabricmanager":     "535.54.03-1",
			},
			wantFM: "535.309.01",
		},
		{
			name: "neither installed",
			pkgs: map[string]string{"nvidia-fabricmanager-": "1", "nvidia-fabricmanagerx": "2", "nvlsm": "2025.10.14-1", "libc6": "2.39-0ubuntu8.4"},
		},
		{
			name: "nil",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fm, imex := Versions(tc.pkgs)
			g.Expect(fm).To(Equal(tc.wantFM))
			g.Expect(imex).To(Equal(tc.wantIMEX))
		})
	}
}

func TestVersionsOfTheTestdataFile(t *testing.T) {
	g := NewWithT(t)
	pkgs, err := ParseDpkgStatus(strings.NewReader(readTestdata(t, "dpkg-status")))
	g.Expect(err).NotTo(HaveOccurred())
	fm, imex := Versions(pkgs)
	g.Expect(fm).To(Equal("570.172.08"))
	g.Expect(imex).To(Equal("570.172.08"))
}

func TestCompareVersions(t *testing.T) {
	g := NewWithT(t)
	g.Expect(compareVersions("580.159.03", "580.65.06")).To(Equal(1))
	g.Expect(compareVersions("570.172.08", "570.172.08")).To(Equal(0))
	g.Expect(compareVersions("570.172", "570.172.08")).To(Equal(-1))
	g.Expect(compareVersions("570.rc1", "570.rc2")).To(Equal(-1))
	g.Expect(upstreamVersion("1:2.3-4-5")).To(Equal("2.3-4"))
	g.Expect(upstreamVersion("x:2.3")).To(Equal("x:2.3"))
	g.Expect(upstreamVersion("13ubuntu10.3")).To(Equal("13ubuntu10.3"))
}

// renderDpkgStatus writes packages as a well-formed status file.
func renderDpkgStatus(pkgs map[string]string) string {
	names := make([]string, 0, len(pkgs))
	for n := range pkgs {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "Package: %s\nStatus: install ok installed\nVersion: %s\nDescription: d\n more\n\n", n, pkgs[n])
	}
	return b.String()
}

func FuzzParseDpkgStatus(f *testing.F) {
	host := readTestdata(f, "dpkg-status")
	for _, s := range []string{
		host,
		strings.ReplaceAll(host, "\n", "\r\n"),
		host[:len(host)/2],
		"Package: a1\nStatus: install ok installed\nVersion: 1.0",
		"Package: a1\nVersion: 1\nVersion: 2\nStatus: install ok installed\n",
		"package:b1\nversion:1\nstatus:hold ok installed\n \nPackage: b2\n",
		" Package: c1\n\tVersion: 1\n",
		"\x00\xff:\n:\n\n\r\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// A bytes reader never fails, so neither may the parser.
		pkgs, err := ParseDpkgStatus(strings.NewReader(string(in)))
		if err != nil {
			t.Fatalf("ParseDpkgStatus(%q) error %v", in, err)
		}
		for name, version := range pkgs {
			if !validDpkgPackage(name) || !validDpkgVersion(version) {
				t.Fatalf("ParseDpkgStatus(%q) returned package %q version %q", in, name, version)
			}
		}
		// What it returned, written out well-formed, reads back the same.
		again, err := ParseDpkgStatus(strings.NewReader(renderDpkgStatus(pkgs)))
		if err != nil || len(again) != len(pkgs) {
			t.Fatalf("ParseDpkgStatus of the rendering of %v = %v, %v", pkgs, again, err)
		}
		for name, version := range pkgs {
			if again[name] != version {
				t.Fatalf("ParseDpkgStatus of the rendering of %v = %v", pkgs, again)
			}
		}
		fm, imex := Versions(pkgs)
		if strings.ContainsAny(fm+imex, " \t\r\n") {
			t.Fatalf("Versions(%v) = %q, %q", pkgs, fm, imex)
		}
	})
}
