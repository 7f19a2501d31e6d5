package imex

import (
	"errors"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// Domain outputs in the shape nvidia-imex-ctl -N -j prints.
const (
	domainUp = `{"nodes":{
	"0":{"status":"READY","host":"10.0.0.1","connections":{"0":{"host":"10.0.0.1","status":"CONNECTED","changed":true},"1":{"host":"10.0.0.2","status":"CONNECTED","changed":true}},"changed":true,"version":"580.95.05","hostName":""},
	"1":{"status":"READY","host":"10.0.0.2","connections":{"0":{"host":"10.0.0.1","status":"CONNECTED","changed":true},"1":{"host":"10.0.0.2","status":"CONNECTED","changed":true}},"changed":true,"version":"580.95.05","hostName":""}},
	"timestamp":"9/4/2026 00:37:39.905",
	"status":"UP"}`
	domainDown = `{"nodes":{
	"0":{"status":"UNAVAILABLE","host":"10.0.0.1","connections":{"1":{"host":"10.0.0.2","status":"INVALID","changed":true}},"hostName":"gpu-a"},
	"1":{"status":"UNAVAILABLE","host":"10.0.0.2","connections":{"0":{"host":"10.0.0.1","status":"INVALID","changed":true}},"hostName":"gpu-b"}},
	"timestamp":"9/4/2026 00:37:39.905",
	"status":"DOWN"}`
	domainDegraded = `{"nodes":{
	"3":{"status":"READY","host":"10.76.186.255"},
	"10":{"status":"UNAVAILABLE","host":"10.76.189.233"},
	"5":{"status":"READY","host":"10.76.189.234"}},
	"timestamp":"5/22/2026 19:46:40.891",
	"status":"DEGRADED"}`
)

func TestParseDaemonStatus(t *testing.T) {
	cases := []struct {
		name    string
		out     string
		want    string
		wantErr string
	}{
		{name: "READY with a newline is READY.", out: "READY\n", want: "READY"},
		{name: "A state in lower case is upper-cased.", out: "ready", want: "READY"},
		{name: "Surrounding white space is dropped.", out: "  SHUTTING_DOWN  \r\n", want: "SHUTTING_DOWN"},
		{name: "UNAVAILABLE is a state.", out: "UNAVAILABLE\n", want: "UNAVAILABLE"},
		{name: "WAITING_FOR_RECOVERY is a state.", out: "WAITING_FOR_RECOVERY\n", want: "WAITING_FOR_RECOVERY"},
		{name: "An unknown single word is passed on as the state.", out: "NEW_STATE_2\n", want: "NEW_STATE_2"},
		{name: "Empty output is malformed.", out: "", wantErr: "empty"},
		{name: "White space alone is malformed.", out: " \n\t", wantErr: "empty"},
		{name: "A sentence is malformed.", out: "Connection refused by 10.0.0.1\n", wantErr: "not one word"},
		{name: "Two lines are malformed.", out: "READY\nREADY\n", wantErr: "not one word"},
		{name: "JSON is malformed.", out: `{"status":"READY"}`, wantErr: "not one word"},
		{name: "A number is malformed.", out: "5\n", wantErr: "not a state word"},
		{name: "A very long word is malformed.", out: strings.Repeat("A", 41), wantErr: "longer than 40"},
		{name: "Binary garbage is malformed.", out: "\x00\xff\xfe", wantErr: "not one word"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := ParseDaemonStatus([]byte(tc.out))
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ErrMalformed))
				g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestParseDomainStatus(t *testing.T) {
	cases := []struct {
		name    string
		out     string
		want    DomainStatus
		wantErr string
	}{
		{
			name: "An UP domain lists its nodes.",
			out:  domainUp,
			want: DomainStatus{State: DomainUp, Nodes: []NodeStatus{
				{Index: "0", Host: "10.0.0.1", Status: "READY"},
				{Index: "1", Host: "10.0.0.2", Status: "READY"},
			}},
		},
		{
			name: "A DOWN domain keeps host names.",
			out:  domainDown,
			want: DomainStatus{State: DomainDown, Nodes: []NodeStatus{
				{Index: "0", Host: "10.0.0.1", HostName: "gpu-a", Status: "UNAVAILABLE"},
				{Index: "1", Host: "10.0.0.2", HostName: "gpu-b", Status: "UNAVAILABLE"},
			}},
		},
		{
			name: "A DEGRADED domain sorts its nodes by number.",
			out:  domainDegraded,
			want: DomainStatus{State: DomainDegraded, Nodes: []NodeStatus{
				{Index: "3", Host: "10.76.186.255", Status: "READY"},
				{Index: "5", Host: "10.76.189.234", Status: "READY"},
				{Index: "10", Host: "10.76.189.233", Status: "UNAVAILABLE"},
			}},
		},
		{
			name: "The overall status decides even when the nodes disagree.",
			out:  `{"nodes":{"0":{"status":"UNAVAILABLE"}},"status":"up"}`,
			want: DomainStatus{State: DomainUp, Nodes: []NodeStatus{{Index: "0", Status: "UNAVAILABLE"}}},
		},
		{
			name: "An overall status without nodes is enough.",
			out:  `{"timestamp":"test","status":"DEGRADED"}`,
			want: DomainStatus{State: DomainDegraded},
		},
		{
			name: "Nodes of an unexpected shape are dropped when the overall status is there.",
			out:  `{"nodes":"all of them","status":"UP"}`,
			want: DomainStatus{State: DomainUp},
		},
		{
			name: "Without an overall status, all nodes connected is UP.",
			out:  `{"nodes":{"0":{"status":"Connected","host":"10.0.0.1"},"1":{"status":"READY","host":"10.0.0.2"}}}`,
			want: DomainStatus{State: DomainUp, Derived: true, Nodes: []NodeStatus{
				{Index: "0", Host: "10.0.0.1", Status: "CONNECTED"},
				{Index: "1", Host: "10.0.0.2", Status: "READY"},
			}},
		},
		{
			name: "Without an overall status, some nodes not connected is DEGRADED.",
			out:  `{"nodes":[{"status":"Connected","host":"10.0.0.1"},{"status":"Invalid","host":"10.0.0.2"}]}`,
			want: DomainStatus{State: DomainDegraded, Derived: true, Nodes: []NodeStatus{
				{Index: "0", Host: "10.0.0.1", Status: "CONNECTED"},
				{Index: "1", Host: "10.0.0.2", Status: "INVALID"},
			}},
		},
		{
			name: "Without an overall status, no node connected is DOWN.",
			out:  `{"nodes":{"0":{"status":"Invalid"},"1":{}}}`,
			want: DomainStatus{State: DomainDown, Derived: true, Nodes: []NodeStatus{
				{Index: "0", Status: "INVALID"},
				{Index: "1"},
			}},
		},
		{
			name: "A null status is derived from the nodes.",
			out:  `{"nodes":{"0":{"status":"READY"}},"status":null}`,
			want: DomainStatus{State: DomainUp, Derived: true, Nodes: []NodeStatus{{Index: "0", Status: "READY"}}},
		},
		{name: "Truncated JSON is malformed.", out: domainUp[:len(domainUp)/2], wantErr: "decoding domain status"},
		{name: "Garbage is malformed.", out: "Connection refused", wantErr: "not a JSON object"},
		{name: "Empty output is malformed.", out: "", wantErr: "not a JSON object"},
		{name: "A JSON list is malformed.", out: `[{"status":"UP"}]`, wantErr: "not a JSON object"},
		{name: "An unknown overall status is malformed.", out: `{"status":"UNAVAILABLE"}`, wantErr: "unknown domain status"},
		{name: "A numeric overall status is malformed.", out: `{"status":3}`, wantErr: "decoding domain status"},
		{name: "No status and no nodes is malformed.", out: `{"timestamp":"test"}`, wantErr: "neither a status nor nodes"},
		{name: "No status and an empty node list is malformed.", out: `{"nodes":{}}`, wantErr: "neither a status nor nodes"},
		{name: "No status and nodes of an unexpected shape is malformed.", out: `{"nodes":42}`, wantErr: "neither an object nor a list"},
		{name: "No status and a node that is not an object is malformed.", out: `{"nodes":{"0":"READY"}}`, wantErr: "decoding domain nodes"},
		{name: "Trailing garbage after the object is malformed.", out: domainUp + " garbage", wantErr: "decoding domain status"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := ParseDomainStatus([]byte(tc.out))
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ErrMalformed))
				g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// nvidia-imex-ctl exits 255 with this message on a node whose IMEX is not
// configured; it is a state of the node, not malformed output.
func TestParseNotConfigured(t *testing.T) {
	cases := []struct {
		name string
		out  string
	}{
		{name: "The message alone is not configured.", out: "Failed to read node configuration file\n"},
		{name: "The message with the file's name is not configured.", out: "Failed to read node configuration file /etc/nvidia-imex/nodes_config.cfg\n"},
		{name: "The message after other lines is not configured.", out: "IMEX Log initializing at: 9/4/2026 00:37:39.905\nFailed to read node configuration file\n"},
		{name: "The message in another case is not configured.", out: "FAILED TO READ NODE CONFIGURATION FILE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := ParseDaemonStatus([]byte(tc.out))
			g.Expect(err).To(MatchError(ErrNotConfigured))
			g.Expect(err).NotTo(MatchError(ErrMalformed))
			_, err = ParseDomainStatus([]byte(tc.out))
			g.Expect(err).To(MatchError(ErrNotConfigured))
			g.Expect(err).NotTo(MatchError(ErrMalformed))
		})
	}
	// A JSON domain status that happens to contain the words is read as JSON.
	d, err := ParseDomainStatus([]byte(`{"status":"UP","note":"Failed to read node configuration file"}`))
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(d.State).To(Equal(DomainUp))
}

func TestDomainMessage(t *testing.T) {
	cases := []struct {
		name string
		out  string
		want string
	}{
		{
			name: "A DOWN domain names the nodes that are not ready by host name.",
			out:  domainDown,
			want: "IMEX domain is DOWN: 0 of 2 nodes ready (gpu-a UNAVAILABLE, gpu-b UNAVAILABLE)",
		},
		{
			name: "A DEGRADED domain names the nodes that are not ready by address.",
			out:  domainDegraded,
			want: "IMEX domain is DEGRADED: 2 of 3 nodes ready (10.76.189.233 UNAVAILABLE)",
		},
		{
			name: "A domain without nodes has only its state.",
			out:  `{"status":"DOWN"}`,
			want: "IMEX domain is DOWN",
		},
		{
			name: "A node without address or status is named by its index.",
			out:  `{"nodes":{"7":{}},"status":"DOWN"}`,
			want: "IMEX domain is DOWN: 0 of 1 nodes ready (node 7 no status)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			d, err := ParseDomainStatus([]byte(tc.out))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(domainMessage(d)).To(Equal(tc.want))
		})
	}
}

func FuzzParseDaemonStatus(f *testing.F) {
	for _, s := range []string{
		"READY\n", "UNAVAILABLE", " shutting_down \n", "", "5", "\xff",
		"Failed to read node configuration file", "Failed to read node configuration file\n",
		"IMEX Log initializing\nFailed to read node configuration file /etc/nvidia-imex/nodes_config.cfg\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		state, err := ParseDaemonStatus(out)
		if err != nil {
			if errors.Is(err, ErrMalformed) == errors.Is(err, ErrNotConfigured) {
				t.Fatalf("ParseDaemonStatus(%q) error %v wraps not exactly one of ErrMalformed and ErrNotConfigured", out, err)
			}
			return
		}
		if state == "" || len(state) > maxStateLength || state != strings.ToUpper(state) || strings.ContainsAny(state, " \t\r\n") {
			t.Fatalf("ParseDaemonStatus(%q) = %q is not a state word", out, state)
		}
	})
}

