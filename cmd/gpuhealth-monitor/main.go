// Command gpuhealth-monitor is the node agent: a DaemonSet pod on every GPU
// node that turns XID errors, NVLink error rates and state, fabric state and
// IMEX health into NodeHealthEvents about its own node.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	crconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/agent"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		configPath    string
		flags         agent.Config
		sources       string
		metricsSecure bool
	)
	flag.StringVar(&configPath, "config", "", "Path of the YAML configuration file (see docs/monitors.md); flags override it.")
	flag.StringVar(&flags.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (from the downward API); every event is about it.")
	flag.StringVar(&sources, "sources", "", "Comma-separated sources to run: nvml, dcgm, kmsg, imex, draDriver, services (default nvml,kmsg,imex,services).")
	flag.StringVar(&flags.Spool.Dir, "spool-dir", "", "Directory of the on-disk spool, on a hostPath (default /var/lib/gpuhealth/spool).")
	flag.StringVar(&flags.NVML.LibraryPath, "nvml-library", "", "Path of libnvidia-ml.so.1 (default: the dynamic loader's search path).")
	flag.StringVar(&flags.Kmsg.Path, "kmsg-path", "", "Kernel log device or file (default /dev/kmsg).")
	flag.StringVar(&flags.MetricsAddr, "metrics-bind-address", "", "Address the Prometheus metrics endpoint binds to (default :8080); \"0\" turns it off.")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS (a self-signed certificate) to scrapers whose bearer token the apiserver authenticates (TokenReview) and allows to GET /metrics (SubjectAccessReview); false serves them over plain HTTP to anyone who can reach the port.")
	flag.StringVar(&flags.HealthAddr, "health-probe-bind-address", "", "Address the /healthz and /readyz probes bind to (default :8081).")
	opts := zap.Options{Development: false, TimeEncoder: zapcore.ISO8601TimeEncoder}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	crlog.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := crlog.Log.WithName("monitor")

	cfg := agent.Config{}
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err != nil {
			log.Error(err, "Reading the configuration file failed")
			return 1
		}
		if cfg, err = agent.ParseConfig(data); err != nil {
			log.Error(err, "Invalid configuration file", "path", configPath)
			return 1
		}
	}
	if sources != "" {
		flags.Sources = strings.Split(sources, ",")
	}
	cfg.Override(&flags)
	if err := cfg.Validate(); err != nil {
		log.Error(err, "Invalid configuration")
		return 1
	}
	if cfg.NodeName == "" {
		log.Error(errors.New("no node name"), "Set --node-name (the DaemonSet passes spec.nodeName from the downward API)")
		return 1
	}

	restConfig, err := crconfig.GetConfig()
	if err != nil {
		log.Error(err, "Loading the kubeconfig failed")
		return 1
	}
	scheme := runtime.NewScheme()
	// Only the kinds the agent reads or writes: every registered kind costs
	// memory on each of thousands of nodes.
	if err := corev1.AddToScheme(scheme); err != nil {
		log.Error(err, "Building the scheme failed")
		return 1
	}
	if err := gpuhealthv1alpha1.AddToScheme(scheme); err != nil {
		log.Error(err, "Building the scheme failed")
		return 1
	}

	ctx := signals.SetupSignalHandler()
	m, err := agent.New(ctx, cfg, restConfig, scheme, log)
	if err != nil {
		log.Error(err, "Starting the monitor failed")
		return 1
	}
	var review *metrics.Review
	if metricsSecure {
		if review, err = metrics.NewReview(restConfig); err != nil {
			log.Error(err, "Creating the metrics endpoint's review clients failed")
			return 1
		}
	}
	if err := serve(ctx, cfg, m, review, log); err != nil {
		log.Error(err, "Starting the HTTP endpoints failed")
		return 1
	}
	log.Info("Starting gpuhealth-monitor", "Node", klog.KRef("", cfg.NodeName), "sources", cfg.SourcesOrDefault())
	if err := m.Run(ctx); err != nil {
		log.Error(err, "Monitor stopped with an error")
		return 1
	}
	log.Info("Stopped; unacknowledged findings stay in the spool", "pending", m.Pending())
	return 0
}

// serve starts the metrics and health endpoints; they stop with ctx. With
// review, the metrics are served over HTTPS to the scrapers it allows.
func serve(ctx context.Context, cfg agent.Config, m *agent.Monitor, review *metrics.Review, log logr.Logger) error {
	servers := map[string]http.Handler{}
	metricsAddr := or(cfg.MetricsAddr, ":8080")
	if metricsAddr != "0" {
		mux := http.NewServeMux()
		h := promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{})
		if review != nil {
			h = review.Wrap(h)
		}
		mux.Handle("/metrics", h)
		servers[metricsAddr] = mux
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", probe(m.Healthz))
	health.HandleFunc("/readyz", probe(m.Readyz))
	healthAddr := or(cfg.HealthAddr, ":8081")
	if h, ok := servers[healthAddr]; ok {
		if review != nil {
			return fmt.Errorf("the metrics (HTTPS) and the probes (HTTP) need their own addresses, both are %s", healthAddr)
		}
		// One address for both: serve metrics and probes together.
		health.Handle("/metrics", h)
	}
	servers[healthAddr] = health
	for addr, h := range servers {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		if addr == metricsAddr && review != nil {
			tlsConfig, err := metrics.SelfSignedTLS()
			if err != nil {
				_ = ln.Close()
				return fmt.Errorf("making the metrics endpoint's certificate: %w", err)
			}
			ln = tls.NewListener(ln, tlsConfig)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.V(1).Info("Serving", "address", ln.Addr().String())
	}
	return nil
}

func probe(check func(*http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
