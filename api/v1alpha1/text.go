package v1alpha1

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Truncate returns the longest prefix of s that is at most n bytes long and
// does not end inside a UTF-8 sequence, so that a message cut to fit a
// field's MaxLength stays valid text: messages quote node names, pod names
// and kernel log lines, and contain "→". A negative n counts as zero.
//
// The bound is in bytes although the apiserver counts characters: it
// validates maxLength with utf8.RuneCount (k8s.io/kube-openapi
// pkg/validation/validate/values.go, MaxLength). A rune is at least one
// byte, so n bytes always pass a MaxLength of n, and the bytes bound also
// bounds what a status costs in etcd; the price is that text in other
// scripts is cut shorter than the schema would allow. Invalid UTF-8 in s
// is kept as it is (encoding/json sends each bad byte as one U+FFFD, one
// character), and cut between any two of its bytes.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	// The rune that straddles the cut starts at most utf8.UTFMax-1 bytes
	// before it; a bad byte decodes as a rune of size 1 and never does.
	for i := n - 1; i >= 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if _, size := utf8.DecodeRuneInString(s[i:]); i+size > n {
				return s[:i]
			}
			break
		}
	}
	return s[:n]
}

// FirstN joins the first n items with sep and says how many were left
// out, so that a message names a few examples and the total without
// growing with the list: FirstN([]string{"a", "b", "c", "d"}, 2, "; ") is
// "a; b; and 2 more". A negative n counts as zero.
func FirstN(items []string, n int, sep string) string {
	n = min(max(n, 0), len(items))
	return JoinMore(items[:n], len(items)-n, sep)
}

// JoinMore joins shown with sep and, when more is positive, appends
// "and <more> more" as one further item. It is FirstN for a caller that
// kept only the first items and counted the rest: JoinMore(nil, 3, "; ")
// is "3 more".
func JoinMore(shown []string, more int, sep string) string {
	if more <= 0 {
		return strings.Join(shown, sep)
	}
	if len(shown) == 0 {
		return strconv.Itoa(more) + " more"
	}
	return strings.Join(shown, sep) + sep + "and " + strconv.Itoa(more) + " more"
}
