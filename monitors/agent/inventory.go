package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/ib"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
	"github.com/gpuhealth/gpuhealth/monitors/services"
)

// Inventory report timing.
const (
	// DefaultInventoryInterval is the longest time between two writes of
	// the NodeInventory: its observedAt tells the operator the report is
	// live. 2,000 nodes write 3.3 times a second.
	DefaultInventoryInterval = 10 * time.Minute
	// inventoryCheck is how often the agent looks for a change to write.
	inventoryCheck = 30 * time.Second
	// inventoryFirst is how long after the start the first report waits,
	// so that the sources have read the stack once.
	inventoryFirst = 5 * time.Second
)

// inventoryReporter writes this node's NodeInventory: what the nvml source
// read (driver, each GPU's versions and modes), the PCI bus's GPUs and
// NVSwitches, and NVIDIA's services. It writes when the report changes and
// at least every Interval, and never about another node: the object is
// named after NodeName, and the install's admission policy holds the
// agent to the node its token is bound to.
type inventoryReporter struct {
	client   client.Client
	nodeName string
	// nvml is the nvml source, nil when it does not run.
	nvml *nvml.Source
	// services is the services source, nil when it does not run.
	services *services.Source
	// ib is the ib source, nil when it does not run.
	ib *ib.Source
	// pci scans the PCI bus.
	pci func() (services.PCI, error)
	// versions reads Fabric Manager's and IMEX's versions from the
	// host's package database ("" when unknown).
	versions func() (fabricManager, imex string)
	interval time.Duration
	clock    clock.WithTicker
	log      logr.Logger

	// written is the last spec written, and when.
	written   *gpuhealthv1alpha1.NodeInventorySpec
	writtenAt time.Time
}

// newInventoryReporter reports what the built sources read.
func newInventoryReporter(cfg Config, c client.Client, b built, log logr.Logger) *inventoryReporter {
	dpkg := cfg.Inventory.DpkgStatus
	if dpkg == "" {
		dpkg = DefaultDpkgStatus
	}
	return &inventoryReporter{
		client: c, nodeName: cfg.NodeName, nvml: b.nvml, services: b.services, ib: b.ib, pci: scanPCI(cfg),
		versions: func() (string, string) { return dpkgVersions(dpkg) },
		interval: cfg.Inventory.Interval.Duration, clock: clock.RealClock{}, log: log,
	}
}

// DefaultDpkgStatus is the host's dpkg status file as the DaemonSet mounts it.
const DefaultDpkgStatus = "/host" + services.DpkgStatusPath

// dpkgVersions reads Fabric Manager's and IMEX's package versions; a host
// without dpkg (or the file not mounted) has none.
func dpkgVersions(path string) (fabricManager, imex string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer func() { _ = f.Close() }()
	pkgs, err := services.ParseDpkgStatus(f)
	if err != nil {
		return "", ""
	}
	return services.Versions(pkgs)
}

