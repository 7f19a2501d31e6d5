package imex

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// Label names.
const (
	labelResult = "result"
	labelState  = "state"
)

// Values of the result label.
const (
	resultOK        = "ok"
	resultError     = "error"
	resultMalformed = "malformed"
)

// State is what the imex source does on this node now, and why IMEX is not
// judged when it is not. It is the value of the state label of
// gpuhealth_monitor_imex_state.
type State string

// Source states.
const (
	// StateNotMember: the node carries no ComputeDomainLabel; IMEX is not
	// judged.
	StateNotMember State = "not_member"
	// StateChecking: the probes run against the local daemon.
	StateChecking State = "checking"
	// StateNoDaemonPod: the node is a member, but no daemon pod of its
	// domain is bound to it (not created yet, or gone) and no host-managed
	// daemon is configured; IMEX is not judged.
	StateNoDaemonPod State = "no_daemon_pod"
	// StateDaemonStarting: the domain's daemon pod has no IP yet, or started
	// less than StartupGrace ago and is not Ready; not judged yet.
	StateDaemonStarting State = "daemon_starting"
	// StateNoClique: the daemon pod says the node has no NVLink clique, so
	// the driver runs no IMEX daemon; not judged.
	StateNoClique State = "no_clique"
	// StatePodsUnreadable: the daemon pods cannot be listed (for example
	// the Role in the driver's namespace is missing); not judged.
	StatePodsUnreadable State = "pods_unreadable"
	// StateNotConfigured: nvidia-imex-ctl says IMEX is not configured on
	// this node; the source is unavailable and tried again later.
	StateNotConfigured State = "not_configured"
	// StateNoCommand: nvidia-imex-ctl was not found; the source is
	// unavailable and tried again later.
	StateNoCommand State = "no_command"
)

// states lists every State, so that exactly one reads 1.
var states = []State{StateNotMember, StateChecking, StateNoDaemonPod, StateDaemonStarting, StateNoClique, StatePodsUnreadable, StateNotConfigured, StateNoCommand}

var (
	runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_imex_runs_total",
		Help: "Number of nvidia-imex-ctl runs, by result: ok, error (did not start, failed or timed out) or malformed (output not understood).",
	}, []string{labelResult})
	stateGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_imex_state",
		Help: "What the imex source does now (1 for the current state): checking, or why IMEX is not judged on this node.",
	}, []string{labelState})
)

func init() {
	metrics.Registry.MustRegister(runs, stateGauge)
}

// setState makes st the one state that reads 1.
func setState(st State) {
	for _, s := range states {
		v := 0.0
		if s == st {
			v = 1
		}
		stateGauge.WithLabelValues(string(s)).Set(v)
	}
}
