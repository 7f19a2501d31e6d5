package v1alpha1_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestTruncate(t *testing.T) {
	cases := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{name: "a string that fits is kept whole", s: "Healthy → Quarantined", n: 64, want: "Healthy → Quarantined"},
		{name: "a string exactly n bytes long is kept whole", s: "a→b", n: 5, want: "a→b"},
		{name: "ASCII is cut at n bytes", s: "abcdef", n: 3, want: "abc"},
		{name: "a cut inside → drops the whole arrow", s: "a→b", n: 2, want: "a"},
		{name: "a cut after the arrow's second byte drops it too", s: "a→b", n: 3, want: "a"},
		{name: "a cut right after the arrow keeps it", s: "a→b", n: 4, want: "a→"},
		{name: "a cut inside a four-byte rune drops it", s: "gpu🔥x", n: 6, want: "gpu"},
		{name: "a cut after a four-byte rune keeps it", s: "gpu🔥x", n: 7, want: "gpu🔥"},
		{name: "a cut inside a two-byte rune drops it", s: "café!", n: 4, want: "caf"},
		{name: "a string of only multi-byte runes may come out empty", s: "→", n: 2, want: ""},
		{name: "zero keeps nothing", s: "abc", n: 0, want: ""},
		{name: "a negative n keeps nothing", s: "abc", n: -1, want: ""},
		{name: "invalid bytes are kept and cut anywhere", s: "a\xff\xfe\xfd", n: 2, want: "a\xff"},
		{name: "a stray continuation byte before the cut does not move it", s: "ab\x80\x80cd", n: 4, want: "ab\x80\x80"},
		{name: "an incomplete sequence at the cut is cut anywhere", s: "ab\xe2\x86", n: 3, want: "ab\xe2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(gpuhealthv1alpha1.Truncate(tc.s, tc.n)).To(Equal(tc.want))
		})
	}
}

func FuzzTruncate(f *testing.F) {
	for _, s := range []string{"", "abc", "Healthy → Quarantined", "gpu🔥x", "café", "a\xff\xfe", "ab\x80\x80cd", "ab\xe2\x86"} {
		for _, n := range []int{-1, 0, 1, 2, 3, 4, 5, 64} {
			f.Add(s, n)
		}
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		got := gpuhealthv1alpha1.Truncate(s, n)
		if !strings.HasPrefix(s, got) {
			t.Fatalf("Truncate(%q, %d) = %q, not a prefix", s, n, got)
		}
		if len(got) > max(n, 0) && got != s {
			t.Fatalf("Truncate(%q, %d) = %q, longer than %d bytes", s, n, got, n)
		}
		if len(s) <= n && got != s {
			t.Fatalf("Truncate(%q, %d) = %q, but s fits", s, n, got)
		}
		if len(s) > n && len(got) < n-(utf8.UTFMax-1) {
			t.Fatalf("Truncate(%q, %d) = %q, cut more than a rune", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("Truncate(%q, %d) = %q, not valid UTF-8", s, n, got)
		}
	})
}

func TestFirstN(t *testing.T) {
	cases := []struct {
		name  string
		items []string
		n     int
		sep   string
		want  string
	}{
		{name: "no items make an empty string", items: nil, n: 3, sep: "; ", want: ""},
		{name: "fewer items than n are all joined", items: []string{"a", "b"}, n: 3, sep: "; ", want: "a; b"},
		{name: "exactly n items are all joined", items: []string{"a", "b", "c"}, n: 3, sep: "; ", want: "a; b; c"},
		{name: "more than n items name the rest as a count", items: []string{"a", "b", "c", "d", "e"}, n: 3, sep: "; ", want: "a; b; c; and 2 more"},
		{name: "the separator also precedes the count", items: []string{"p1", "p2", "p3", "p4"}, n: 3, sep: ", ", want: "p1, p2, p3, and 1 more"},
		{name: "n of zero gives only the count", items: []string{"a", "b"}, n: 0, sep: "; ", want: "2 more"},
		{name: "a negative n counts as zero", items: []string{"a"}, n: -1, sep: "; ", want: "1 more"},
		{name: "items are not cut", items: []string{"0 → 1", "1 → 2"}, n: 1, sep: "; ", want: "0 → 1; and 1 more"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(gpuhealthv1alpha1.FirstN(tc.items, tc.n, tc.sep)).To(Equal(tc.want))
		})
	}
}

func TestJoinMore(t *testing.T) {
	cases := []struct {
		name  string
		shown []string
		more  int
		want  string
	}{
		{name: "nothing more joins what is shown", shown: []string{"a", "b"}, more: 0, want: "a; b"},
		{name: "a negative count is nothing more", shown: []string{"a"}, more: -2, want: "a"},
		{name: "the count follows what is shown", shown: []string{"a", "b"}, more: 7, want: "a; b; and 7 more"},
		{name: "only a count when nothing is shown", shown: nil, more: 3, want: "3 more"},
		{name: "nothing at all is empty", shown: nil, more: 0, want: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(gpuhealthv1alpha1.JoinMore(tc.shown, tc.more, "; ")).To(Equal(tc.want))
		})
	}
}
