package prometheus_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"

	"github.com/gpuhealth/gpuhealth/hack/promcheck"
)

// loadRules reads the PrometheusRule and validates its spec as the rule
// file Prometheus would load.
func loadRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	rules, err := promcheck.Alerts()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(rules).NotTo(BeEmpty())
	return rules
}

// TestRulesAreWellFormed: every alert has a severity, a summary, a
// description and a runbook section that exists, and names only metrics
// gpuhealth exports.
func TestRulesAreWellFormed(t *testing.T) {
	g := NewWithT(t)
	known, err := promcheck.Known()
	g.Expect(err).NotTo(HaveOccurred())
	runbook, err := os.ReadFile(filepath.Join(promcheck.RepoRoot(), "docs", "alerts.md"))
	g.Expect(err).NotTo(HaveOccurred())
	names := map[string]bool{}
	for _, r := range loadRules(t) {
		g.Expect(r.Alert).NotTo(BeEmpty(), "only alerts, no recording rules")
		g.Expect(names).NotTo(HaveKey(r.Alert), "alert names are unique")
		names[r.Alert] = true
		g.Expect(r.Alert).To(HavePrefix("GPUHealth"))
		g.Expect(r.Labels).To(HaveKeyWithValue("severity", BeElementOf("critical", "warning")), r.Alert)
		g.Expect(r.Annotations).To(HaveKey("summary"), r.Alert)
		g.Expect(r.Annotations).To(HaveKey("description"), r.Alert)
		anchor := strings.ToLower(r.Alert)
		g.Expect(r.Annotations["runbook_url"]).To(HaveSuffix("docs/alerts.md#"+anchor), r.Alert)
		g.Expect(string(runbook)).To(ContainSubstring("\n## "+r.Alert+"\n"), "docs/alerts.md has a section for %s", r.Alert)
		unknown, err := promcheck.Unknown(r.Expr, known)
		g.Expect(err).NotTo(HaveOccurred(), r.Alert)
		g.Expect(unknown).To(BeEmpty(), "%s names metrics no gpuhealth process exports", r.Alert)
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
// firing alerts at c.at (the rule's own labels left out).
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
	for ts := time.Duration(0); ts <= c.at; ts += time.Minute {
		_, err := rule.Eval(context.Background(), 0, time.Unix(0, 0).UTC().Add(ts), query, nil, 0)
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
	"GPUHealthDeadMemberListed": {
		{name: "listed for fifteen minutes", at: 15 * time.Minute, firing: []map[string]string{{"node": "gpu-1"}},
			series: "gpuhealth_nodehealth_dead_member_listed{node=\"gpu-1\"} 1x20\ngpuhealth_nodehealth_dead_member_listed{node=\"gpu-2\"} 0x20"},
		{name: "for five minutes only", at: 5 * time.Minute, series: `gpuhealth_nodehealth_dead_member_listed{node="gpu-1"} 1x20`},
		{name: "the driver dropped it", at: 25 * time.Minute, series: `gpuhealth_nodehealth_dead_member_listed{node="gpu-1"} 1x8 0x20`},
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
