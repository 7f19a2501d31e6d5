package nodehealth

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

const (
	labelFrom    = "from"
	labelTo      = "to"
	labelReason  = "reason"
	labelPhase   = "phase"
	labelEvent   = "event"
	labelNode    = "node"
	labelBudget  = "budget"
	labelSuite   = "suite"
	labelStep    = "step"
	labelParser  = "parser"
	labelResult  = "result"
	labelName    = "measurement"
	labelUnit    = "unit"
	labelAction  = "action"
	labelOutcome = "outcome"
	labelCheck   = "check"
	labelType    = "type"
	labelKind    = "kind"
)

// durationBuckets span a repair or a phase: a minute to a week.
var durationBuckets = []float64{60, 300, 900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 16 * 3600, 86400, 2 * 86400, 4 * 86400, 7 * 86400}

var (
	transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_nodehealth_transitions_total",
		Help: "Number of node state machine transitions, by from phase, to phase and reason.",
	}, []string{labelFrom, labelTo, labelReason})

	illegalTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_nodehealth_illegal_transitions_total",
		Help: "Number of state machine events refused as illegal in the node's phase; each is a bug.",
	}, []string{labelPhase, labelEvent})

	deviceTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_device_transitions_total",
		Help: "Number of moves of GPUs out of service alone (rules of scope Device), by from and to phase (Healthy: in service).",
	}, []string{labelFrom, labelTo})

	staleDaemonPodsDeleted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuhealth_nodehealth_stale_daemon_pods_deleted_total",
		Help: "Number of ComputeDomain daemon pods of dead, fenced members deleted so their peers drop them.",
	})

	gangWavesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_drain_gang_waves_total",
		Help: "Number of gangs a drain stopped whole (drain.gangs Gang), by gang kind and result: sent (every member evicted in one wave) or held (a member's PodDisruptionBudget made the wave wait).",
	}, []string{labelKind, labelResult})

	gangSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuhealth_drain_gang_size",
		Help:    "Members of each gang a drain stopped whole, by gang kind.",
		Buckets: prometheus.ExponentialBuckets(2, 2, 11), // 2 to 2048 pods
	}, []string{labelKind})

	gangStrandedGPUSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_drain_gang_stranded_gpu_seconds_total",
		Help: "GPU-seconds the members of stopped gangs held on healthy nodes between their member's node being fenced and the wave, by gang kind: the GPU-time the lost rank stranded.",
	}, []string{labelKind})

	budgetBlocked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_nodehealth_budget_blocked_total",
		Help: "Number of times a quarantined node started waiting for a budget, by budget.",
	}, []string{labelBudget})

	suiteSteps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_suite_steps_total",
		Help: "Number of certification and recertification steps judged, by suite, step, parser and result (passed or failed).",
	}, []string{labelSuite, labelStep, labelParser, labelResult})

	suiteStepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuhealth_suite_step_duration_seconds",
		Help:    "How long certification and recertification steps took, from their Job's creation to their verdict, by suite and step.",
		Buckets: []float64{10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
	}, []string{labelSuite, labelStep})

	suiteMeasurement = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_suite_step_measurement",
		Help: "The last value each node's certification or recertification step measured (for example busBandwidth in GB/s), by node, suite, step, measurement and unit.",
	}, []string{labelNode, labelSuite, labelStep, labelName, labelUnit})

	repairDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuhealth_node_repair_duration_seconds",
		Help:    "How long fault repairs took, from the fault's first quarantine to Healthy (outcome recertified, released or cancelled) or to Failed (outcome failed), by the fault's action and outcome. MTTR: the recertified and failed ones.",
		Buckets: durationBuckets,
	}, []string{labelAction, labelOutcome})

	phaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuhealth_node_phase_duration_seconds",
		Help:    "How long nodes stayed in each phase, observed when they left it, by phase.",
		Buckets: append([]float64{1, 10}, durationBuckets...),
	}, []string{labelPhase})

	timeBetweenFaults = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpuhealth_nodehealth_time_between_faults_seconds",
		Help:    "Time between two faults of the same class (check) taking the same node out of service, by check (MTBF per fault class).",
		Buckets: durationBuckets,
	}, []string{labelCheck})

	handOffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_nodehealth_handoffs_total",
		Help: "Number of failed nodes handed off to the system that replaces nodes, by hand-off type and result (HandedOff or Failed).",
	}, []string{labelType, labelResult})
)

