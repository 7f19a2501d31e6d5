package grafana_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/internal/test/promcheck"
)

// file is the dashboard, as the kustomization names it.
var file = filepath.Base(promcheck.DashboardFile)

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr       string `json:"expr"`
		RefID      string `json:"refId"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(file)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	var d dashboard
	NewWithT(t).Expect(json.Unmarshal(b, &d)).To(Succeed())
	return d
}

// TestDashboardIsWellFormed: unique panel ids, every panel described and
// on the grid without overlaps, every query on the datasource variable,
// using only defined variables and metrics gpuhealth exports.
func TestDashboardIsWellFormed(t *testing.T) {
	g := NewWithT(t)
	d := load(t)
	g.Expect(d.UID).To(Equal("gpuhealth"))
	g.Expect(d.Title).NotTo(BeEmpty())
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	g.Expect(vars).To(HaveKey("datasource"))
	known, err := promcheck.Known()
	g.Expect(err).NotTo(HaveOccurred())

	ids := map[int]bool{}
	cells := map[[2]int]string{}
	for _, p := range d.Panels {
		g.Expect(ids).NotTo(HaveKey(p.ID), "panel ids are unique: %s", p.Title)
		ids[p.ID] = true
		g.Expect(p.GridPos.W).To(BeNumerically(">", 0), p.Title)
		g.Expect(p.GridPos.X+p.GridPos.W).To(BeNumerically("<=", 24), p.Title)
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				g.Expect(cells).NotTo(HaveKey([2]int{x, y}), "%q overlaps %q", p.Title, cells[[2]int{x, y}])
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		g.Expect(p.Description).NotTo(BeEmpty(), p.Title)
		g.Expect(p.Datasource).NotTo(BeNil(), p.Title)
		g.Expect(p.Datasource.UID).To(Equal("${datasource}"), p.Title)
		g.Expect(p.Targets).NotTo(BeEmpty(), p.Title)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			g.Expect(refs).NotTo(HaveKey(tg.RefID), p.Title)
			refs[tg.RefID] = true
			g.Expect(tg.Datasource.UID).To(Equal("${datasource}"), p.Title)
			for _, m := range promcheck.Variable.FindAllStringSubmatch(tg.Expr, -1) {
				_, builtin := promcheck.Builtins[m[1]]
				g.Expect(builtin || vars[m[1]]).To(BeTrue(), "%s: variable $%s is defined", p.Title, m[1])
			}
			unknown, err := promcheck.Unknown(promcheck.Expand(tg.Expr), known)
			g.Expect(err).NotTo(HaveOccurred(), "%s: %s", p.Title, tg.Expr)
			g.Expect(unknown).To(BeEmpty(), "%s names metrics no gpuhealth process exports", p.Title)
		}
	}
}

// series are an hour of the metrics the dashboard reads, shaped as a small
// fleet exports them: two operator replicas during a hand-over, two nodes'
// monitors (gpu-1 with a throttled GPU, a busy GPU on a x8 gen 4 link, a
// GPU 3 °C from slowdown and a pending row remap); gpu-2 failed with an XID
// 79, stranding the other member of its ComputeDomain, after one repair a
// minute recertified and one released; gpu-2 also runs an older driver
// than its pool, which both replicas report during the hand-over. On the
// compute network, gpu-1's mlx5_1 runs at half its rate and raises symbol
// errors, and its management port (not compute) is down; gpu-2's mlx5_0
// is down after flapping.
const series = `load 1m
	gpuhealth_node_gpus{node="gpu-1",pod="op-a"} 8x60
	gpuhealth_node_gpus{node="gpu-2",pod="op-a"} 8x60
	gpuhealth_node_gpus{node="gpu-2",pod="op-b"} 8x60
	gpuhealth_node_gpus_out_of_service{node="gpu-2",phase="Failed",cause="fault",check="XID",code="79",pod="op-a"} 8x60
	gpuhealth_computedomain_stranded_gpus{computedomain="team-a/train",pod="op-a"} 8x60
	gpuhealth_drain_gang_stranded_gpu_seconds_total{kind="JobSet",pod="op-a"} 0+60x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="600"} 0+1x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="recertified",le="+Inf"} 0+1x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="600"} 0+1x60
	gpuhealth_node_repair_duration_seconds_bucket{action="ResetGPU",outcome="released",le="+Inf"} 0+1x60
	gpuhealth_nodehealth_phase{node="gpu-1",phase="Healthy",pod="op-a"} 1x60
	gpuhealth_nodehealth_phase{node="gpu-1",phase="Failed",pod="op-a"} 0x60
	gpuhealth_nodehealth_phase{node="gpu-2",phase="Healthy",pod="op-a"} 0x60
	gpuhealth_nodehealth_phase{node="gpu-2",phase="Failed",pod="op-a"} 1x60
	gpuhealth_nodehealth_phase{node="gpu-2",phase="Failed",pod="op-b"} 1x60
	gpuhealth_nodehealth_transitions_total{from="Healthy",to="Quarantined",reason="Fault"} 0+1x60
	gpuhealth_node_drift{node="gpu-2",pool="default/NVIDIA-H100",property="driver",value="570.86.15",majority="570.133.20",pod="op-a"} 1x60
	gpuhealth_node_drift{node="gpu-2",pool="default/NVIDIA-H100",property="driver",value="570.86.15",majority="570.133.20",pod="op-b"} 1x60
	gpuhealth_policy_circuit_breaker_open{policy="default"} 0x60
	gpuhealth_policy_budget_limit_nodes{policy="default"} 1x60
	gpuhealth_policy_budget_unavailable_nodes{policy="default"} 1x60
	gpuhealth_policy_budget_waiting_nodes{policy="default"} 2x60
	gpuhealth_monitor_findings_total{node="gpu-1",source="nvml",check="XID",severity="Fatal"} 0+2x60
	gpuhealth_monitor_publish_latency_seconds_bucket{node="gpu-1",le="0.05"} 0+1x60
	gpuhealth_monitor_publish_latency_seconds_bucket{node="gpu-1",le="0.5"} 0+2x60
	gpuhealth_monitor_publish_latency_seconds_bucket{node="gpu-1",le="+Inf"} 0+2x60
	gpuhealth_monitor_source_up{node="gpu-1",source="nvml"} 1x60
	gpuhealth_monitor_source_up{node="gpu-1",source="dcgm"} 0x60
	gpuhealth_monitor_spool_records{node="gpu-1"} 0x60
	gpuhealth_monitor_publish_errors_total{node="gpu-1",reason="Unavailable"} 0+1x60
	gpuhealth_monitor_findings_dropped_total{node="gpu-1",reason="SpoolFull",severity="Info"} 0+1x60
	gpuhealth_monitor_gpu_clocks_event_seconds_total{node="gpu-1",gpu="3",uuid="GPU-3",reason="hw_slowdown"} 0+45x60
	gpuhealth_monitor_gpu_clocks_event_seconds_total{node="gpu-1",gpu="3",uuid="GPU-3",reason="sw_power_cap"} 0+60x60
	gpuhealth_monitor_gpu_pcie_link_width{node="gpu-1",gpu="4",uuid="GPU-4"} 8x60
	gpuhealth_monitor_gpu_pcie_link_width_max{node="gpu-1",gpu="4",uuid="GPU-4"} 16x60
	gpuhealth_monitor_gpu_pcie_link_generation{node="gpu-1",gpu="4",uuid="GPU-4"} 4x60
	gpuhealth_monitor_gpu_pcie_link_generation_max{node="gpu-1",gpu="4",uuid="GPU-4"} 5x60
	gpuhealth_monitor_gpu_utilization_ratio{node="gpu-1",gpu="4",uuid="GPU-4"} 0.9x60
	gpuhealth_monitor_gpu_temperature_celsius{node="gpu-1",gpu="3",uuid="GPU-3"} 85x60
	gpuhealth_monitor_gpu_slowdown_temperature_celsius{node="gpu-1",gpu="3",uuid="GPU-3"} 88x60
	gpuhealth_monitor_gpu_row_remap_pending{node="gpu-1",gpu="5",uuid="GPU-5"} 1x60
	gpuhealth_monitor_gpu_row_remap_failure{node="gpu-1",gpu="5",uuid="GPU-5"} 0x60
	gpuhealth_monitor_nic_port_up{node="gpu-1",device="mlx5_0",port="1",link_layer="InfiniBand",compute="true"} 1x60
	gpuhealth_monitor_nic_port_up{node="gpu-1",device="mlx5_1",port="1",link_layer="InfiniBand",compute="true"} 1x60
	gpuhealth_monitor_nic_port_up{node="gpu-1",device="mlx5_4",port="1",link_layer="Ethernet",compute="false"} 0x60
	gpuhealth_monitor_nic_port_up{node="gpu-2",device="mlx5_0",port="1",link_layer="InfiniBand",compute="true"} 0x60
	gpuhealth_monitor_nic_port_rate_gbps{node="gpu-1",device="mlx5_0",port="1"} 400x60
	gpuhealth_monitor_nic_port_rate_gbps{node="gpu-1",device="mlx5_1",port="1"} 200x60
	gpuhealth_monitor_nic_port_rate_gbps{node="gpu-1",device="mlx5_4",port="1"} 25x60
	gpuhealth_monitor_nic_port_rate_gbps{node="gpu-2",device="mlx5_0",port="1"} 10x60
	gpuhealth_monitor_nic_port_expected_rate_gbps{node="gpu-1",device="mlx5_0",port="1"} 400x60
	gpuhealth_monitor_nic_port_expected_rate_gbps{node="gpu-1",device="mlx5_1",port="1"} 400x60
	gpuhealth_monitor_nic_port_expected_rate_gbps{node="gpu-2",device="mlx5_0",port="1"} 400x60
	gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_0",port="1"} 0x60
	gpuhealth_monitor_nic_port_downs{node="gpu-1",device="mlx5_1",port="1"} 0x60
	gpuhealth_monitor_nic_port_downs{node="gpu-2",device="mlx5_0",port="1"} 3x60
	gpuhealth_monitor_nic_error_rate{node="gpu-1",device="mlx5_0",port="1",counter="symbol_error"} 0x60
	gpuhealth_monitor_nic_error_rate{node="gpu-1",device="mlx5_1",port="1",counter="symbol_error"} 0.5x60
	gpuhealth_monitor_nic_error_rate{node="gpu-1",device="mlx5_1",port="1",counter="port_xmit_discards"} 2x60
	gpuhealth_monitor_findings_total{node="gpu-2",source="ib",check="NIC",severity="Fatal"} 0+1x60
	gpuhealth_monitor_source_up{node="gpu-1",source="ib"} 1x60
	leader_election_master_status{name="gpuhealth-operator.gpuhealth.dev",pod="op-a"} 1x60
	workqueue_depth{name="nodehealth"} 3x60
	workqueue_depth{name="other_controller"} 9x60
	controller_runtime_reconcile_errors_total{controller="nodehealth"} 0+1x60
	gpuhealth_nodehealthevents_deleted_total{reason="retention"} 0+1x60
