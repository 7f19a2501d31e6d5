package dcgm

import (
	"context"
	"time"
)

// Client is what the source needs from DCGM. Connect implements it with
// go-dcgm; tests use a fake. A Client is connected when its constructor
// returns, and its methods may be called from one goroutine at a time.
type Client interface {
	// GPUs lists the GPUs DCGM supports, with their UUIDs. It is called once
	// after connecting.
	GPUs() ([]GPU, error)
	// PolicyViolations subscribes to DCGM's XID and NVLink policy
	// violations. The channel is closed when ctx is done; a close before
	// that means the subscription died.
	PolicyViolations(ctx context.Context) (<-chan Violation, error)
	// GPUValues returns the latest values of fields for one GPU (DCGM's
	// GPU id), in the order asked.
	GPUValues(gpu uint, fields []Field) ([]FieldValue, error)
	// GlobalValues returns the latest values of global fields (fields not
	// tied to an entity, such as the IMEX status), in the order asked.
	GlobalValues(fields []Field) ([]FieldValue, error)
	// HealthCheck runs DCGM's health watches and returns their incidents:
	// what DCGM found wrong since the previous call. The first call after
	// connecting may return none.
	HealthCheck() ([]Incident, error)
	// DroppedViolations is how many policy violations were dropped because
	// a listener was slow; it only grows.
	DroppedViolations() uint64
	// Close disconnects. The client is not used after Close.
	Close() error
}

// NewClientFunc connects to DCGM as configured.
type NewClientFunc func(ctx context.Context, cfg ClientConfig) (Client, error)

// Mode is how the source reaches DCGM.
type Mode string

const (
	// ModeEmbedded runs DCGM's host engine inside the agent's process.
	ModeEmbedded Mode = "embedded"
	// ModeStandalone connects to a running nv-hostengine (for example the
	// GPU Operator's DCGM service) over TCP or a Unix socket.
	ModeStandalone Mode = "standalone"
)

// ClientConfig is what a NewClientFunc connects with. Source.Run fills it.
type ClientConfig struct {
	// Mode is embedded or standalone.
	Mode Mode
	// Address is nv-hostengine's "host:port" or, when UnixSocket is true,
	// its socket path. Empty in embedded mode.
	Address string
	// UnixSocket says Address is a Unix socket path.
	UnixSocket bool
	// UpdateInterval is how often DCGM should refresh the watched fields
	// (the source's poll interval).
	UpdateInterval time.Duration
	// GPUFields are the per-GPU fields to watch.
	GPUFields []Field
	// GlobalFields are the global fields to watch. A DCGM too old to know
	// them returns them as not valid instead of failing.
	GlobalFields []Field
	// HealthSystems are the health watches to enable. A DCGM too old to
	// know HealthIMEX watches IMEX under HealthNVLink, so a client that is
	// refused the IMEX bit enables the others without it.
	HealthSystems HealthSystem
}

// HealthSystem is a set of DCGM health watches (dcgmHealthSystems_t, the
// DCGM_HEALTH_WATCH_* bits of dcgm_structs.h).
type HealthSystem uint

// The health watches the source can enable, with DCGM's bit values.
const (
	// HealthPCIe is DCGM_HEALTH_WATCH_PCIE: the PCIe replay rate.
	HealthPCIe HealthSystem = 0x1
	// HealthNVLink is DCGM_HEALTH_WATCH_NVLINK: NVLink error counters, link
	// states and fabric health (and IMEX before DCGM had HealthIMEX).
	HealthNVLink HealthSystem = 0x2
	// HealthMem is DCGM_HEALTH_WATCH_MEM: ECC errors, page retirement and
	// row remapping.
	HealthMem HealthSystem = 0x10
	// HealthInforom is DCGM_HEALTH_WATCH_INFOROM: InfoROM validity.
	HealthInforom HealthSystem = 0x40
	// HealthThermal is DCGM_HEALTH_WATCH_THERMAL: thermal clock events.
	HealthThermal HealthSystem = 0x80
	// HealthPower is DCGM_HEALTH_WATCH_POWER: power readings and power clock
	// events.
	HealthPower HealthSystem = 0x100
	// HealthNVSwitchNonFatal is DCGM_HEALTH_WATCH_NVSWITCH_NONFATAL:
	// non-fatal NVSwitch errors.
	HealthNVSwitchNonFatal HealthSystem = 0x400
	// HealthNVSwitchFatal is DCGM_HEALTH_WATCH_NVSWITCH_FATAL: fatal NVSwitch
	// errors and NVSwitch links that are down.
	HealthNVSwitchFatal HealthSystem = 0x800
	// HealthIMEX is DCGM_HEALTH_WATCH_IMEX: the IMEX domain and daemon.
	HealthIMEX HealthSystem = 0x2000
)

// DefaultHealthSystems are the health watches the source enables: memory,
// PCIe, InfoROM, thermal, power, NVLink, NVSwitch fatal and non-fatal, and
// IMEX. The others (PMU, MCU, SM, driver, ConnectX) are left off: DCGM
// implements no check for PMU, MCU and SM, the driver watch only turns the
// GPU recovery action into incidents (the source reads that field itself,
// see FieldGPURecoveryAction), and ConnectX cards are not in the group.
const DefaultHealthSystems = HealthMem | HealthPCIe | HealthInforom | HealthThermal | HealthPower |
	HealthNVLink | HealthNVSwitchFatal | HealthNVSwitchNonFatal | HealthIMEX

// HealthResult is how DCGM grades an incident (dcgmHealthWatchResults_t).
type HealthResult uint

