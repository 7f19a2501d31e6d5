//go:build cgo

package dcgm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	godcgm "github.com/NVIDIA/go-dcgm/pkg/dcgm"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// libraryName is the library go-dcgm dlopens. go-dcgm's Init returns the
// error "libdcgm.so.4 not found" when the dlopen fails (pkg/dcgm/admin.go,
// initDCGM).
const libraryName = "libdcgm.so.4"

// violationBuffer is the buffer of the channel PolicyViolations returns.
// go-dcgm's own channel holds only one violation per condition and drops
// the rest while its listener is busy, so the forwarding goroutine hands
// violations to this larger buffer and the source drains it.
const violationBuffer = 256

// goDCGM is the Client backed by go-dcgm. go-dcgm keeps its connection in
// package state (one per process, reference-counted by Init and Shutdown);
// goDCGM owns the group and field groups it created on that connection.
type goDCGM struct {
	cleanup func()
	gpus    []GPU

	group       godcgm.GroupHandle
	hasGroup    bool
	gpuFields   godcgm.FieldHandle
	hasGPUField bool
	global      godcgm.FieldHandle
	hasGlobal   bool
}

var _ Client = (*goDCGM)(nil)

// Connect is the default NewClientFunc: it starts DCGM embedded or connects
// to nv-hostengine with go-dcgm, then creates a group of all supported GPUs
// and NVSwitches, watches the configured fields on it and enables the
// configured health watches. Without libdcgm.so.4 it returns an error
// wrapping monitors.ErrUnavailable.
func Connect(_ context.Context, cfg ClientConfig) (Client, error) {
	var (
		cleanup func()
		err     error
	)
	switch cfg.Mode {
	case ModeEmbedded:
		cleanup, err = godcgm.Init(godcgm.Embedded)
	case ModeStandalone:
		// The third argument is go-dcgm's "is a Unix socket" flag.
		socket := "0"
		if cfg.UnixSocket {
			socket = "1"
		}
		cleanup, err = godcgm.Init(godcgm.Standalone, cfg.Address, socket)
	default:
		return nil, fmt.Errorf("unknown DCGM mode %q", cfg.Mode)
	}
	if err != nil {
		return nil, initError(err)
	}
	c := &goDCGM{cleanup: cleanup}
	if err := c.setup(cfg); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// initError classifies an Init failure: a missing library means this node
// has no DCGM, which is not an error of the agent.
func initError(err error) error {
	if strings.Contains(err.Error(), libraryName+" not found") {
		return monitors.Unavailable("%s not found: DCGM is not installed on this node or not in the library path", libraryName)
	}
	return fmt.Errorf("starting DCGM: %w", err)
}

// setup lists the GPUs and creates the group, watches and health watches.
func (c *goDCGM) setup(cfg ClientConfig) error {
	ids, err := godcgm.GetSupportedDevices()
	if err != nil {
		return fmt.Errorf("listing DCGM GPUs: %w", err)
	}
	if len(ids) == 0 {
		return monitors.Unavailable("DCGM supports no GPU on this node")
	}
	for _, id := range ids {
		info, err := godcgm.GetDeviceInfo(id)
		if err != nil {
			return fmt.Errorf("reading DCGM GPU %d: %w", id, err)
		}
		c.gpus = append(c.gpus, GPU{ID: id, UUID: info.UUID, PCIBusID: info.PCI.BusID})
	}

	// Names are unique per connection so that a restarted agent does not
	// meet its previous instance's groups on a shared nv-hostengine.
	name := fmt.Sprintf("gpuhealth-%d-%d", os.Getpid(), time.Now().UnixNano())
	c.group, err = godcgm.CreateGroup(name)
	if err != nil {
		return fmt.Errorf("creating DCGM group: %w", err)
	}
	c.hasGroup = true
	for _, id := range ids {
		if err := godcgm.AddEntityToGroup(c.group, godcgm.FE_GPU, id); err != nil {
			return fmt.Errorf("adding GPU %d to the DCGM group: %w", id, err)
		}
	}
	// NVSwitches are optional: most nodes have none, and the list call
	// fails on some systems without them.
	if switches, err := godcgm.GetEntityGroupEntities(godcgm.FE_SWITCH); err == nil {
		for _, id := range switches {
			_ = godcgm.AddEntityToGroup(c.group, godcgm.FE_SWITCH, id)
		}
	}

	// DCGM releases before the IMEX system bit monitor IMEX under the
	// NVLink watch and may refuse the bit, so retry without it.
	if systems := godcgm.HealthSystem(cfg.HealthSystems); systems != 0 {
		if err := godcgm.HealthSet(c.group, systems); err != nil {
			if err := godcgm.HealthSet(c.group, systems&^godcgm.DCGM_HEALTH_WATCH_IMEX); err != nil {
				return fmt.Errorf("enabling DCGM health watches: %w", err)
			}
		}
	}

	// DCGM refreshes watched fields every updateFreq microseconds; keeping
	// one sample is enough for latest-value reads.
	updateFreq := cfg.UpdateInterval.Microseconds()
	if len(cfg.GPUFields) > 0 {
		c.gpuFields, err = godcgm.FieldGroupCreate(name+"-gpu", shorts(cfg.GPUFields))
		if err != nil {
			return fmt.Errorf("creating DCGM field group: %w", err)
		}
		c.hasGPUField = true
		if err := godcgm.WatchFieldsWithGroupEx(c.gpuFields, c.group, updateFreq, 0, 1); err != nil {
			return fmt.Errorf("watching DCGM fields: %w", err)
		}
	}
	// The IMEX fields exist since DCGM 4.x; an older host engine rejects
	// them, and then GlobalValues reports them as not valid.
	if len(cfg.GlobalFields) > 0 {
		if fg, err := godcgm.FieldGroupCreate(name+"-global", shorts(cfg.GlobalFields)); err == nil {
			c.global, c.hasGlobal = fg, true
			_ = godcgm.WatchFieldsWithGroupEx(c.global, c.group, updateFreq, 0, 1)
		}
	}
	return nil
}

// GPUs implements Client.
func (c *goDCGM) GPUs() ([]GPU, error) {
	return c.gpus, nil
}

// PolicyViolations implements Client with go-dcgm's ListenForPolicyViolations
// on all GPUs, which also sets the XID and NVLink policy conditions.
func (c *goDCGM) PolicyViolations(ctx context.Context) (<-chan Violation, error) {
	in, err := godcgm.ListenForPolicyViolations(ctx, godcgm.XidPolicy, godcgm.NvlinkPolicy)
	if err != nil {
		return nil, fmt.Errorf("listening for DCGM policy violations: %w", err)
	}
	out := make(chan Violation, violationBuffer)
	go func() {
		defer close(out)
		// go-dcgm closes in when ctx is done.
		for pv := range in {
			select {
			case out <- violationFromGoDCGM(pv):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// violationFromGoDCGM converts go-dcgm's violation.
func violationFromGoDCGM(pv godcgm.PolicyViolation) Violation {
	v := Violation{Kind: ViolationOther, GPU: pv.GPU, Time: pv.Timestamp}
	switch d := pv.Data.(type) {
	case godcgm.XidPolicyCondition:
		v.Kind, v.XID = ViolationXID, d.ErrNum
	case godcgm.NvlinkPolicyCondition:
		v.Kind, v.Field, v.Counter = ViolationNVLink, Field(d.FieldId), d.Counter
	}
	return v
}

// GPUValues implements Client.
func (c *goDCGM) GPUValues(gpu uint, fields []Field) ([]FieldValue, error) {
	values, err := godcgm.EntityGetLatestValues(godcgm.FE_GPU, gpu, shorts(fields))
	if err != nil {
		return nil, fmt.Errorf("reading DCGM fields of GPU %d: %w", gpu, err)
	}
	return fieldValues(fields, values), nil
}

// GlobalValues implements Client.
func (c *goDCGM) GlobalValues(fields []Field) ([]FieldValue, error) {
	if !c.hasGlobal {
		out := make([]FieldValue, len(fields))
		for i, f := range fields {
			out[i] = FieldValue{Field: f}
		}
		return out, nil
	}
	values, err := godcgm.EntityGetLatestValues(godcgm.FE_NONE, 0, shorts(fields))
	if err != nil {
		return nil, fmt.Errorf("reading DCGM global fields: %w", err)
	}
	return fieldValues(fields, values), nil
}

// fieldValues converts go-dcgm's values, marking blank and failed ones not
// valid. DCGM returns one value per field asked, in order.
func fieldValues(fields []Field, values []godcgm.FieldValue_v1) []FieldValue {
	out := make([]FieldValue, len(fields))
	for i, f := range fields {
		out[i] = FieldValue{Field: f}
		if i >= len(values) {
			continue
		}
		v := values[i]
		if v.Status != godcgm.DCGM_ST_OK {
			continue
		}
		if v.TS > 0 {
			out[i].Time = time.UnixMicro(v.TS)
		}
		switch v.FieldType {
		case godcgm.DCGM_FT_INT64:
			if n := v.Int64(); !godcgm.IsInt64Blank(n) {
				out[i].Int, out[i].Valid = n, true
			}
		case godcgm.DCGM_FT_STRING:
			switch s := v.String(); s {
			case "", godcgm.DCGM_FT_STR_BLANK, godcgm.DCGM_FT_STR_NOT_FOUND,
				godcgm.DCGM_FT_STR_NOT_SUPPORTED, godcgm.DCGM_FT_STR_NOT_PERMISSIONED:
			default:
				out[i].String, out[i].Valid = s, true
			}
		}
	}
	return out
}

// HealthCheck implements Client.
func (c *goDCGM) HealthCheck() ([]Incident, error) {
	resp, err := godcgm.HealthCheck(c.group)
	if err != nil {
		return nil, fmt.Errorf("running DCGM health check: %w", err)
	}
	out := make([]Incident, 0, len(resp.Incidents))
	for _, in := range resp.Incidents {
		out = append(out, Incident{
			Code:    HealthCode(in.Error.Code),
			Message: in.Error.Message,
			Entity:  entityFromGoDCGM(in.EntityInfo),
			System:  HealthSystem(in.System),
			Health:  HealthResult(in.Health),
		})
	}
	return out, nil
}

// entityFromGoDCGM converts an incident's entity. A link's entity id packs
// its parent's entity group (bits 0-7), its port index (bits 8-23) and its
// parent's id (bits 24-31): dcgm_link_t in dcgm_structs.h.
func entityFromGoDCGM(e godcgm.GroupEntityPair) Entity {
	kind := func(g godcgm.Field_Entity_Group) EntityKind {
		switch g {
		case godcgm.FE_NONE:
			return EntityNone
		case godcgm.FE_GPU:
			return EntityGPU
		case godcgm.FE_SWITCH:
			return EntitySwitch
		case godcgm.FE_LINK:
			return EntityLink
		default:
			return EntityOther
		}
	}
	out := Entity{Kind: kind(e.EntityGroupId), ID: e.EntityId}
	if out.Kind == EntityLink {
		raw := uint32(e.EntityId)
		out.Parent = kind(godcgm.Field_Entity_Group(raw & 0xff))
		out.Link = uint((raw >> 8) & 0xffff)
		out.ID = uint(raw >> 24)
	}
	return out
}

// DroppedViolations implements Client. go-dcgm's counter is process-wide.
func (c *goDCGM) DroppedViolations() uint64 {
	return godcgm.PolicyViolationDropCount()
}

// Close implements Client: it removes the watches and groups it created and
// releases its reference on go-dcgm's connection.
func (c *goDCGM) Close() error {
	var errs []error
	if c.hasGroup {
		if c.hasGPUField {
			errs = append(errs, godcgm.UnwatchFields(c.gpuFields, c.group), godcgm.FieldGroupDestroy(c.gpuFields))
		}
		if c.hasGlobal {
			errs = append(errs, godcgm.UnwatchFields(c.global, c.group), godcgm.FieldGroupDestroy(c.global))
		}
		errs = append(errs, godcgm.DestroyGroup(c.group))
	}
	if c.cleanup != nil {
		c.cleanup()
		c.cleanup = nil
	}
	return errors.Join(errs...)
}

// shorts converts field ids to go-dcgm's type.
func shorts(fields []Field) []godcgm.Short {
	out := make([]godcgm.Short, len(fields))
	for i, f := range fields {
		out[i] = godcgm.Short(f)
	}
	return out
}
