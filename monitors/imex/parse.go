package imex

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// DaemonReady is the state `nvidia-imex-ctl -q` prints when the local IMEX
// daemon is ready. The other states DCGM documents for it are INITIALIZING,
// STARTING_AUTH_SERVER, WAITING_FOR_PEERS, WAITING_FOR_RECOVERY, INIT_GPU,
// SHUTTING_DOWN and UNAVAILABLE.
const DaemonReady = "READY"

// maxStateLength bounds a daemon state word. The longest known one,
// WAITING_FOR_RECOVERY, has 20 characters; the state becomes a finding's code.
const maxStateLength = 40

// ErrMalformed marks output of nvidia-imex-ctl that this package does not
// understand: garbage, truncated JSON, an unknown domain status.
var ErrMalformed = errors.New("malformed nvidia-imex-ctl output")

// ErrNotConfigured marks output of nvidia-imex-ctl saying that IMEX is not
// configured where it looked: it could not read the daemon's node
// configuration file. That is a state of the node, not a fault.
var ErrNotConfigured = errors.New("IMEX is not configured")

// notConfiguredMessage is what nvidia-imex-ctl prints (and exits 255) when
// the node configuration file it needs cannot be read, for example on a node
// where IMEX was never set up.
const notConfiguredMessage = "failed to read node configuration file"

// isNotConfigured reports whether output of nvidia-imex-ctl says that the
// node configuration file could not be read, in any case.
func isNotConfigured(out []byte) bool {
	return bytes.Contains(bytes.ToLower(out), []byte(notConfiguredMessage))
}

// ParseDaemonStatus reads the output of `nvidia-imex-ctl -q`: one state word
// such as READY or UNAVAILABLE, with optional surrounding white space. It
// returns the word in upper case. Output that says the node configuration
// file could not be read ("Failed to read node configuration file") is an
// error wrapping ErrNotConfigured. Anything else (no word, several words, a
// word with characters other than letters, digits and underscores, or one
// longer than 40 characters) is an error wrapping ErrMalformed.
func ParseDaemonStatus(out []byte) (string, error) {
	if isNotConfigured(out) {
		return "", fmt.Errorf("%w: %q", ErrNotConfigured, excerpt(string(bytes.TrimSpace(out))))
	}
	s := string(bytes.TrimSpace(out))
	if s == "" {
		return "", fmt.Errorf("%w: empty daemon status", ErrMalformed)
	}
	if len(s) > maxStateLength {
		return "", fmt.Errorf("%w: daemon status %q is longer than %d characters", ErrMalformed, excerpt(s), maxStateLength)
	}
	for _, c := range s {
		if !isWordChar(c) {
			return "", fmt.Errorf("%w: daemon status %q is not one word", ErrMalformed, excerpt(s))
		}
	}
	if c := s[0]; c >= '0' && c <= '9' {
		return "", fmt.Errorf("%w: daemon status %q is not a state word", ErrMalformed, s)
	}
	return strings.ToUpper(s), nil
}

// isWordChar reports whether c may appear in a state word.
func isWordChar(c rune) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}

// DomainState is the IMEX domain's overall state.
type DomainState string

const (
	// DomainUp means every node of the domain is ready and connected.
	DomainUp DomainState = "UP"
	// DomainDegraded means some nodes of the domain are not.
	DomainDegraded DomainState = "DEGRADED"
	// DomainDown means the domain does not work.
	DomainDown DomainState = "DOWN"
)

// DomainStatus is what `nvidia-imex-ctl -N -j` says about the IMEX domain.
type DomainStatus struct {
	// State is the domain's overall state.
	State DomainState
	// Derived is true when the output had no overall status and State was
	// derived from the nodes: DOWN when none is ready, DEGRADED when some
	// are not, UP when all are.
	Derived bool
	// Nodes are the domain's nodes as the local daemon sees them, sorted by
	// Index. Nil when the output listed none, or when the overall status was
	// present and the node entries could not be read.
	Nodes []NodeStatus
}

// NodeStatus is one node of the IMEX domain.
type NodeStatus struct {
	// Index is the node's key in the output (its line in the daemon's
	// nodes_config.cfg), or its position when the nodes are a list.
	Index string
	// Host is the node's IP address.
	Host string
	// HostName is the node's host name; empty unless nvidia-imex-ctl ran
	// with -H.
	HostName string
	// Status is the node's status in upper case, for example READY,
	// UNAVAILABLE, CONNECTED or INVALID; empty when the entry had none.
	Status string
}

// Ready reports whether the node counts as up: its status is READY or
// CONNECTED.
func (n NodeStatus) Ready() bool {
	return n.Status == "READY" || n.Status == "CONNECTED"
}

// ReadyNodes returns how many of the domain's nodes are ready.
func (d DomainStatus) ReadyNodes() int {
	ready := 0
	for _, n := range d.Nodes {
		if n.Ready() {
			ready++
		}
	}
	return ready
}

