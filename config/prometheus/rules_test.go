package prometheus_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"

	"github.com/gpuhealth/gpuhealth/internal/test/promcheck"
)

// loadRules reads the PrometheusRule's alerts and validates its spec as
// the rule file Prometheus would load.
func loadRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	rules, err := promcheck.Alerts()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(rules).NotTo(BeEmpty())
	return rules
}

// loadRecordingRules reads the PrometheusRule's recording rules, in the
// order Prometheus evaluates them.
func loadRecordingRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	rules, err := promcheck.RecordingRules()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(rules).NotTo(BeEmpty())
	return rules
}

// TestRulesAreWellFormed: every alert has a severity, a summary, a
// description and a runbook section that exists; every recording rule
// follows the gpuhealth:<metric>:<operations> convention and reads only
// series recorded above it; and all of them name only metrics gpuhealth
// exports or records.
func TestRulesAreWellFormed(t *testing.T) {
	g := NewWithT(t)
	known, err := promcheck.Known()
	g.Expect(err).NotTo(HaveOccurred())
	runbook, err := os.ReadFile(filepath.Join(promcheck.RepoRoot(), "docs", "alerts.md"))
	g.Expect(err).NotTo(HaveOccurred())
	all, err := promcheck.Rules()
	g.Expect(err).NotTo(HaveOccurred())
	names := map[string]bool{}
	recorded := map[string]bool{}
	for _, r := range all {
		unknown, err := promcheck.Unknown(r.Expr, known)
		g.Expect(err).NotTo(HaveOccurred(), r.Alert+r.Record)
		g.Expect(unknown).To(BeEmpty(), "%s names metrics no gpuhealth process exports", r.Alert+r.Record)
		if r.Record != "" {
			g.Expect(promcheck.CheckRecordingName(r.Record)).To(Succeed())
			g.Expect(recorded).NotTo(HaveKey(r.Record), "recording rule names are unique")
			read, err := promcheck.Metrics(r.Expr)
			g.Expect(err).NotTo(HaveOccurred(), r.Record)
			for _, m := range read {
				if strings.Contains(m, ":") {
					g.Expect(recorded).To(HaveKey(m), "%s reads %s, which a rule above it records", r.Record, m)
				}
			}
			recorded[r.Record] = true
			continue
		}
		g.Expect(names).NotTo(HaveKey(r.Alert), "alert names are unique")
		names[r.Alert] = true
		g.Expect(r.Alert).To(HavePrefix("GPUHealth"))
		g.Expect(r.Labels).To(HaveKeyWithValue("severity", BeElementOf("critical", "warning")), r.Alert)
		g.Expect(r.Annotations).To(HaveKey("summary"), r.Alert)
		g.Expect(r.Annotations).To(HaveKey("description"), r.Alert)
		anchor := strings.ToLower(r.Alert)
		g.Expect(r.Annotations["runbook_url"]).To(HaveSuffix("docs/alerts.md#"+anchor), r.Alert)
		g.Expect(string(runbook)).To(ContainSubstring("\n## "+r.Alert+"\n"), "docs/alerts.md has a section for %s", r.Alert)
	}
	g.Expect(recorded).NotTo(BeEmpty())
	for name := range recorded {
		g.Expect(string(runbook)).To(ContainSubstring("`"+name+"`"), "docs/alerts.md explains %s", name)
	}
}

// alertCase is one `promtool test rules` style case: series loaded at one
// sample a minute from time zero, the rules evaluated every minute up to
// at, and the label sets of the alert firing then.
type alertCase struct {
	name   string
	series string
	at     time.Duration
	firing []map[string]string
}

// fire evaluates rule over the series and returns the label sets of its
// firing alerts at c.at (the rule's own labels left out). An alert that
// reads recorded series gets the recording rules evaluated before it at
// every step, as Prometheus's groups would.
func fire(t *testing.T, r rulefmt.Rule, c alertCase) []map[string]string {
	t.Helper()
	g := NewWithT(t)
	storage := promqltest.LoadedStorage(t, "load 1m\n"+c.series)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000)
	expr, err := promcheck.Parser.ParseExpr(r.Expr)
	g.Expect(err).NotTo(HaveOccurred())
	rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
		labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true, slog.New(slog.DiscardHandler))
	query := rules.EngineQueryFunc(engine, storage)
	var recorder *promcheck.Recorder
	if strings.Contains(r.Expr, "gpuhealth:") {
		recorder, err = promcheck.NewRecorder(loadRecordingRules(t))
		g.Expect(err).NotTo(HaveOccurred())
	}
	for ts := time.Duration(0); ts <= c.at; ts += time.Minute {
		at := time.Unix(0, 0).UTC().Add(ts)
		if recorder != nil {
			g.Expect(recorder.Eval(context.Background(), query, storage, at)).To(Succeed())
		}
		_, err := rule.Eval(context.Background(), 0, at, query, nil, 0)
		g.Expect(err).NotTo(HaveOccurred())
	}
	var out []map[string]string
	for _, a := range rule.ActiveAlerts() {
		if a.State != rules.StateFiring {
			continue
		}
		m := a.Labels.Map()
		delete(m, "alertname")
		for k := range r.Labels {
			delete(m, k)
		}
		out = append(out, m)
	}
	return out
}

