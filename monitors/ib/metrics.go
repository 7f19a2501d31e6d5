package ib

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// Label names. device and port are bounded by the node's adapters (8 to 10
// on a GPU node), counter by DefaultThresholds' keys and what the
// configuration adds.
const (
	labelDevice    = "device"
	labelPort      = "port"
	labelLinkLayer = "link_layer"
	labelCompute   = "compute"
	labelCounter   = "counter"
)

var (
	portUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nic_port_up",
		Help: "1 while an RDMA port is ACTIVE and LinkUp (a RoCE port's interface up too), 0 otherwise; compute says whether it is part of the compute fabric (judged) or not (exported only).",
	}, []string{labelDevice, labelPort, labelLinkLayer, labelCompute})
	portRate = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nic_port_rate_gbps",
		Help: "An RDMA port's rate in Gb/s as the kernel reports it (400 for 4X NDR).",
	}, []string{labelDevice, labelPort})
	portExpectedRate = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nic_port_expected_rate_gbps",
		Help: "The rate a compute port should run at: configured per adapter type, configured for all, or the fastest of the node's ports of its adapter type; absent when unknown.",
	}, []string{labelDevice, labelPort})
	portDowns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nic_port_downs",
		Help: "How many times a compute port went down within the flap window (scans, link_downed and carrier changes, whichever saw more).",
	}, []string{labelDevice, labelPort})
	counterRate = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nic_error_rate",
		Help: "A compute port's judged error counter's rate per second over the counter window, while it is above zero (absent otherwise).",
	}, []string{labelDevice, labelPort, labelCounter})
)

func init() {
	metrics.Registry.MustRegister(portUp, portRate, portExpectedRate, portDowns, counterRate)
}

// series remembers the label values each gauge was last set with, so that
// a scan deletes only the series that went away: resetting the vectors
// each second would let a scrape between reset and set see no ports.
type series struct {
	last map[*prometheus.GaugeVec]map[string][]string
	now  map[*prometheus.GaugeVec]map[string][]string
}

// set sets one series and remembers it.
func (s *series) set(v *prometheus.GaugeVec, value float64, labels ...string) {
	v.WithLabelValues(labels...).Set(value)
	if s.now[v] == nil {
		s.now[v] = map[string][]string{}
	}
	s.now[v][strings.Join(labels, "\x00")] = labels
}

// flush deletes the series of the last scan that this one did not set.
func (s *series) flush() {
	for v, old := range s.last {
		for k, labels := range old {
			if _, ok := s.now[v][k]; !ok {
				v.DeleteLabelValues(labels...)
			}
		}
	}
	s.last, s.now = s.now, map[*prometheus.GaugeVec]map[string][]string{}
}

// publishMetrics sets the gauges from a scan. A compute port gone from
// sysfs reads down; the series of other ports that went away are deleted.
func (sc *scanner) publishMetrics(statuses []PortStatus) {
	s := &sc.series
	if s.now == nil {
		s.now = map[*prometheus.GaugeVec]map[string][]string{}
	}
	for i := range statuses {
		st := &statuses[i]
		port := strconv.Itoa(st.Num)
		s.set(portUp, bool01(st.Up()), st.Device, port, st.LinkLayer, strconv.FormatBool(st.Compute))
		s.set(portRate, st.RateGbps, st.Device, port)
		if st.ExpectedRateGbps > 0 {
			s.set(portExpectedRate, st.ExpectedRateGbps, st.Device, port)
		}
	}
	for _, ps := range sc.ports {
		st := &ps.last
		port := strconv.Itoa(st.Num)
		if st.State == 0 { // gone from sysfs
			s.set(portUp, 0, st.Device, port, st.LinkLayer, "true")
		}
		s.set(portDowns, float64(len(ps.downs)), st.Device, port)
		for name, rate := range ps.rateNow {
			// Only counters that rose: a healthy node's eight
			// zeros per port would be most of its NIC series.
			if rate > 0 {
				s.set(counterRate, rate, st.Device, port, name)
			}
		}
	}
	s.flush()
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