func FuzzParseDomainStatus(f *testing.F) {
	for _, s := range []string{
		domainUp, domainDown, domainDegraded,
		domainUp[:len(domainUp)/2],
		`{"nodes":[{"status":"Connected"},{"status":"Invalid"}]}`,
		`{"nodes":{"0":"READY"}}`,
		`{"status":null}`,
		`{"status":3}`,
		"Failed to read node configuration file",
		"Failed to read node configuration file\n",
		`{"status":"UP","note":"Failed to read node configuration file"}`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		d, err := ParseDomainStatus(out)
		if err != nil {
			if errors.Is(err, ErrMalformed) == errors.Is(err, ErrNotConfigured) {
				t.Fatalf("ParseDomainStatus(%q) error %v wraps not exactly one of ErrMalformed and ErrNotConfigured", out, err)
			}
			return
		}
		switch d.State {
		case DomainUp, DomainDown, DomainDegraded:
		default:
			t.Fatalf("ParseDomainStatus(%q) state %q is not a domain state", out, d.State)
		}
		if d.Derived && len(d.Nodes) == 0 {
			t.Fatalf("ParseDomainStatus(%q) derived a state from no nodes", out)
		}
		if ready := d.ReadyNodes(); ready < 0 || ready > len(d.Nodes) {
			t.Fatalf("ParseDomainStatus(%q) counts %d ready of %d", out, ready, len(d.Nodes))
		}
		_ = domainMessage(d)
	})
}