// cases holds every alert's cases; TestAlertsFire fails for an alert
// without one.
var cases = map[string][]alertCase{
	"GPUHealthOperatorNotLeading": {
		{name: "a leader", series: `leader_election_master_status{name="gpuhealth-operator.gpuhealth.dev"} 1x30`, at: 30 * time.Minute},
		{name: "the leader lost the lease", at: 20 * time.Minute, firing: []map[string]string{{}},
			series: `leader_election_master_status{name="gpuhealth-operator.gpuhealth.dev"} 1x5 0x30`},
		{name: "no replica scraped for ten minutes", at: 11 * time.Minute, firing: []map[string]string{{"name": "gpuhealth-operator.gpuhealth.dev"}},
			series: `up{job="other"} 1x30`},
		{name: "gone for only five minutes", at: 5 * time.Minute, series: `up{job="other"} 1x30`},
		{name: "another controller's lease", at: 20 * time.Minute, firing: []map[string]string{{"name": "gpuhealth-operator.gpuhealth.dev"}},
			series: `leader_election_master_status{name="other"} 1x30`},
	},
	"GPUHealthCircuitBreakerOpen": {
		{name: "open", at: 2 * time.Minute, firing: []map[string]string{{"policy": "gpu"}},
			series: "gpuhealth_policy_circuit_breaker_open{policy=\"gpu\"} 1x10\ngpuhealth_policy_circuit_breaker_open{policy=\"cpu\"} 0x10"},
		{name: "closed again", at: 10 * time.Minute, series: `gpuhealth_policy_circuit_breaker_open{policy="gpu"} 1x3 0x10`},
	},
	"GPUHealthNodeFailed": {
		{name: "a failed node", at: 6 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Failed\"} 1x10\n" +
				"gpuhealth_nodehealth_phase{node=\"gpu-2\",phase=\"Failed\"} 0x10\n" +
				"gpuhealth_nodehealth_phase{node=\"gpu-2\",phase=\"Draining\"} 1x10"},
		{name: "failed for less than five minutes", at: 4 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Failed"} 1x10`},
		{name: "returned ten minutes ago", at: 30 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Failed"} 1x20 0x10`},
		{name: "two replicas report it during a hand-over", at: 6 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Failed\",pod=\"a\"} 1x10\n" +
				"gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Failed\",pod=\"b\"} 1x10"},
	},
	"GPUHealthDrainStuck": {
		{name: "draining for 130 minutes", at: 130 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Draining"} 1x140`},
		{name: "draining for 110 minutes", at: 110 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Draining"} 1x140`},
		{name: "drained after 40 minutes", at: 140 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Draining"} 1x40 0x100`},
		{name: "a leader fail-over on the way does not restart the clock", at: 130 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Draining\",pod=\"a\"} 1x100 stale\n" +
				"gpuhealth_nodehealth_phase{node=\"gpu-1\",phase=\"Draining\",pod=\"b\"} _x103 1x40"},
	},
	"GPUHealthDrainTimedOut": {
		{name: "timed out for ten minutes", at: 10 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_drain_timed_out{node=\"gpu-1\"} 1x20\ngpuhealth_nodehealth_drain_timed_out{node=\"gpu-2\"} 0x20"},
		{name: "for three minutes only", at: 3 * time.Minute, series: `gpuhealth_nodehealth_drain_timed_out{node="gpu-1"} 1x20`},
		{name: "the pods left", at: 20 * time.Minute, series: `gpuhealth_nodehealth_drain_timed_out{node="gpu-1"} 1x8 0x20`},
	},
	"GPUHealthFindingsFlood": {
		{name: "twenty findings for twenty minutes", at: 20 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_active_findings{node=\"gpu-1\"} 20x30\ngpuhealth_nodehealth_active_findings{node=\"gpu-2\"} 3x30"},
		{name: "for ten minutes only", at: 10 * time.Minute, series: `gpuhealth_nodehealth_active_findings{node="gpu-1"} 20x30`},
		{name: "sixteen, a failing node's worth", at: 30 * time.Minute, series: `gpuhealth_nodehealth_active_findings{node="gpu-1"} 16x30`},
		{name: "they cleared", at: 30 * time.Minute, series: `gpuhealth_nodehealth_active_findings{node="gpu-1"} 20x10 2x20`},
	},
	"GPUHealthDeadMemberListed": {
		{name: "listed for fifteen minutes", at: 15 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_dead_member_listed{node=\"gpu-1\"} 1x20\ngpuhealth_nodehealth_dead_member_listed{node=\"gpu-2\"} 0x20"},
		{name: "for five minutes only", at: 5 * time.Minute, series: `gpuhealth_nodehealth_dead_member_listed{node="gpu-1"} 1x20`},
		{name: "the driver dropped it", at: 25 * time.Minute, series: `gpuhealth_nodehealth_dead_member_listed{node="gpu-1"} 1x8 0x20`},
	},
	"GPUHealthAwaitingApproval": {
		{name: "waiting for forty minutes", at: 40 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_awaiting_approval{node=\"gpu-1\"} 1x50\ngpuhealth_nodehealth_awaiting_approval{node=\"gpu-2\"} 0x50"},
		{name: "approved after twenty minutes", at: 45 * time.Minute, series: `gpuhealth_nodehealth_awaiting_approval{node="gpu-1"} 1x20 0x30`},
	},
	"GPUHealthRecertificationStuck": {
		{name: "recertifying for 190 minutes", at: 190 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Recertifying"} 1x200`},
		{name: "recertifying for two hours", at: 120 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Recertifying"} 1x200`},
	},
	"GPUHealthCertificationStuck": {
		{name: "certifying for 190 minutes", at: 190 * time.Minute, firing: []map[string]string{{"node": "gpu-9"}},
			series: `gpuhealth_nodehealth_phase{node="gpu-9",phase="Certifying"} 1x200`},
		{name: "certified after an hour", at: 190 * time.Minute, series: `gpuhealth_nodehealth_phase{node="gpu-9",phase="Certifying"} 1x60 0x140`},
	},
	"GPUHealthDrainBudgetExhausted": {
		{name: "nodes wait 40 minutes", at: 40 * time.Minute, firing: []map[string]string{{"policy": "gpu"}},
			series: `gpuhealth_policy_budget_waiting_nodes{policy="gpu"} 2x50`},
		{name: "nodes waited 20 minutes", at: 40 * time.Minute, series: `gpuhealth_policy_budget_waiting_nodes{policy="gpu"} 2x20 0x30`},
	},
	"GPUHealthIllegalTransition": {
		{name: "the first one", at: 21 * time.Minute, firing: []map[string]string{{"phase": "Healthy", "event": "pass"}},
			series: `gpuhealth_nodehealth_illegal_transitions_total{phase="Healthy",event="pass"} 0x20 1x40`},
		{name: "an old one seen again after a scrape gap", at: 41 * time.Minute,
			series: `gpuhealth_nodehealth_illegal_transitions_total{phase="Healthy",event="pass"} 1x10 _x20 1x40`},
		{name: "another one", at: 41 * time.Minute, firing: []map[string]string{{"phase": "Healthy", "event": "pass"}},
			series: `gpuhealth_nodehealth_illegal_transitions_total{phase="Healthy",event="pass"} 1x40 2x20`},
		{name: "none for an hour", at: 60 * time.Minute, series: `gpuhealth_nodehealth_illegal_transitions_total{phase="Healthy",event="pass"} 1x60`},
	},
	"GPUHealthNodeDrift": {
		{name: "another driver for 35 minutes", at: 35 * time.Minute,
			firing: []map[string]string{{"node": "gpu-3", "pool": "default/NVIDIA-H100", "property": "driver", "value": "570.86.15", "majority": "570.133.20"}},
			series: `gpuhealth_node_drift{node="gpu-3",pool="default/NVIDIA-H100",property="driver",value="570.86.15",majority="570.133.20"} 1x40`},
		{name: "for 20 minutes only", at: 20 * time.Minute,
			series: `gpuhealth_node_drift{node="gpu-3",pool="default/NVIDIA-H100",property="driver",value="570.86.15",majority="570.133.20"} 1x40`},
		{name: "brought in line after 20 minutes", at: 40 * time.Minute,
			series: `gpuhealth_node_drift{node="gpu-3",pool="default/NVIDIA-H100",property="driver",value="570.86.15",majority="570.133.20"} 1x20 stale`},
		{name: "a leader fail-over on the way does not restart the clock", at: 35 * time.Minute,
			firing: []map[string]string{{"node": "gpu-3", "pool": "default/NVIDIA-H100", "property": "vbios", "value": "96.00.61", "majority": "96.00.74"}},
			series: "gpuhealth_node_drift{node=\"gpu-3\",pool=\"default/NVIDIA-H100\",property=\"vbios\",value=\"96.00.61\",majority=\"96.00.74\",pod=\"a\"} 1x20 stale\n" +
				"gpuhealth_node_drift{node=\"gpu-3\",pool=\"default/NVIDIA-H100\",property=\"vbios\",value=\"96.00.61\",majority=\"96.00.74\",pod=\"b\"} _x23 1x20"},
	},
	"GPUHealthGoodputLow": {
		{name: "a quarter of the GPUs out for 40 minutes", at: 40 * time.Minute, firing: []map[string]string{{}},
			series: fleet(4, 60) + `gpuhealth_node_gpus_out_of_service{node="gpu-1",phase="Failed",cause="fault",check="XID",code="79"} 8x60`},
		{name: "out for 20 minutes only", at: 20 * time.Minute,
			series: fleet(4, 60) + `gpuhealth_node_gpus_out_of_service{node="gpu-1",phase="Failed",cause="fault",check="XID",code="79"} 8x60`},
		{name: "a two-minute outage keeps the hour above the target", at: 60 * time.Minute,
			series: fleet(4, 60) + `gpuhealth_node_gpus_out_of_service{node="gpu-1",phase="Quarantined",cause="fault",check="XID",code="79"} _ 8x1 stale`},
		{name: "the recorded hour under the target", at: 31 * time.Minute, firing: []map[string]string{{}},
			series: `gpuhealth:goodput:ratio_avg1h 0.9x60`},
		{name: "at the target", at: 60 * time.Minute, series: `gpuhealth:goodput:ratio_avg1h 0.95x60`},
		{name: "no managed GPUs: no goodput, no alert", at: 60 * time.Minute,
			series: `gpuhealth_nodehealth_phase{node="gpu-1",phase="Healthy"} 1x60`},
	},
	"GPUHealthNVMLUnavailable": {
		{name: "nvml down", at: 16 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_monitor_source_up{node=\"gpu-1\",source=\"nvml\"} 0x20\n" +
				"gpuhealth_monitor_source_up{node=\"gpu-2\",source=\"nvml\"} 1x20\n" +
				"gpuhealth_monitor_source_up{node=\"gpu-2\",source=\"dcgm\"} 0x20"},
		{name: "nvml came up", at: 16 * time.Minute, series: `gpuhealth_monitor_source_up{node="gpu-1",source="nvml"} 0x2 1x20`},
	},
	"GPUHealthFindingsNotDelivered": {
		{name: "spooled for 20 minutes", at: 20 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_monitor_spool_records{node=\"gpu-1\"} 3x20\ngpuhealth_monitor_spool_records{node=\"gpu-2\"} 0x20"},
		{name: "delivered after a short outage", at: 20 * time.Minute, series: `gpuhealth_monitor_spool_records{node="gpu-1"} 3x5 0x20`},
	},
	"GPUHealthFindingsDropped": {
		{name: "the first drop", at: 11 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "reason": "SpoolFull"}},
			series: `gpuhealth_monitor_findings_dropped_total{node="gpu-1",reason="SpoolFull",severity="Info"} 0x10 1x30`},
		{name: "old drops only", at: 60 * time.Minute, series: `gpuhealth_monitor_findings_dropped_total{node="gpu-1",reason="SpoolFull",severity="Info"} 4x60`},
	},
	"GPUHealthNICPortDown": {
		{name: "a compute port down for six minutes", at: 6 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1"}},
			series: portUp("gpu-1", "mlx5_3", true, "0x10") + portUp("gpu-1", "mlx5_0", true, "1x10") + portUp("gpu-2", "mlx5_0", true, "1x10")},
		{name: "down for three minutes only", at: 3 * time.Minute, series: portUp("gpu-1", "mlx5_3", true, "0x10")},
		{name: "back up after three minutes", at: 10 * time.Minute, series: portUp("gpu-1", "mlx5_3", true, "0x3 1x10")},
		{name: "a management port is not judged", at: 10 * time.Minute, series: portUp("gpu-1", "mlx5_4", false, "0x10")},
		{name: "two monitor pods during a roll-out report it once", at: 6 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1"}},
			series: `gpuhealth_monitor_nic_port_up{node="gpu-1",pod="a",device="mlx5_3",port="1",link_layer="InfiniBand",compute="true"} 0x10
				gpuhealth_monitor_nic_port_up{node="gpu-1",pod="b",device="mlx5_3",port="1",link_layer="InfiniBand",compute="true"} 0x10`},
	},
	"GPUHealthNICFlapping": {
		{name: "two downs in the window", at: 7 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1"}},
			series: `gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_3",port="1"} 0x5 1 2x10
				gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_0",port="1"} 0x20`},
		{name: "one down", at: 10 * time.Minute, series: `gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_3",port="1"} 0x5 1x10`},
		{name: "two downs that one scrape saw", at: 10 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1"}},
			series: `gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_3",port="1"} 0x5 2 1x10`},
		{name: "stopped flapping over ten minutes ago", at: 25 * time.Minute,
			series: `gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_3",port="1"} 0x2 2x3 1x5 0x20`},
	},
	"GPUHealthNICDowntrained": {
		{name: "at half its rate for twenty minutes", at: 20 * time.Minute, firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1"}},
			series: portUp("gpu-1", "mlx5_3", true, "1x30") + portRate("gpu-1", "mlx5_3", "200x30", "400x30") +
				portUp("gpu-2", "mlx5_0", true, "1x30") + portRate("gpu-2", "mlx5_0", "400x30", "400x30")},
		{name: "for ten minutes only", at: 10 * time.Minute,
			series: portUp("gpu-1", "mlx5_3", true, "1x30") + portRate("gpu-1", "mlx5_3", "200x30", "400x30")},
		{name: "retrained at its full rate", at: 25 * time.Minute,
			series: portUp("gpu-1", "mlx5_3", true, "1x30") + portRate("gpu-1", "mlx5_3", "200x5 400x25", "400x30")},
		{name: "a down port is GPUHealthNICPortDown's", at: 20 * time.Minute,
			series: portUp("gpu-1", "mlx5_3", true, "0x30") + portRate("gpu-1", "mlx5_3", "10x30", "400x30")},
		{name: "no expected rate known", at: 20 * time.Minute,
			series: portUp("gpu-1", "mlx5_3", true, "1x30") + portRate("gpu-1", "mlx5_3", "200x30", "")},
	},
	"GPUHealthNICErrors": {
		{name: "symbol errors at 0.5/s for twenty minutes", at: 20 * time.Minute,
			firing: []map[string]string{{"node": "gpu-1", "device": "mlx5_3", "port": "1", "counter": "symbol_error"}},
			series: errorRate("gpu-1", "mlx5_3", "symbol_error", "0.5x30") + errorRate("gpu-2", "mlx5_0", "symbol_error", "0x30")},
		{name: "each counter against its own threshold", at: 20 * time.Minute,
			firing: []map[string]string{
				{"node": "gpu-1", "device": "mlx5_3", "port": "1", "counter": "link_error_recovery"},
				{"node": "gpu-1", "device": "mlx5_3", "port": "1", "counter": "local_ack_timeout_err"},
			},
			series: errorRate("gpu-1", "mlx5_3", "link_error_recovery", "0.02x30") + errorRate("gpu-1", "mlx5_3", "symbol_error", "0.05x30") +
				errorRate("gpu-1", "mlx5_3", "local_ack_timeout_err", "2x30") + errorRate("gpu-1", "mlx5_3", "port_xmit_discards", "5x30")},
		{name: "for ten minutes only", at: 10 * time.Minute, series: errorRate("gpu-1", "mlx5_3", "symbol_error", "0.5x30")},
		{name: "stopped after five minutes", at: 20 * time.Minute, series: errorRate("gpu-1", "mlx5_3", "symbol_error", "0.5x5 0x25")},
		{name: "a counter the configuration added does not alert", at: 20 * time.Minute,
			series: errorRate("gpu-1", "mlx5_3", "port_rcv_constraint_errors", "5x30")},
	},
	"GPUHealthNICStorm": {
		{name: "three nodes with a compute port down", at: 3 * time.Minute, firing: []map[string]string{{}},
			series: portUp("gpu-1", "mlx5_0", true, "0x10") + portUp("gpu-2", "mlx5_0", true, "0x10") + portUp("gpu-3", "mlx5_5", true, "0x10") +
				portUp("gpu-4", "mlx5_0", true, "1x10")},
		{name: "for one minute only", at: 1 * time.Minute,
			series: portUp("gpu-1", "mlx5_0", true, "0x10") + portUp("gpu-2", "mlx5_0", true, "0x10") + portUp("gpu-3", "mlx5_5", true, "0x10")},
		{name: "one node with all its ports down counts once", at: 5 * time.Minute,
			series: portUp("gpu-1", "mlx5_0", true, "0x10") + portUp("gpu-1", "mlx5_1", true, "0x10") + portUp("gpu-1", "mlx5_2", true, "0x10") +
				portUp("gpu-2", "mlx5_0", true, "0x10")},
		{name: "management ports do not count", at: 5 * time.Minute,
			series: portUp("gpu-1", "mlx5_4", false, "0x10") + portUp("gpu-2", "mlx5_4", false, "0x10") + portUp("gpu-3", "mlx5_4", false, "0x10")},
	},
}

// portUp is the up series of port 1 of device on node, an InfiniBand
// compute port or an Ethernet management port, with values in promqltest
// notation.
func portUp(node, device string, compute bool, values string) string {
	layer := "InfiniBand"
	if !compute {
		layer = "Ethernet"
	}
	return fmt.Sprintf("gpuhealth_monitor_nic_port_up{node=%q,device=%q,port=\"1\",link_layer=%q,compute=\"%t\"} %s\n", node, device, layer, compute, values)
}

// portRate is the rate and expected rate series of port 1 of device on
// node; no expected series when expected is "" (unknown).
func portRate(node, device, rate, expected string) string {
	out := fmt.Sprintf("gpuhealth_monitor_nic_port_rate_gbps{node=%q,device=%q,port=\"1\"} %s\n", node, device, rate)
	if expected != "" {
		out += fmt.Sprintf("gpuhealth_monitor_nic_port_expected_rate_gbps{node=%q,device=%q,port=\"1\"} %s\n", node, device, expected)
	}
	return out
}

// errorRate is the error counter rate series of port 1 of device on node.
func errorRate(node, device, counter, values string) string {
	return fmt.Sprintf("gpuhealth_monitor_nic_error_rate{node=%q,device=%q,port=\"1\",counter=%q} %s\n", node, device, counter, values)
}

// TestAlertsFire runs every alert against its cases.
func TestAlertsFire(t *testing.T) {
	for _, r := range loadRules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			cs := cases[r.Alert]
			if len(cs) == 0 {
				t.Fatalf("alert %s has no test case", r.Alert)
			}
			for _, c := range cs {
				t.Run(c.name, func(t *testing.T) {
					g := NewWithT(t)
					got := fire(t, r, c)
					if len(c.firing) == 0 {
						g.Expect(got).To(BeEmpty())
						return
					}
					g.Expect(got).To(ConsistOf(c.firing))
				})
			}
		})
	}
}

// fleet is n managed nodes of eight GPUs each (gpu-1 …), exported for
// minutes+1 samples from time zero.
func fleet(n, minutes int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "gpuhealth_node_gpus{node=\"gpu-%d\"} 8x%d\n", i, minutes)
	}
	return b.String()
}

// recordCase is a recording rule's expected series at one time: the series
// loaded at one sample a minute from time zero, every recording rule
// evaluated every minute up to at, and the rule's series then by their
// labels (the name left out; "{}" for none) with their values.
type recordCase struct {
	name   string
	series string
	at     time.Duration
	want   map[string]float64
}

// outFor is node's out-of-service series, present from minute from to
// minute to (both included) and stale after, in phase with cause and the
// labels (check, code) it carries.
func outFor(node, phase, cause, labels string, from, to int) string {
	if labels != "" {
		labels = "," + labels
	}
	return fmt.Sprintf("gpuhealth_node_gpus_out_of_service{node=%q,phase=%q,cause=%q%s} %s8x%d stale\n",
		node, phase, cause, labels, strings.Repeat("_ ", from), to-from)
}

// quarantine is gpu-1 out for a fault from minute 1 to 30: quarantined,
// draining, then recertifying, ten minutes each.
var quarantine = outFor("gpu-1", "Quarantined", "fault", `check="XID",code="79"`, 1, 10) +
	outFor("gpu-1", "Draining", "fault", `check="XID",code="79"`, 11, 20) +
	outFor("gpu-1", "Recertifying", "fault", `check="XID",code="79"`, 21, 30)

// repairs are a week's repair histogram: four ResetGPU repairs recertified
// within 10 to 30 minutes, one RebootNode repair failed after 30 to 60
// minutes, and ten ResetGPU quarantines released and five cancelled within
// a minute, which must not count.
const repairs = `	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="60"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="600"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="1800"} 0x30 4x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="3600"} 0x30 4x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="+Inf"} 0x30 4x30
	gpuhealth_node_repair_duration_seconds_bucket{action="RebootNode",outcome="failed",le="60"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="RebootNode",outcome="failed",le="600"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="RebootNode",outcome="failed",le="1800"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="RebootNode",outcome="failed",le="3600"} 0x30 1x30
	gpuhealth_node_repair_duration_seconds_bucket{action="RebootNode",outcome="failed",le="+Inf"} 0x30 1x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="60"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="600"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="1800"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="3600"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="+Inf"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="cancelled",le="60"} 0x30 5x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="cancelled",le="600"} 0x30 5x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="cancelled",le="1800"} 0x30 5x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="cancelled",le="3600"} 0x30 5x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="cancelled",le="+Inf"} 0x30 5x30
`

// releasesOnly are a week in which every quarantine was released.
const releasesOnly = `	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="60"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="+Inf"} 0x30 10x30
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="60"} 0x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="+Inf"} 0x60
`

// stranded is ComputeDomain team-a/train left with 24 GPUs it cannot use
// while gpu-1 is out.
const stranded = `gpuhealth_computedomain_stranded_gpus{computedomain="team-a/train"} _ 24x29 stale
`

// none is no managed node (the metric gpuhealth always exports, and no GPU
// gauge).
const none = `gpuhealth_nodehealth_phase{node="gpu-1",phase="Healthy"} 1x130
`

// recordCases holds every recording rule's cases; TestRecordingRules fails
// for a rule without one.
var recordCases = map[string][]recordCase{
	"gpuhealth:node_gpus:sum": {
		{name: "four nodes of eight", series: fleet(4, 60), at: 30 * time.Minute, want: map[string]float64{"{}": 32}},
		{name: "two replicas during a hand-over count a node once", at: 30 * time.Minute, want: map[string]float64{"{}": 8},
			series: "gpuhealth_node_gpus{node=\"gpu-1\",pod=\"a\"} 8x60\ngpuhealth_node_gpus{node=\"gpu-1\",pod=\"b\"} 8x60\n"},
		{name: "no managed node: no result", series: none, at: 30 * time.Minute},
	},
	"gpuhealth:node_gpus_out_of_service:sum": {
		{name: "one node out", series: fleet(4, 60) + quarantine, at: 15 * time.Minute, want: map[string]float64{"{}": 8}},
		{name: "none out is 0", series: fleet(4, 60) + quarantine, at: 45 * time.Minute, want: map[string]float64{"{}": 0}},
		{name: "no managed node: no result", series: none, at: 30 * time.Minute},
	},
	"gpuhealth:node_gpus_in_service:sum": {
		{name: "one node out", series: fleet(4, 60) + quarantine, at: 15 * time.Minute, want: map[string]float64{"{}": 24}},
		{name: "every node out is 0", at: 15 * time.Minute, want: map[string]float64{"{}": 0},
			series: fleet(1, 60) + outFor("gpu-1", "Maintenance", "maintenance", "", 0, 60)},
	},
	"gpuhealth:goodput:ratio": {
		{name: "a quarter out", series: fleet(4, 60) + quarantine, at: 15 * time.Minute, want: map[string]float64{"{}": 0.75}},
		{name: "back in service", series: fleet(4, 60) + quarantine, at: 45 * time.Minute, want: map[string]float64{"{}": 1}},
		{name: "no out-of-service series at all", series: fleet(4, 60), at: 30 * time.Minute, want: map[string]float64{"{}": 1}},
		{name: "no managed node: no result, not 1", series: none, at: 30 * time.Minute},
		{name: "managed nodes without GPUs: no result, not NaN", series: `gpuhealth_node_gpus{node="gpu-1"} 0x60`, at: 30 * time.Minute},
	},
	"gpuhealth:goodput:ratio_avg1h": {
		{name: "one of four nodes out for 30 of 60 minutes", series: fleet(4, 130) + quarantine, at: 60 * time.Minute,
			want: map[string]float64{"{}": 0.875}},
		{name: "an hour after it returned", series: fleet(4, 130) + quarantine, at: 91 * time.Minute, want: map[string]float64{"{}": 1}},
		{name: "no out-of-service series at all", series: fleet(4, 60), at: 60 * time.Minute, want: map[string]float64{"{}": 1}},
		{name: "GPU-hours, not an average of ratios: a node joins half-way", at: 60 * time.Minute,
			// 30 minutes of 8 GPUs out of 8, then 30 of 8 out of 16.
			series: "gpuhealth_node_gpus{node=\"gpu-1\"} 8x60\ngpuhealth_node_gpus{node=\"gpu-2\"} _x31 8x29\n" +
				outFor("gpu-2", "Certifying", "certification", "", 31, 60),
			want: map[string]float64{"{}": 8.0 * 60 / (8*60 + 8*30)}},
		{name: "no managed node: no result", series: none, at: 60 * time.Minute},
	},
	"gpuhealth:goodput:ratio_avg24h": {
		// The window holds minute 0 too: 91 samples of 32 in service, 30 of 24.
		{name: "one node out for 30 minutes in two hours", series: fleet(4, 130) + quarantine, at: 120 * time.Minute,
			want: map[string]float64{"{}": (91*32 + 30*24) / 121.0 / 32}},
	},
	"gpuhealth:goodput:ratio_avg7d": {
		{name: "one node out for 30 minutes in two hours", series: fleet(4, 130) + quarantine, at: 120 * time.Minute,
			want: map[string]float64{"{}": (91*32 + 30*24) / 121.0 / 32}},
	},
	"gpuhealth:node_gpus_out_of_service:sum_by_phase": {
		{name: "draining", series: fleet(4, 60) + quarantine, at: 15 * time.Minute, want: map[string]float64{`{phase="Draining"}`: 8}},
		{name: "two phases", at: 25 * time.Minute,
			series: fleet(4, 60) + quarantine + outFor("gpu-2", "Maintenance", "maintenance", "", 0, 60) + outFor("gpu-3", "Healthy", "cordoned", "", 0, 60),
			want:   map[string]float64{`{phase="Recertifying"}`: 8, `{phase="Maintenance"}`: 8, `{phase="Healthy"}`: 8}},
		{name: "all in service: no series", series: fleet(4, 60) + quarantine, at: 45 * time.Minute},
	},
	"gpuhealth:node_gpus_out_of_service:sum_by_cause": {
		{name: "a fault, a maintenance and a cordon", at: 15 * time.Minute,
			series: fleet(4, 60) + quarantine + outFor("gpu-2", "Maintenance", "maintenance", "", 0, 60) +
				outFor("gpu-3", "Quarantined", "fault", `check="NVLink",code="RowRemapFailure"`, 0, 60) + outFor("gpu-4", "Healthy", "cordoned", "", 0, 60),
			want: map[string]float64{
				`{cause="fault", check="XID", code="79"}`: 8, `{cause="fault", check="NVLink", code="RowRemapFailure"}`: 8,
				`{cause="maintenance"}`: 8, `{cause="cordoned"}`: 8,
			}},
		{name: "two replicas during a hand-over count a node once", at: 15 * time.Minute, want: map[string]float64{`{cause="request"}`: 8},
			series: fleet(4, 60) + "gpuhealth_node_gpus_out_of_service{node=\"gpu-1\",phase=\"Recertifying\",cause=\"request\",pod=\"a\"} 8x60\n" +
				"gpuhealth_node_gpus_out_of_service{node=\"gpu-1\",phase=\"Recertifying\",cause=\"request\",pod=\"b\"} 8x60\n"},
	},
	"gpuhealth:node_gpu_hours_out_of_service:sum_by_cause_24h": {
		{name: "8 GPUs for 30 minutes, and 8 for an hour", at: 60 * time.Minute,
			series: fleet(4, 60) + quarantine + outFor("gpu-2", "Maintenance", "maintenance", "", 1, 60),
			want:   map[string]float64{`{cause="fault"}`: 4, `{cause="maintenance"}`: 8}},
	},
	"gpuhealth:computedomain_stranded_gpus:max": {
		{name: "stranded while a member is out", series: fleet(4, 60) + quarantine + stranded, at: 15 * time.Minute,
			want: map[string]float64{`{computedomain="team-a/train"}`: 24}},
		{name: "none after", series: fleet(4, 60) + quarantine + stranded, at: 45 * time.Minute},
	},
	"gpuhealth:computedomain_stranded_gpus:sum": {
		{name: "stranded while a member is out", series: fleet(4, 60) + quarantine + stranded, at: 15 * time.Minute,
			want: map[string]float64{"{}": 24}},
		{name: "none stranded is 0", series: fleet(4, 60) + quarantine + stranded, at: 45 * time.Minute, want: map[string]float64{"{}": 0}},
	},
	"gpuhealth:computedomain_stranded_gpu_hours:sum_24h": {
		{name: "24 GPUs for 30 minutes", series: fleet(4, 60) + quarantine + stranded, at: 60 * time.Minute, want: map[string]float64{"{}": 12}},
	},
	"gpuhealth:drain_gang_stranded_gpu_hours:sum_24h": {
		{name: "two waves, 1.5 GPU-hours", at: 60 * time.Minute, want: map[string]float64{"{}": 1.5},
			series: "gpuhealth_drain_gang_stranded_gpu_seconds_total{kind=\"JobSet\"} 0x20 3600x40\n" +
				"gpuhealth_drain_gang_stranded_gpu_seconds_total{kind=\"PodGroup\"} 0x30 1800x30\n"},
	},
	// With the releases and cancels the median would be under a minute.
	"gpuhealth:node_repair_duration_seconds:p50_7d": {
		{name: "recertified and failed repairs only", series: repairs, at: 60 * time.Minute, want: map[string]float64{"{}": 600 + 1200*2.5/4}},
		{name: "only releases: no result, not NaN", series: releasesOnly, at: 60 * time.Minute},
	},
	"gpuhealth:node_repair_duration_seconds:p90_7d": {
		{name: "recertified and failed repairs only", series: repairs, at: 60 * time.Minute, want: map[string]float64{"{}": 1800 + 1800*0.5}},
	},
	"gpuhealth:node_repair_duration_seconds:p50_7d_by_action": {
		{name: "recertified and failed repairs only", series: repairs, at: 60 * time.Minute,
			want: map[string]float64{`{action="ResetGPU"}`: 600 + 1200*0.5, `{action="RebootNode"}`: 1800 + 1800*0.5}},
		{name: "only releases: no result, not NaN", series: releasesOnly, at: 60 * time.Minute},
	},
	"gpuhealth:node_repair_duration_seconds:p90_7d_by_action": {
		{name: "recertified and failed repairs only", series: repairs, at: 60 * time.Minute,
			want: map[string]float64{`{action="ResetGPU"}`: 600 + 1200*0.9, `{action="RebootNode"}`: 1800 + 1800*0.9}},
	},
}

// record evaluates every recording rule over c.series each minute up to
// c.at and returns rule's series then, by their labels.
func record(t *testing.T, rule string, c recordCase) map[string]float64 {
	t.Helper()
	g := NewWithT(t)
	storage := promqltest.LoadedStorage(t, "load 1m\n"+c.series)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 10_000_000)
	query := rules.EngineQueryFunc(engine, storage)
	start := time.Unix(0, 0).UTC()
	g.Expect(promcheck.Record(context.Background(), query, storage, loadRecordingRules(t), start, start.Add(c.at), time.Minute)).To(Succeed())
	v, err := query(context.Background(), rule, start.Add(c.at))
	g.Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, s := range v {
		out[s.Metric.DropReserved(func(n string) bool { return n == model.MetricNameLabel }).String()] = s.F
	}
	return out
}

// TestRecordingRules runs every recording rule against its cases.
func TestRecordingRules(t *testing.T) {
	for _, r := range loadRecordingRules(t) {
		t.Run(r.Record, func(t *testing.T) {
			cs := recordCases[r.Record]
			if len(cs) == 0 {
				t.Fatalf("recording rule %s has no test case", r.Record)
			}
			for _, c := range cs {
				t.Run(c.name, func(t *testing.T) {
					g := NewWithT(t)
					got := record(t, r.Record, c)
					g.Expect(got).To(HaveLen(len(c.want)), "%v", got)
					for k, v := range c.want {
						g.Expect(got).To(HaveKeyWithValue(k, BeNumerically("~", v, 1e-9)), "%v", got)
					}
				})
			}
		})
	}
}
