package metrics

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func TestBearer(t *testing.T) {
	cases := []struct {
		name   string
		header string
		token  string
		ok     bool
	}{
		{name: "a bearer token", header: "Bearer abc.def", token: "abc.def", ok: true},
		{name: "the scheme in any case", header: "bearer abc", token: "abc", ok: true},
		{name: "no header", header: ""},
		{name: "another scheme", header: "Basic dXNlcjpwYXNz"},
		{name: "the scheme without a token", header: "Bearer "},
		{name: "the scheme alone", header: "Bearer"},
		{name: "only blanks after the scheme", header: "Bearer    "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			token, ok := bearer(tc.header)
			g.Expect(ok).To(Equal(tc.ok))
			g.Expect(token).To(Equal(tc.token))
		})
	}
}

// FuzzBearer: any header either yields a non-empty token without
// surrounding blanks that the header contains, or nothing.
func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer  x ", "Basic y", "", "Bearer", "Bearer\tz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		token, ok := bearer(header)
		if !ok {
			if token != "" {
				t.Fatalf("no token, yet %q", token)
			}
			return
		}
		if token == "" || strings.TrimSpace(token) != token || !strings.Contains(header, token) {
			t.Fatalf("header %q gave token %q", header, token)
		}
	})
}
