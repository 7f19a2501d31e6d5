package services

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestParseStat(t *testing.T) {
	cases := []struct {
		name      string
		stat      string
		wantState byte
		wantStart uint64
		wantErr   string
	}{
		{
			name:      "a daemon's stat line",
			stat:      statLine(2100, "nv-fabricmanage", 'S', 1234567),
			wantState: 'S',
			wantStart: 1234567,
		},
		{
			name:      "a name with ') (' in it is read up to the last parenthesis",
			stat:      statLine(42, "x) (y", 'R', 777),
			wantState: 'R',
			wantStart: 777,
		},
		{
			name:      "a name of spaces, parentheses and a fake tail of fields",
			stat:      statLine(43, ") Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 (", 'D', 99),
			wantState: 'D',
			wantStart: 99,
		},
		{
			name:      "a zombie",
			stat:      statLine(44, "nvidia-imex", 'Z', 5),
			wantState: 'Z',
			wantStart: 5,
		},
		{
			name:    "no command name",
			stat:    "45 nvidia-imex S 1 45",
			wantErr: "no command name",
		},
		{
			name:    "cut short",
			stat:    "46 (nvidia-imex) S 1 46 46 0 -1",
			wantErr: "fields after the command name",
		},
		{
			name:    "a start time that is no number",
			stat:    strings.Replace(statLine(47, "a", 'S', 1), " 1 512000000 ", " x 512000000 ", 1),
			wantErr: "starttime",
		},
		{
			name:    "a state of two letters",
			stat:    strings.Replace(statLine(48, "a", 'S', 1), ") S ", ") SS ", 1),
			wantErr: "not one letter",
		},
		{
			name:    "empty",
			stat:    "",
			wantErr: "no command name",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			state, start, err := parseStat([]byte(tc.stat))
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(state).To(Equal(tc.wantState))
			g.Expect(start).To(Equal(tc.wantStart))
		})
	}
}

func TestScanProcs(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.start(100, "nvidia-imex", 50)
	h.start(101, "nvidia-imex", 40)
	h.process(102, "nvidia-imex", 'Z', 60)
	h.start(103, "bash", 70)
	// Exited between the listing and the reads: comm without stat, and a
	// directory without comm.
	h.write(filepath.Join(h.proc, "104", "comm"), "nvidia-imex\n")
	h.mkdir(filepath.Join(h.proc, "105"))
	// A stat that cannot be read.
	h.write(filepath.Join(h.proc, "106", "comm"), "nvidia-imex\n")
	h.write(filepath.Join(h.proc, "106", "stat"), "106 (nvidia-imex")
	h.mkdir(filepath.Join(h.proc, "sys"))

	got, err := scanProcs(h.proc, map[string]bool{"nvidia-imex": true, "nvidia-persiste": true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(map[string][]proc{"nvidia-imex": {{pid: 100, start: 50}, {pid: 101, start: 40}}}))

	_, err = scanProcs(filepath.Join(h.proc, "missing"), nil)
	g.Expect(errors.Is(err, fs.ErrNotExist)).To(BeTrue())
	empty := t.TempDir()
	_, err = scanProcs(empty, nil)
	g.Expect(err).To(MatchError(errNoProcesses))
}

func TestBootTime(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	boot, err := bootTime(h.proc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(boot).To(Equal(time.Unix(testBoot, 0)))
	at, ok := startedAt(boot, 12345)
	g.Expect(ok).To(BeTrue())
	g.Expect(at).To(Equal(time.Unix(testBoot+123, 450_000_000)))

	_, ok = startedAt(time.Time{}, 1)
	g.Expect(ok).To(BeFalse())
	_, ok = startedAt(boot, 1<<63)
	g.Expect(ok).To(BeFalse())

	g.Expect(os.WriteFile(filepath.Join(h.proc, "stat"), []byte("cpu 1 2 3\n"), 0o644)).To(Succeed())
	_, err = bootTime(h.proc)
	g.Expect(err).To(MatchError(ContainSubstring("no btime")))
	g.Expect(os.WriteFile(filepath.Join(h.proc, "stat"), []byte("btime soon\n"), 0o644)).To(Succeed())
	_, err = bootTime(h.proc)
	g.Expect(err).To(HaveOccurred())
}

func TestCommOf(t *testing.T) {
	g := NewWithT(t)
	g.Expect(commOf("nv-fabricmanager")).To(Equal("nv-fabricmanage"))
	g.Expect(commOf("nvidia-persistenced")).To(Equal("nvidia-persiste"))
	g.Expect(commOf("nvidia-imex")).To(Equal("nvidia-imex"))
}