// ParseDomainStatus reads the JSON output of `nvidia-imex-ctl -N -j`. The
// shape it expects, as nvidia-imex-ctl 570/580 prints it:
//
//	{"nodes": {"0": {"status": "READY", "host": "10.0.0.1", "hostName": "",
//	                 "connections": {"1": {"host": "10.0.0.2", "status": "CONNECTED"}},
//	                 "version": "580.95.05"},
//	           "1": {"status": "UNAVAILABLE", "host": "10.0.0.2", …}},
//	 "timestamp": "9/4/2026 00:37:39.905",
//	 "status": "UP"}
//
// The overall "status" (UP, DOWN or DEGRADED, any case) decides. Without it,
// the state is derived from the nodes (see DomainStatus.Derived). "nodes"
// may also be a list. Other fields are ignored. Text (not JSON) that says the
// node configuration file could not be read is an error wrapping
// ErrNotConfigured. Any other error wraps ErrMalformed:
// not a JSON object, an unknown overall status, or no overall status and no
// readable nodes.
func ParseDomainStatus(out []byte) (DomainStatus, error) {
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) > 0 && trimmed[0] != '{' && isNotConfigured(trimmed) {
		return DomainStatus{}, fmt.Errorf("%w: %q", ErrNotConfigured, excerpt(string(trimmed)))
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return DomainStatus{}, fmt.Errorf("%w: domain status is not a JSON object", ErrMalformed)
	}
	var raw struct {
		Status *string         `json:"status"`
		Nodes  json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal(trimmed, &raw); err != nil {
		return DomainStatus{}, fmt.Errorf("%w: decoding domain status: %w", ErrMalformed, err)
	}
	nodes, nodesErr := parseNodes(raw.Nodes)

	if raw.Status != nil {
		state := DomainState(strings.ToUpper(strings.TrimSpace(*raw.Status)))
		switch state {
		case DomainUp, DomainDown, DomainDegraded:
		default:
			return DomainStatus{}, fmt.Errorf("%w: unknown domain status %q", ErrMalformed, excerpt(*raw.Status))
		}
		// The overall status is what we judge; node entries are detail
		// for the message, so a change in their shape costs nothing.
		if nodesErr != nil {
			nodes = nil
		}
		return DomainStatus{State: state, Nodes: nodes}, nil
	}

	if nodesErr != nil {
		return DomainStatus{}, nodesErr
	}
	if len(nodes) == 0 {
		return DomainStatus{}, fmt.Errorf("%w: domain status has neither a status nor nodes", ErrMalformed)
	}
	d := DomainStatus{Derived: true, Nodes: nodes}
	switch ready := d.ReadyNodes(); {
	case ready == 0:
		d.State = DomainDown
	case ready < len(nodes):
		d.State = DomainDegraded
	default:
		d.State = DomainUp
	}
	return d, nil
}

// node is one entry of "nodes" as printed.
type node struct {
	Status   string `json:"status"`
	Host     string `json:"host"`
	HostName string `json:"hostName"`
}

// parseNodes reads "nodes": an object keyed by node index (as printed) or a
// list. Absent or null means no nodes.
func parseNodes(raw json.RawMessage) ([]NodeStatus, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var out []NodeStatus
	switch raw[0] {
	case '{':
		var m map[string]node
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("%w: decoding domain nodes: %w", ErrMalformed, err)
		}
		for k, n := range m {
			out = append(out, nodeStatus(k, n))
		}
	case '[':
		var l []node
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, fmt.Errorf("%w: decoding domain nodes: %w", ErrMalformed, err)
		}
		for i, n := range l {
			out = append(out, nodeStatus(strconv.Itoa(i), n))
		}
	default:
		return nil, fmt.Errorf("%w: domain nodes are neither an object nor a list", ErrMalformed)
	}
	sort.Slice(out, func(i, j int) bool { return indexLess(out[i].Index, out[j].Index) })
	return out, nil
}

func nodeStatus(index string, n node) NodeStatus {
	return NodeStatus{
		Index:    index,
		Host:     n.Host,
		HostName: n.HostName,
		Status:   strings.ToUpper(strings.TrimSpace(n.Status)),
	}
}

// indexLess orders node indexes numerically when both are numbers, so that
// "10" follows "9".
func indexLess(a, b string) bool {
	ai, aerr := strconv.Atoi(a)
	bi, berr := strconv.Atoi(b)
	if aerr == nil && berr == nil && ai != bi {
		return ai < bi
	}
	return a < b
}

// excerpt shortens text quoted in errors and messages; "…" marks a cut,
// which never splits a rune.
func excerpt(s string) string {
	const limit = 64
	if t := gpuhealthv1alpha1.Truncate(s, limit); t != s {
		return t + "…"
	}
	return s
}
