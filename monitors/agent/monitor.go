package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/kmsg"
	"github.com/gpuhealth/gpuhealth/monitors/pipeline"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

// Defaults for the publish configuration.
const (
	// DefaultQPS and DefaultBurst are the client-side rate limit. One node's
	// agent writes a few objects a minute normally; a fault on all 8 GPUs
	// with 18 links each is ~150 objects, written within seconds.
	DefaultQPS   = 20
	DefaultBurst = 50
	// DefaultSpoolDir is where findings wait for the apiserver.
	DefaultSpoolDir = "/var/lib/gpuhealth/spool"
	// nodeLabelsTimeout bounds one read of this node's labels.
	nodeLabelsTimeout = 10 * time.Second
)

// Monitor is the assembled node agent: sources, pipeline, spool and the
// cache of its own Node.
type Monitor struct {
	agent    *Agent
	pipeline *pipeline.Pipeline
	cache    cache.Cache
	// inventory writes the node's NodeInventory; nil when off.
	inventory *inventoryReporter
	log       logr.Logger
	started   atomic.Bool
}

// New assembles the agent from its configuration. It opens the spool (and
// replays what it holds once Run starts) but starts nothing.
func New(ctx context.Context, cfg Config, restConfig *rest.Config, scheme *runtime.Scheme, log logr.Logger) (*Monitor, error) {
	rc := rest.CopyConfig(restConfig)
	rc.QPS, rc.Burst = DefaultQPS, DefaultBurst
	if cfg.Publish.QPS > 0 {
		rc.QPS = cfg.Publish.QPS
	}
	if cfg.Publish.Burst > 0 {
		rc.Burst = cfg.Publish.Burst
	}
	rc.UserAgent = "gpuhealth-monitor"
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the apiserver client: %w", err)
	}
	dir := cfg.Spool.Dir
	if dir == "" {
		dir = DefaultSpoolDir
	}
	sp, replay, problems, err := spool.Open(dir, cfg.Spool.MaxRecords)
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		log.Error(p, "Unreadable spool record")
	}
	if len(replay) > 0 {
		log.Info("Replaying findings the apiserver had not acknowledged", "records", len(replay))
	}
	// The kmsg source keeps a cursor in the spool directory: its counts are
	// published only once a cursor that covers them is durable.
	var checkpointed map[gpuhealthv1alpha1.Source]uint64
	if slices.Contains(cfg.SourcesOrDefault(), "kmsg") {
		checkpointed = map[gpuhealthv1alpha1.Source]uint64{
			gpuhealthv1alpha1.SourceKmsg: kmsg.CommittedGeneration(dir, ""),
		}
	}
	p, err := pipeline.New(pipeline.Options{
		NodeName:     cfg.NodeName,
		Client:       c,
		Spool:        sp,
		Replay:       replay,
		Window:       cfg.Publish.Window.Duration,
		Debounce:     cfg.DebounceRules(),
		Log:          log.WithName("pipeline"),
		Checkpointed: checkpointed,
	})
	if err != nil {
		return nil, err
	}
	m := &Monitor{pipeline: p, log: log}
	deps := sourceDeps{stateDir: dir, log: log, restConfig: rc, sync: p.Sync, seal: p.Seal}
	if needsNode(cfg) {
		// A cache of this node only: the imex source asks for its labels
		// every interval without a request to the apiserver. Its mapper
		// knows Node without asking the apiserver, so an agent that starts
		// while the apiserver is away still starts (and spools).
		mapper := meta.NewDefaultRESTMapper(nil)
		mapper.Add(corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot)
		m.cache, err = cache.New(rc, cache.Options{
			Scheme: scheme,
			Mapper: mapper,
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Node{}: {Field: fields.OneTermEqualSelector("metadata.name", cfg.NodeName)},
			},
		})
		if err != nil {
			return nil, fmt.Errorf("creating the node cache: %w", err)
		}
		deps.nodeLabels = func(ctx context.Context) (map[string]string, error) {
			// Until the cache has synced (the apiserver may be away), a
			// read waits for it; not longer than this.
			ctx, cancel := context.WithTimeout(ctx, nodeLabelsTimeout)
			defer cancel()
			var n corev1.Node
			if err := m.cache.Get(ctx, client.ObjectKey{Name: cfg.NodeName}, &n); err != nil {
				return nil, fmt.Errorf("reading node %s: %w", cfg.NodeName, err)
			}
			return n.Labels, nil
		}
	}
	srcs, b, err := buildSources(ctx, cfg, deps)
	if err != nil {
		return nil, err
	}
	m.agent = &Agent{Sources: srcs, Report: p.Report, Log: log}
	if !cfg.Inventory.Disabled && cfg.NodeName != "" {
		m.inventory = newInventoryReporter(cfg, c, b, log.WithName("inventory"))
	}
	return m, nil
}

// Run runs the pipeline and the sources until ctx is done.
func (m *Monitor) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)
	running := 0
	if m.cache != nil {
		// The sources start without waiting for it: the apiserver may be
		// away, and what they find meanwhile goes to the spool.
		running++
		go func() { errs <- m.cache.Start(ctx) }()
		go func() {
			syncCtx, done := context.WithTimeout(ctx, time.Minute)
			defer done()
			if !m.cache.WaitForCacheSync(syncCtx) && ctx.Err() == nil {
				m.log.Info("Node cache not synced after a minute; sources that read node labels retry")
			}
		}()
	}
	if m.inventory != nil {
		running++
		go func() { errs <- m.inventory.Run(ctx) }()
	}
	running += 2
	go func() { errs <- m.pipeline.Run(ctx) }()
	go func() { errs <- m.agent.Run(ctx) }()
	m.started.Store(true)
	var err error
	for range running {
		e := <-errs
		if e != nil && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, e)
		}
		cancel()
	}
	return err
}

// Healthz fails when a source died.
func (m *Monitor) Healthz(r *http.Request) error { return m.agent.Healthz(r) }

// Readyz is ready once the agent runs.
func (m *Monitor) Readyz(_ *http.Request) error {
	if !m.started.Load() {
		return errors.New("starting")
	}
	return nil
}

// Pending returns the number of findings the apiserver is behind on.
func (m *Monitor) Pending() int { return m.pipeline.Pending() }

// States returns each source's state.
func (m *Monitor) States() map[string]State { return m.agent.States() }