`

// queryFixture runs instant queries over series and what the recording
// rules record from them every minute of the hour, as a rule evaluation
// does.
func queryFixture(t *testing.T) rules.QueryFunc {
	t.Helper()
	g := NewWithT(t)
	storage := promqltest.LoadedStorage(t, series)
	query := rules.EngineQueryFunc(promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000), storage)
	recording, err := promcheck.RecordingRules()
	g.Expect(err).NotTo(HaveOccurred())
	start := time.Unix(0, 0).UTC()
	g.Expect(promcheck.Record(context.Background(), query, storage, recording, start, start.Add(60*time.Minute), time.Minute)).To(Succeed())
	return query
}

// TestEveryQueryReturnsData runs each query at the end of the hour: a
// query that returns nothing over series that have its metrics has a wrong
// label, matcher or aggregation.
func TestEveryQueryReturnsData(t *testing.T) {
	d := load(t)
	query := queryFixture(t)
	at := time.Unix(0, 0).UTC().Add(60 * time.Minute)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			t.Run(p.Title+"/"+tg.RefID, func(t *testing.T) {
				g := NewWithT(t)
				v, err := query(context.Background(), promcheck.Expand(tg.Expr), at)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(v).NotTo(BeEmpty(), tg.Expr)
			})
		}
	}
}

// TestNodesNotHealthyFoldsReplicas: during a leader hand-over both
// replicas report a node; the dashboard counts it once.
func TestNodesNotHealthyFoldsReplicas(t *testing.T) {
	g := NewWithT(t)
	d := load(t)
	query := queryFixture(t)
	for _, p := range d.Panels {
		if p.Title != "Nodes by phase" {
			continue
		}
		v, err := query(context.Background(), promcheck.Expand(p.Targets[0].Expr), time.Unix(3600, 0))
		g.Expect(err).NotTo(HaveOccurred())
		byPhase := map[string]float64{}
		for _, s := range v {
			byPhase[s.Metric.Get("phase")] = s.F
		}
		g.Expect(byPhase).To(Equal(map[string]float64{"Healthy": 1, "Failed": 1}))
		return
	}
	t.Fatal("no panel Nodes by phase")
}

// TestGoodputCountsGPUs: of two nodes of eight GPUs, one failed, so half
// the GPUs are in service; the failed node's GPUs show by phase and cause.
func TestGoodputCountsGPUs(t *testing.T) {
	g := NewWithT(t)
	d := load(t)
	query := queryFixture(t)
	got := map[string]map[string]float64{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			v, err := query(context.Background(), promcheck.Expand(tg.Expr), time.Unix(3600, 0))
			g.Expect(err).NotTo(HaveOccurred())
			m := map[string]float64{}
			for _, s := range v {
				m[s.Metric.DropReserved(func(n string) bool { return n == model.MetricNameLabel }).String()] = s.F
			}
			got[p.Title+"/"+tg.RefID] = m
		}
	}
	g.Expect(got).To(HaveKeyWithValue("Goodput/A", map[string]float64{"{}": 0.5}))
	g.Expect(got).To(HaveKeyWithValue("Goodput/B", map[string]float64{"{}": 0.5}))
	g.Expect(got).To(HaveKeyWithValue("GPUs out of service by phase/A", map[string]float64{`{phase="Failed"}`: 8}))
	g.Expect(got).To(HaveKeyWithValue("GPUs out of service by cause/A", map[string]float64{`{cause="fault", check="XID", code="79"}`: 8}))
	g.Expect(got).To(HaveKeyWithValue("Stranded GPUs/A", map[string]float64{"{}": 8}))
	g.Expect(got).To(HaveKeyWithValue("Time to repair (7d)/A", map[string]float64{"{}": 300}), "the releases do not count")
}

// TestDriftTableNamesTheOutlier: one row per drifted property of a node,
// with exactly the columns the table shows, however many replicas report
// it.
func TestDriftTableNamesTheOutlier(t *testing.T) {
	g := NewWithT(t)
	query := queryFixture(t)
	for _, p := range load(t).Panels {
		if p.Title != "Stack drift: outliers" {
			continue
		}
		g.Expect(p.Type).To(Equal("table"))
		v, err := query(context.Background(), promcheck.Expand(p.Targets[0].Expr), time.Unix(3600, 0))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(v).To(HaveLen(1))
		g.Expect(v[0].Metric.Map()).To(Equal(map[string]string{
			"node": "gpu-2", "pool": "default/NVIDIA-H100", "property": "driver", "value": "570.86.15", "majority": "570.133.20"}))
		return
	}
	t.Fatal("no panel Stack drift: outliers")
}

// TestNetworkShowsTheBadComputePorts: the ports panels count and list
// the compute ports that are down or slow, once each, and leave out healthy
// ports and a management port that is down.
func TestNetworkShowsTheBadComputePorts(t *testing.T) {
	g := NewWithT(t)
	query := queryFixture(t)
	got := map[string]map[string]float64{}
	for _, p := range load(t).Panels {
		for _, tg := range p.Targets {
			v, err := query(context.Background(), promcheck.Expand(tg.Expr), time.Unix(3600, 0))
			g.Expect(err).NotTo(HaveOccurred())
			m := map[string]float64{}
			for _, s := range v {
				m[s.Metric.DropReserved(func(n string) bool { return n == model.MetricNameLabel }).String()] = s.F
			}
			got[p.Title+"/"+tg.RefID] = m
		}
	}
	g.Expect(got).To(HaveKeyWithValue("Compute ports down/A", map[string]float64{`{node="gpu-2"}`: 1}))
	slow := `{device="mlx5_1", node="gpu-1", port="1"}`
	down := `{device="mlx5_0", node="gpu-2", port="1"}`
	table := "Compute ports down or below their rate/"
	g.Expect(got).To(HaveKeyWithValue(table+"A", map[string]float64{slow: 1, down: 0}), "up")
	g.Expect(got).To(HaveKeyWithValue(table+"B", map[string]float64{slow: 200, down: 10}), "rate")
	g.Expect(got).To(HaveKeyWithValue(table+"C", map[string]float64{slow: 400, down: 400}), "expected rate")
	g.Expect(got).To(HaveKeyWithValue("Port flaps in window (10 most)/A", map[string]float64{down: 3}))
	g.Expect(got).To(HaveKeyWithValue("Error counter rates (3 worst ports per counter)/A", map[string]float64{
		`{counter="symbol_error", device="mlx5_1", node="gpu-1", port="1"}`:       0.5,
		`{counter="port_xmit_discards", device="mlx5_1", node="gpu-1", port="1"}`: 2,
	}))
	g.Expect(got).To(HaveKeyWithValue("NIC findings/A", map[string]float64{`{severity="Fatal", source="ib"}`: 1.0 / 60}))
}

// TestKustomizationShipsTheDashboard: `kubectl apply -k config/grafana`
// makes the ConfigMap Grafana's sidecar looks for.
func TestKustomizationShipsTheDashboard(t *testing.T) {
	g := NewWithT(t)
	b, err := os.ReadFile("kustomization.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	var k struct {
		GeneratorOptions struct {
			Labels map[string]string `json:"labels"`
		} `json:"generatorOptions"`
		ConfigMapGenerator []struct {
			Files []string `json:"files"`
		} `json:"configMapGenerator"`
	}
	g.Expect(yaml.Unmarshal(b, &k)).To(Succeed())
	g.Expect(k.GeneratorOptions.Labels).To(HaveKeyWithValue("grafana_dashboard", "1"))
	g.Expect(k.ConfigMapGenerator).To(HaveLen(1))
	g.Expect(k.ConfigMapGenerator[0].Files).To(ConsistOf(file))
}
