package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/fakenvml"
)

// detectLead is how far ahead each XID is scheduled in the fake NVML
// scenario: the library reads appended lines every 100 ms, so it delivers
// an XID scheduled this far ahead exactly on time, and the clock starts at
// the scheduled instant.
const detectLead = 300 * time.Millisecond

// detect measures detection to cordon through the whole stack: real
// gpuhealth-monitor processes, each loading the fake NVML library through
// go-nvml's real code path, on fresh nodes of the cluster, with a token
// bound to a pod on their node (so the own-node admission policy applies).
// One XID 79 at a time is scheduled in a node's scenario; each sample is
// the scheduled instant to the node seen cordoned in the watch. Monitors
// run -detect-monitors at a time; each node takes one XID (a quarantined
// node stays quarantined under the bench policy), so the next batch
// starts on fresh nodes.
func (h *harness) detect(ctx context.Context, cleanup func(func())) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "gpuhealth-bench-monitors-")
	if err != nil {
		return nil, err
	}
	cleanup(func() { _ = os.RemoveAll(dir) })
	logf("detect: building gpuhealth-monitor and the fake NVML library")
	bins := framework.Binaries{Monitor: filepath.Join(dir, "gpuhealth-monitor")}
	build := exec.CommandContext(ctx, "go", "build", "-o", bins.Monitor, "./cmd/gpuhealth-monitor")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the monitor: %w\n%s", err, framework.Tail(out, 2000))
	}
	if bins.FakeNVML, err = fakenvml.Build(dir); err != nil {
		return nil, fmt.Errorf("building the fake NVML library: %w", err)
	}
	var out []time.Duration
	for batch := 0; len(out) < h.o.detectSamples; batch++ {
		k := min(h.o.detectMonitors, h.o.detectSamples-len(out))
		samples, err := h.detectBatch(ctx, bins, dir, batch, k)
		if err != nil {
			return nil, err
		}
		out = append(out, samples...)
		logf("  detect: %d/%d samples", len(out), h.o.detectSamples)
	}
	return out, nil
}

// detectBatch starts k monitors on k fresh nodes and injects one XID on
// each in turn.
func (h *harness) detectBatch(ctx context.Context, bins framework.Binaries, dir string, batch, k int) ([]time.Duration, error) {
	nodes, err := h.createNodes(ctx, nodeSet{name: fmt.Sprintf("detect%d", batch), gpu: true}, k)
	if err != nil {
		return nil, err
	}
	if err := h.waitPhase(ctx, nodes, phaseHealthy); err != nil {
		return nil, err
	}
	monitors := make([]*framework.Monitor, len(nodes))
	defer func() {
		for _, m := range monitors {
			if m != nil {
				m.Stop()
			}
		}
	}()
	for i, node := range nodes {
		if err := h.createMonitorPod(ctx, node); err != nil {
			return nil, err
		}
		m, err := framework.NewMonitor(ctx, h.c, bins, dir, node, framework.Scenario(batch*h.o.detectMonitors+i))
		if err != nil {
			return nil, err
		}
		if err := m.Start(ctx); err != nil {
			return nil, fmt.Errorf("starting the monitor on %s (log %s): %w", node, m.LogPath, err)
		}
		monitors[i] = m
	}
	out := make([]time.Duration, 0, len(nodes))
	for i, node := range nodes {
		if err := h.nodes.arm([]string{node}); err != nil {
			return nil, err
		}
		at := time.Now().Add(detectLead)
		if err := monitors[i].Inject(fmt.Sprintf("xid device=0 code=79 at=%s", fakenvml.At(at))); err != nil {
			return nil, err
		}
		if err := h.waitCordoned(ctx, 1); err != nil {
			return nil, fmt.Errorf("%w (monitor log %s)", err, monitors[i].LogPath)
		}
		_, last := h.nodes.cordoned()
		out = append(out, last.Sub(at))
		if err := h.waitPhase(ctx, []string{node}, phaseQuarantined); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// createMonitorPod stands in for the monitor DaemonSet's pod on node: kwok
// runs it, and the monitor's token is bound to it.
func (h *harness) createMonitorPod(ctx context.Context, node string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "gpuhealth-monitor-" + node, Namespace: framework.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "gpuhealth-monitor"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			ServiceAccountName:            "gpuhealth-monitor",
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                    []corev1.Container{{Name: "monitor", Image: "localhost/gpuhealth-monitor:bench"}},
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
		},
	}
	if _, err := h.cs.CoreV1().Pods(framework.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the monitor pod on %s: %w", node, err)
	}
	return nil
}
