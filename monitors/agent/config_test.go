package agent

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/monitors/imex"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(g Gomega, c Config)
	}{
		{name: "an empty file gives the defaults", yaml: "", check: func(g Gomega, c Config) {
			g.Expect(c.SourcesOrDefault()).To(Equal([]string{"nvml", "kmsg", "imex", "services", "ib"}))
		}},
		{name: "the ib section parses", yaml: `
ib: {interval: 2s, devices: ["mlx5_1*", "0000:c1:00.0"], exclude: [mlx5_9], expectedRateGbps: 400, expectedRates: {MT4129: 400},
  expectedDevices: 8, downGrace: 5s, flapWindow: 5m, maxFlaps: 3, rateGrace: 1m, counterWindow: 10m, thresholds: {symbol_error: 1, port_xmit_discards: 0}}
`, check: func(g Gomega, c Config) {
			g.Expect(c.IB.Devices).To(Equal([]string{"mlx5_1*", "0000:c1:00.0"}))
			g.Expect(c.IB.ExpectedRates).To(HaveKeyWithValue("MT4129", 400.0))
			g.Expect(c.IB.Thresholds).To(HaveKeyWithValue("port_xmit_discards", 0.0))
			g.Expect(c.IB.FlapWindow.Duration).To(Equal(5 * time.Minute))
		}},
		{name: "an ib pattern must be one", yaml: "ib: {devices: [\"mlx5_[\"]}", wantErr: `ib.devices: "mlx5_[" is not a pattern`},
		{name: "an ib counter is a file name", yaml: "ib: {thresholds: {../state: 1}}", wantErr: `ib.thresholds: "../state" is not a counter file name`},
		{name: "an expected rate is positive", yaml: "ib: {expectedRates: {MT4129: 0}}", wantErr: "ib.expectedRates[MT4129]: must be positive"},
		{name: "every section parses", yaml: `
nodeName: gpu-1
sources: [nvml, dcgm]
nvml: {pollInterval: 5s, window: 30s, thresholds: {CRC_FLIT: 50, RECOVERY: -1}, fabricGrace: 2m}
dcgm: {mode: standalone, address: "hostengine:5555"}
kmsg: {path: /dev/kmsg}
imex: {command: /usr/bin/nvidia-imex-ctl, interval: 15s}
spool: {dir: /var/lib/gpuhealth/spool, maxRecords: 100}
publish: {window: 2s, qps: 5, burst: 10}
debounce: [{check: IMEXDaemon, occurrences: 2, window: 90s}]
`, check: func(g Gomega, c Config) {
			g.Expect(c.NVML.PollInterval.Duration).To(Equal(5 * time.Second))
			g.Expect(c.NVML.Thresholds).To(HaveKeyWithValue("RECOVERY", -1.0))
			g.Expect(c.DebounceRules()).To(HaveLen(1))
			g.Expect(c.DebounceRules()[0].Window).To(Equal(90 * time.Second))
		}},
		{name: "an unknown field is an error that names it", yaml: "pollInterval: 5s", wantErr: `unknown field "pollInterval"`},
		{name: "an unknown source is named", yaml: "sources: [nvml, gpu]", wantErr: `unknown source "gpu"`},
		{name: "a bad duration is an error", yaml: "nvml: {pollInterval: often}", wantErr: "often"},
		{name: "a negative duration is an error", yaml: "publish: {window: -1s}", wantErr: "publish.window: must not be negative"},
		{name: "the slow-GPU checks are configured under nvml.performance", yaml: `
nvml: {performance: {window: 10m, share: 0.8, busyUtilization: 50, pcieReplayRate: 1, thermalMargin: 3, nvlinkSpeedRatio: 0.9, disable: [ThermalMargin]}}
`, check: func(g Gomega, c Config) {
			p := c.NVML.Performance.Source()
			g.Expect(p.Window).To(Equal(10 * time.Minute))
			g.Expect(p.Share).To(Equal(0.8))
			g.Expect(p.BusyUtilization).To(Equal(uint32(50)))
			g.Expect(p.ThermalMargin).To(Equal(uint32(3)))
			g.Expect(p.Off).To(HaveLen(1))
		}},
		{name: "an unknown slow-GPU check is named", yaml: "nvml: {performance: {disable: [Slow]}}", wantErr: `unknown check "Slow"`},
		{name: "a share is a part of the window", yaml: "nvml: {performance: {share: 1.5}}", wantErr: "nvml.performance.share: 1.5"},
		{name: "the DCGM source's slow-GPU checks are checked alike", yaml: "dcgm: {performance: {busyUtilization: 120}}", wantErr: "dcgm.performance.busyUtilization: 120"},
		{name: "an unknown counter is named", yaml: "nvml: {thresholds: {CRC: 1}}", wantErr: `unknown counter "CRC"`},
		{name: "standalone DCGM needs an address", yaml: "dcgm: {mode: standalone}", wantErr: "dcgm.address: required"},
		{name: "a debounce rule needs a window", yaml: "debounce: [{check: XID, occurrences: 3}]", wantErr: "debounce[0]"},
		{name: "not YAML at all", yaml: "{{{", wantErr: "parsing monitor configuration"},
		{name: "the imex section parses", yaml: `
imex: {command: /run/nvidia/driver/usr/bin/nvidia-imex-ctl, driverNamespace: dra, port: 50006, startupGrace: 5m}
`, check: func(g Gomega, c Config) {
			g.Expect(c.IMEX.DriverNamespace).To(Equal("dra"))
			g.Expect(c.IMEX.Port).To(Equal(50006))
			g.Expect(c.IMEX.StartupGrace.Duration).To(Equal(5 * time.Minute))
		}},
		{name: "a host-managed IMEX daemon is one of an address and a config file", yaml: "imex: {address: 10.0.0.1, configFile: /etc/nvidia-imex/config.cfg}", wantErr: "imex: set at most one of address and configFile"},
		{name: "an IMEX port is a TCP port", yaml: "imex: {port: 70000}", wantErr: "imex.port: 70000"},
		{name: "the removed IMEX argument lists are unknown fields", yaml: "imex: {domainArgs: [-N, -j]}", wantErr: `unknown field "domainArgs"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c, err := ParseConfig([]byte(tt.yaml))
			if tt.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			if tt.check != nil {
				tt.check(g, c)
			}
		})
	}
}

func TestOverride(t *testing.T) {
	g := NewWithT(t)
	c := Config{NodeName: "from-file", Sources: []string{"kmsg"}, Spool: SpoolConfig{Dir: "/a"}}
	c.Override(&Config{NodeName: "from-flag", Spool: SpoolConfig{Dir: "/b"}})
	g.Expect(c.NodeName).To(Equal("from-flag"))
	g.Expect(c.Sources).To(Equal([]string{"kmsg"}), "an unset flag keeps the file's value")
	g.Expect(c.Spool.Dir).To(Equal("/b"))
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("sources: [nvml]\nnvml: {pollInterval: 5s}\n"))
	f.Add([]byte("debounce: [{check: XID, occurrences: 2, window: 1m}]"))
	f.Add([]byte("publish: {qps: -1}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err == nil {
			// Whatever parses is valid and usable.
			if verr := c.Validate(); verr != nil {
				t.Fatalf("ParseConfig accepted a configuration Validate rejects: %v", verr)
			}
			_ = c.DebounceRules()
		}
	})
}

func TestBuildSourcesMakesEveryConfiguredSource(t *testing.T) {
	g := NewWithT(t)
	cfg := Config{Sources: []string{"kmsg", "nvml", "dcgm", "imex", "services"}}
	srcs, b, err := buildSources(t.Context(), cfg, sourceDeps{stateDir: t.TempDir()})
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, s := range srcs {
		names = append(names, s.Name())
	}
	g.Expect(names).To(Equal([]string{"kmsg", "nvml", "dcgm", "imex", "services"}), "in the configured order")
	g.Expect(b.nvml).NotTo(BeNil(), "the inventory reads the nvml source")
	g.Expect(b.services).NotTo(BeNil(), "and the services source")
	for _, s := range srcs {
		if s, ok := s.(*imex.Source); ok {
			g.Expect(s.Pods).To(BeNil(), "no daemon pods are looked up without an apiserver")
		}
	}

	// With an apiserver and a node name the imex source watches the node's
	// ComputeDomain daemon pods (nothing is contacted until it runs).
	cfg = Config{NodeName: "gpu-a", Sources: []string{"imex"}, IMEX: IMEXConfig{DriverNamespace: "dra"}}
	srcs, _, err = buildSources(t.Context(), cfg, sourceDeps{restConfig: &rest.Config{Host: "https://127.0.0.1:1"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(srcs).To(HaveLen(1))
	src, ok := srcs[0].(*imex.Source)
	g.Expect(ok).To(BeTrue())
	g.Expect(src.NodeName).To(Equal("gpu-a"))
	g.Expect(src.Pods).To(BeAssignableToTypeOf(&imex.PodWatch{}))
	g.Expect(src.Pods.(*imex.PodWatch).Namespace()).To(Equal("dra"))

	_, _, err = buildSources(t.Context(), Config{Sources: []string{"gpu"}}, sourceDeps{})
	g.Expect(err).To(MatchError(ContainSubstring(`source "gpu"`)))
}