// Run reports until ctx is done; write errors are logged and retried at
// the next check.
func (r *inventoryReporter) Run(ctx context.Context) error {
	// An interval shorter than the waits (tests) shortens them.
	first, check := inventoryFirst, inventoryCheck
	if r.interval > 0 {
		first, check = min(first, r.interval), min(check, r.interval)
	}
	select {
	case <-ctx.Done():
		return nil
	case <-r.clock.After(first):
	}
	ticker := r.clock.NewTicker(check)
	defer ticker.Stop()
	for {
		if err := r.once(ctx); err != nil && ctx.Err() == nil {
			r.log.Info("Cannot write the node's inventory; trying again", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// once writes the report when it changed or is due.
func (r *inventoryReporter) once(ctx context.Context) error {
	now := r.clock.Now()
	spec := r.read(now)
	interval := r.interval
	if interval <= 0 {
		interval = DefaultInventoryInterval
	}
	if r.written != nil && now.Sub(r.writtenAt) < interval && sameReport(r.written, &spec) {
		return nil
	}
	if err := r.write(ctx, spec); err != nil {
		return err
	}
	r.written, r.writtenAt = &spec, now
	return nil
}

// sameReport compares two reports but for when they were read.
func sameReport(a, b *gpuhealthv1alpha1.NodeInventorySpec) bool {
	x, y := *a, *b
	x.ObservedAt, y.ObservedAt = metav1.Time{}, metav1.Time{}
	return equality.Semantic.DeepEqual(x, y)
}

// read assembles the report from the sources' last reads.
func (r *inventoryReporter) read(now time.Time) gpuhealthv1alpha1.NodeInventorySpec {
	spec := gpuhealthv1alpha1.NodeInventorySpec{NodeName: r.nodeName, ObservedAt: metav1.NewTime(now.Truncate(time.Second))}
	var listed map[string]bool
	if r.nvml != nil {
		if inv, ok := r.nvml.Inventory(); ok {
			spec.Driver = inv.Driver
			spec.GPUs = inv.GPUs
			spec.GPUCount = ptr.To(int32(len(inv.GPUs)))
			listed = map[string]bool{}
			for _, g := range inv.GPUs {
				listed[g.PCIBusID] = true
			}
		}
	}
	if r.pci != nil {
		if pci, err := r.pci(); err == nil {
			spec.PCI.GPUs, spec.PCI.NVSwitches = int32(len(pci.GPUs)), int32(len(pci.NVSwitches))
			for _, b := range pci.GPUs {
				if listed != nil && !listed[b] {
					spec.PCI.NotInNVML = append(spec.PCI.NotInNVML, b)
				}
			}
		}
	}
	var fm, imex string
	if r.versions != nil {
		fm, imex = r.versions()
	}
	if r.services != nil {
		for _, st := range r.services.Status() {
			si := gpuhealthv1alpha1.ServiceInventory{Name: st.Name, Installed: st.Installed, Running: st.Running, Starts: int32(st.Starts)}
			switch st.Name {
			case services.FabricManager:
				si.Version = fm
			case services.IMEX:
				si.Version = imex
			}
			spec.Services = append(spec.Services, si)
		}
	}
	if r.ib != nil {
		for _, p := range r.ib.Status() {
			if len(spec.NICs) == maxNICs {
				break
			}
			n := gpuhealthv1alpha1.NICInventory{Device: p.Device, Port: int32(p.Num), HCAType: p.HCAType, Firmware: p.FirmwareVersion,
				LinkLayer: p.LinkLayer, Up: p.Up(), Compute: p.Compute}
			if n.Up {
				n.Rate = p.RateText
			}
			spec.NICs = append(spec.NICs, n)
		}
	}
	return spec
}

// maxNICs is the schema's bound on the ports a report lists.
const maxNICs = 64

// owner is the reference to this node's Node, or nil when it cannot be read.
func (r *inventoryReporter) owner(ctx context.Context) []metav1.OwnerReference {
	var n corev1.Node
	if err := r.client.Get(ctx, client.ObjectKey{Name: r.nodeName}, &n); err != nil {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
}

// write creates or updates the node's NodeInventory.
func (r *inventoryReporter) write(ctx context.Context, spec gpuhealthv1alpha1.NodeInventorySpec) error {
	obj := &gpuhealthv1alpha1.NodeInventory{}
	err := r.client.Get(ctx, client.ObjectKey{Name: r.nodeName}, obj)
	switch {
	case apierrors.IsNotFound(err):
		obj = &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: r.nodeName}, Spec: spec}
		// Owned by its Node, so that the garbage collector deletes the
		// report of a node that left the cluster. Without the Node (the
		// read failed) it is made anyway and the owner added by the next
		// write.
		obj.OwnerReferences = r.owner(ctx)
		if err := r.client.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating NodeInventory %s: %w", r.nodeName, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading NodeInventory %s: %w", r.nodeName, err)
	}
	obj.Spec = spec
	if len(obj.OwnerReferences) == 0 {
		obj.OwnerReferences = r.owner(ctx)
	}
	if err := r.client.Update(ctx, obj); err != nil {
		return fmt.Errorf("updating NodeInventory %s: %w", r.nodeName, err)
	}
	return nil
}
