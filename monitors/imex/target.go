package imex

import (
	"errors"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// Target is how nvidia-imex-ctl reaches an IMEX daemon. nvidia-imex-ctl
// accepts exactly one of -i <address> <port> (the daemon's command service
// over TCP), -u <path> (over a unix socket) and -c <config file> (the
// daemon's own configuration, which names the command service). Only the
// domain status (-N) needs the configuration file: it reads the domain's
// node list from it, so -N works with -c and with nothing else.
type Target struct {
	// Address is the command service's IP address (IPv4 or IPv6), for -i.
	Address string
	// Port is the command service's TCP port, with Address; zero means
	// DefaultPort.
	Port int
	// ConfigFile is the daemon's configuration file as this process sees
	// it, for -c.
	ConfigFile string
}

// errTarget is a Target with none or more than one way to reach the daemon.
var errTarget = errors.New("an IMEX target needs exactly one of an address and a config file")

// args returns the target's arguments: "-i <address> <port>" or
// "-c <file>".
func (t Target) args() ([]string, error) {
	switch {
	case t.Address != "" && t.ConfigFile == "":
		return []string{"-i", t.Address, strconv.Itoa(t.port())}, nil
	case t.ConfigFile != "" && t.Address == "":
		return []string{"-c", t.ConfigFile}, nil
	default:
		return nil, errTarget
	}
}

// DaemonStatusArgs returns the arguments that ask the target's daemon for
// its status: "-q -i <address> <port>" or "-q -c <file>".
func DaemonStatusArgs(t Target) ([]string, error) {
	a, err := t.args()
	if err != nil {
		return nil, err
	}
	return append([]string{"-q"}, a...), nil
}

// DomainStatusArgs returns the arguments that ask for the domain's node
// status in JSON, "-N -j -c <file>", and false when the target has no
// configuration file: -N cannot be combined with -i.
func DomainStatusArgs(t Target) ([]string, bool) {
	if t.ConfigFile == "" || t.Address != "" {
		return nil, false
	}
	return []string{"-N", "-j", "-c", t.ConfigFile}, true
}

// String is for logs and messages.
func (t Target) String() string {
	if t.ConfigFile != "" {
		return "config " + t.ConfigFile
	}
	return net.JoinHostPort(t.Address, strconv.Itoa(t.port()))
}

// port is the command port, DefaultPort unless set.
func (t Target) port() int {
	if t.Port == 0 {
		return DefaultPort
	}
	return t.Port
}

// daemonPod picks the daemon pod of domain uid on node: labelled with that
// UID, bound to the node and not being deleted; among several (a DaemonSet
// rolling its pod), the newest. A pod of an earlier domain can still be
// terminating when the next domain's pod starts on the same node, so the
// UID must match. Nil when there is none.
func daemonPod(pods []corev1.Pod, node, uid string) *corev1.Pod {
	var best *corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Labels[ComputeDomainLabel] != uid || p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if best == nil || best.CreationTimestamp.Before(&p.CreationTimestamp) {
			best = p
		}
	}
	return best
}