// DCGM's grades (DCGM_HEALTH_RESULT_*).
const (
	// HealthPass is DCGM_HEALTH_RESULT_PASS.
	HealthPass HealthResult = 0
	// HealthWarn is DCGM_HEALTH_RESULT_WARN: a warning.
	HealthWarn HealthResult = 10
	// HealthFail is DCGM_HEALTH_RESULT_FAIL: a failure.
	HealthFail HealthResult = 20
)

// GPU is one GPU as DCGM numbers it.
type GPU struct {
	// ID is DCGM's GPU id, the number policy violations and incidents use.
	ID uint
	// UUID is the GPU's UUID ("GPU-8f6c…"); empty when DCGM did not say.
	UUID string
	// PCIBusID is the GPU's PCI bus id; empty when DCGM did not say.
	PCIBusID string
}

// ViolationKind is the policy condition a violation is about; it is also the
// kind label of the policy violation metric.
type ViolationKind string

const (
	// ViolationXID is an XID error.
	ViolationXID ViolationKind = "xid"
	// ViolationNVLink is an NVLink error counter that moved.
	ViolationNVLink ViolationKind = "nvlink"
	// ViolationOther is any other policy condition (the source does not
	// subscribe to others; a client that delivers one gets it counted and
	// ignored).
	ViolationOther ViolationKind = "other"
)

// Violation is one DCGM policy violation.
type Violation struct {
	// Kind is the condition that was violated.
	Kind ViolationKind
	// GPU is DCGM's id of the GPU it happened on.
	GPU uint
	// Time is when DCGM saw it (second resolution); zero if unknown.
	Time time.Time
	// XID is the XID number, for ViolationXID.
	XID uint
	// Field is the NVLink counter field that tripped the policy, for
	// ViolationNVLink: a per-GPU total or a per-link field.
	Field Field
	// Counter is the error count DCGM reported with it, for ViolationNVLink.
	Counter uint
}

// FieldValue is the latest value of one field.
type FieldValue struct {
	// Field is the field.
	Field Field
	// Valid is false when DCGM has no usable value: not watched yet, blank,
	// not supported on this GPU or not permitted.
	Valid bool
	// Int is the value of an integer field.
	Int int64
	// String is the value of a string field.
	String string
	// Time is when DCGM sampled the value; zero if unknown.
	Time time.Time
}

// HealthCode is a DCGM health error code (dcgmError_t, DCGM_FR_*, numbered
// as in dcgm_errors.h). mapping.go's incidentRules says what each becomes.
type HealthCode uint

// The health error codes the source's own logic names (dcgm_errors.h).
const (
	// HealthNVLinkDown is DCGM_FR_NVLINK_DOWN: an NVLink link is down.
	HealthNVLinkDown HealthCode = 14
	// HealthNVLinkCRCErrorThreshold is DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD:
	// more than 100 CRC errors a second.
	HealthNVLinkCRCErrorThreshold HealthCode = 70
	// HealthNVLinkErrorCritical is DCGM_FR_NVLINK_ERROR_CRITICAL: an NVLink
	// error counter that should stay at 0 moved.
	HealthNVLinkErrorCritical HealthCode = 71
	// HealthXIDError is DCGM_FR_XID_ERROR: an XID was seen.
	HealthXIDError HealthCode = 101
	// HealthSXIDError is DCGM_FR_SXID_ERROR: a fatal NVSwitch SXID.
	HealthSXIDError HealthCode = 109
	// HealthFabricManagerTrainingError is
	// DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR: Fabric Manager did not finish
	// training the NVLink fabric.
	HealthFabricManagerTrainingError HealthCode = 112
	// HealthIMEXUnhealthy is DCGM_FR_IMEX_UNHEALTHY: the IMEX domain or
	// daemon status is unhealthy.
	HealthIMEXUnhealthy HealthCode = 122
)

// EntityKind is the kind of DCGM entity an incident is about.
type EntityKind string

const (
	// EntityNone is no entity: the node or a global service (IMEX).
	EntityNone EntityKind = "none"
	// EntityGPU is a GPU; the id is DCGM's GPU id.
	EntityGPU EntityKind = "gpu"
	// EntitySwitch is an NVSwitch; the id is DCGM's switch id.
	EntitySwitch EntityKind = "switch"
	// EntityLink is an NVLink port of a GPU or a switch.
	EntityLink EntityKind = "link"
	// EntityOther is any other entity (CPU, ConnectX, a MIG instance).
	EntityOther EntityKind = "other"
)

// Entity is what a health incident is about.
type Entity struct {
	// Kind is the entity's kind.
	Kind EntityKind
	// ID is DCGM's id of the GPU or switch; for a link, of the GPU or
	// switch the link belongs to.
	ID uint
	// Parent is EntityGPU or EntitySwitch for a link; empty otherwise.
	Parent EntityKind
	// Link is the link's port index, for a link.
	Link uint
}

// Incident is one problem a DCGM health check reported.
type Incident struct {
	// Code is DCGM's error code.
	Code HealthCode
	// Message is DCGM's description.
	Message string
	// Entity is what it is about.
	Entity Entity
	// System is the health watch that reported it; DCGM reports incidents
	// it derives from XIDs it always watches (fallen off the bus, contained
	// and uncontained errors) under all systems (0xFFFFFFFF).
	System HealthSystem
	// Health is how DCGM graded it: HealthWarn or HealthFail. A few codes
	// map differently when DCGM only warns (see incidentRules).
	Health HealthResult
}