// The per-node gauges are built at each scrape, by the leader, from the
// cached NodeHealths (nodeGauges, goodput.go) rather than kept as
// client_golang series: at 5,000 nodes nine series a node held about 16 MB
// of the operator's heap, six of them a phase the node was not in, at 0. A
// node's phase series is its current phase's, at 1; the condition gauges
// are 1 or 0.
var (
	nodePhaseDesc = prometheus.NewDesc("gpuhealth_nodehealth_phase",
		"1 for the phase each managed node is in; there is no series for the phases it is not in.",
		[]string{labelNode, labelPhase}, nil)
	drainTimedOutDesc = prometheus.NewDesc("gpuhealth_nodehealth_drain_timed_out",
		"1 while a draining node has pods that must leave past the drain timeout and the policy waits for them (condition DrainTimedOut), 0 otherwise.",
		[]string{labelNode}, nil)
	deadMemberListedDesc = prometheus.NewDesc("gpuhealth_nodehealth_dead_member_listed",
		"1 while a dead, fenced ComputeDomain member is still listed by NVIDIA's driver, so its peers hold it (condition DeadMemberListed), 0 otherwise.",
		[]string{labelNode}, nil)
	awaitingApprovalDesc = prometheus.NewDesc("gpuhealth_nodehealth_awaiting_approval",
		"1 while a node's next destructive act waits for a human's approval (condition AwaitingApproval), 0 otherwise.",
		[]string{labelNode}, nil)
	activeFindingsDesc = prometheus.NewDesc("gpuhealth_nodehealth_active_findings",
		"Number of active NodeHealthEvents each managed node has (status.activeEvents, which keeps at most 32: 32 means 32 or more).",
		[]string{labelNode}, nil)
)

func init() {
	metrics.Registry.MustRegister(transitions, deviceTransitions, illegalTransitions, staleDaemonPodsDeleted, budgetBlocked,
		gangWavesTotal, gangSize, gangStrandedGPUSeconds,
		suiteSteps, suiteStepDuration, suiteMeasurement, repairDuration, phaseDuration, timeBetweenFaults, handOffs)
	// Every series from zero, so the first illegal transition is an
	// increase() an alert sees, not a new series at 1.
	for _, p := range fsm.Phases() {
		for _, e := range fsm.Events() {
			illegalTransitions.WithLabelValues(string(p), string(e))
		}
		phaseDuration.WithLabelValues(string(p))
	}
	// The gang series too, so the first wave of a kind is an increase()
	// the goodput rules see.
	for _, k := range gang.Kinds() {
		for _, r := range []string{waveSent, waveHeld} {
			gangWavesTotal.WithLabelValues(string(k), r)
		}
		gangStrandedGPUSeconds.WithLabelValues(string(k))
	}
	// The repair series too, so the first repair of a kind is an
	// increase() the MTTR rules see.
	for _, a := range []gpuhealthv1alpha1.Action{gpuhealthv1alpha1.ActionRecertify, gpuhealthv1alpha1.ActionResetGPU,
		gpuhealthv1alpha1.ActionRebootNode, gpuhealthv1alpha1.ActionContactSupport, gpuhealthv1alpha1.ActionReplaceNode} {
		for _, o := range []string{outcomeRecertified, outcomeReleased, outcomeCancelled, outcomeFailed} {
			repairDuration.WithLabelValues(string(a), o)
		}
	}
}

// countGangWaves counts the gang waves a written status recorded.
func countGangWaves(ws []gangWaveRecord) {
	for _, w := range ws {
		kind := string(w.kind)
		gangWavesTotal.WithLabelValues(kind, w.result).Inc()
		if w.result == waveSent {
			gangSize.WithLabelValues(kind).Observe(float64(w.size))
			gangStrandedGPUSeconds.WithLabelValues(kind).Add(w.strandedGPUSeconds)
		}
	}
}

// forgetSuiteMeasurements removes the suite measurements of a node that is
// gone or no longer managed, so no dashboard shows a node nobody tracks.
func forgetSuiteMeasurements(node string) {
	suiteMeasurement.DeletePartialMatch(prometheus.Labels{labelNode: node})
}

// countSteps counts the steps a written status judged.
func countSteps(node string, steps []stepRecord) {
	for _, s := range steps {
		result := "failed"
		if s.passed {
			result = "passed"
		}
		suiteSteps.WithLabelValues(string(s.suite), s.step, string(s.parser), result).Inc()
		suiteStepDuration.WithLabelValues(string(s.suite), s.step).Observe(s.duration.Seconds())
		for _, m := range s.measurements {
			if v, err := strconv.ParseFloat(m.Value, 64); err == nil {
				suiteMeasurement.WithLabelValues(node, string(s.suite), s.step, m.Name, m.Unit).Set(v)
			}
		}
	}
}

// countOutages counts what a written status says about outages: repairs
// that ended, times between faults and hand-offs.
func countOutages(p *plan) {
	for _, r := range p.repairs {
		repairDuration.WithLabelValues(string(r.action), r.outcome).Observe(r.took.Seconds())
	}
	for _, g := range p.faultGaps {
		timeBetweenFaults.WithLabelValues(string(g.check)).Observe(g.gap.Seconds())
	}
	if h := p.handedOff; h != nil {
		handOffs.WithLabelValues(string(h.Type), string(h.State)).Inc()
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
