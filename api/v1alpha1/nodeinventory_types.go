package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeInventory is what a node's gpuhealth-monitor read about the node's
// NVIDIA stack: driver and CUDA versions, each GPU's product, VBIOS,
// InfoROM and modes, Fabric Manager and IMEX, and how many GPUs NVML and
// the PCI bus list. One object per node, named after it, written by that
// node's monitor only (the install's admission policy holds a monitor to
// the object of the node its token is bound to). The operator compares
// nodes of one pool with it to find drift.
//
// The report is the spec, as with a ResourceSlice: it is what its one
// writer, the node's monitor, says, and nothing else writes it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ninv,categories=gpuhealth
// +kubebuilder:printcolumn:name="Driver",type=string,JSONPath=`.spec.driver.version`
// +kubebuilder:printcolumn:name="CUDA",type=string,JSONPath=`.spec.driver.cudaVersion`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.spec.gpuCount`
// +kubebuilder:printcolumn:name="PCI GPUs",type=integer,JSONPath=`.spec.pci.gpus`
// +kubebuilder:printcolumn:name="Observed",type=date,JSONPath=`.spec.observedAt`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.nodeName",message="a NodeInventory is named after its node: metadata.name must equal spec.nodeName"
type NodeInventory struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the monitor's report.
	// +required
	Spec NodeInventorySpec `json:"spec"`
}

// NodeInventorySpec is one node's NVIDIA stack as its monitor read it.
type NodeInventorySpec struct {
	// nodeName is the node the report is about; it is also the object's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`

	// observedAt is when the monitor last read the stack.
	// +required
	ObservedAt metav1.Time `json:"observedAt"`

	// driver is the NVIDIA driver as NVML reports it; empty while NVML is
	// unavailable on the node.
	// +optional
	Driver DriverInventory `json:"driver,omitempty"`

	// gpuCount is how many GPUs NVML lists; absent while NVML is
	// unavailable.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GPUCount *int32 `json:"gpuCount,omitempty"`

	// gpus are the GPUs NVML lists, by index.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	GPUs []GPUInventory `json:"gpus,omitempty"`

	// pci is what the PCI bus shows, whatever NVML sees.
	// +optional
	PCI PCIInventory `json:"pci,omitempty"`

	// services are NVIDIA's host services the monitor looks for.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Services []ServiceInventory `json:"services,omitempty"`

	// nics are the node's RDMA ports (InfiniBand, RoCE) as the monitor's
	// ib source last read them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	NICs []NICInventory `json:"nics,omitempty"`
}

// NICInventory is one RDMA port and its adapter.
type NICInventory struct {
	// device is the RDMA device (mlx5_0).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Device string `json:"device"`

	// port is the port number.
	// +required
	// +kubebuilder:validation:Minimum=0
	Port int32 `json:"port"`

	// hcaType is the adapter's hca_type (MT4129 is ConnectX-7).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	HCAType string `json:"hcaType,omitempty"`

	// firmware is the adapter's firmware version (fw_ver).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Firmware string `json:"firmware,omitempty"`

	// linkLayer is InfiniBand or Ethernet (RoCE).
	// +optional
	// +kubebuilder:validation:MaxLength=16
	LinkLayer string `json:"linkLayer,omitempty"`

	// rate is the port's rate as the kernel prints it, for example
	// "400 Gb/sec (4X NDR)"; empty while the port is not up (a port that is
	// down reports a rate it does not run at).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Rate string `json:"rate,omitempty"`

	// up is true while the port is ACTIVE and LinkUp.
	// +optional
	Up bool `json:"up,omitempty"`

	// compute is true for a port of the compute fabric (judged by the
	// monitor), false for others (a management NIC).
	// +optional
	Compute bool `json:"compute,omitempty"`
}

// DriverInventory is the driver NVML runs on.
type DriverInventory struct {
	// version is the kernel driver's version (nvmlSystemGetDriverVersion),
	// for example "570.133.20".
	// +optional
	// +kubebuilder:validation:MaxLength=80
	Version string `json:"version,omitempty"`

	// cudaVersion is the CUDA version the driver supports
	// (nvmlSystemGetCudaDriverVersion_v2), for example "12.8".
	// +optional
	// +kubebuilder:validation:MaxLength=16
	CUDAVersion string `json:"cudaVersion,omitempty"`

	// nvmlVersion is the NVML library's version.
	// +optional
	// +kubebuilder:validation:MaxLength=80
	NVMLVersion string `json:"nvmlVersion,omitempty"`
}

// GPUInventory is one GPU's identity, firmware and modes. A value NVML
// could not read (not supported on the GPU) is left empty.
type GPUInventory struct {
	// index is NVML's index of the GPU.
	// +required
	// +kubebuilder:validation:Minimum=0
	Index int32 `json:"index"`

	// uuid is the GPU's UUID.
	// +optional
	// +kubebuilder:validation:MaxLength=96
	UUID string `json:"uuid,omitempty"`

	// pciBusID is the GPU's PCI address, as the kernel writes it.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	PCIBusID string `json:"pciBusID,omitempty"`

	// product is the GPU's name, for example "NVIDIA H100 80GB HBM3".
	// +optional
	// +kubebuilder:validation:MaxLength=96
	Product string `json:"product,omitempty"`

	// vbios is the VBIOS version.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	VBIOS string `json:"vbios,omitempty"`

	// inforom is the InfoROM image version.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	InfoROM string `json:"inforom,omitempty"`

	// ecc is the current ECC mode: Enabled or Disabled.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	ECC string `json:"ecc,omitempty"`

	// persistence is the persistence mode: Enabled or Disabled.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Persistence string `json:"persistence,omitempty"`

	// mig is the current MIG mode: Enabled or Disabled.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	MIG string `json:"mig,omitempty"`

	// powerLimitWatts is the power management limit in watts.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PowerLimitWatts int32 `json:"powerLimitWatts,omitempty"`
}

// PCIInventory is what the PCI bus shows of NVIDIA's devices.
type PCIInventory struct {
	// gpus is how many NVIDIA display or 3D controllers the PCI bus has.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GPUs int32 `json:"gpus,omitempty"`

	// nvSwitches is how many NVSwitches the PCI bus has.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NVSwitches int32 `json:"nvSwitches,omitempty"`

	// notInNVML are the PCI addresses of NVIDIA GPUs on the bus that NVML
	// does not list.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=32
	NotInNVML []string `json:"notInNVML,omitempty"`
}

// ServiceInventory is one of NVIDIA's host services.
type ServiceInventory struct {
	// name is the service: nvidia-fabricmanager, nvidia-persistenced or
	// nvidia-imex.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// installed says whether the service's program is on the host.
	// +optional
	Installed bool `json:"installed,omitempty"`

	// running says whether its process runs.
	// +optional
	Running bool `json:"running,omitempty"`

	// starts is how many times it started within the monitor's window.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Starts int32 `json:"starts,omitempty"`

	// version is the installed package's version, where the host's package
	// database says it.
	// +optional
	// +kubebuilder:validation:MaxLength=80
	Version string `json:"version,omitempty"`
}

// NodeInventoryList is a list of NodeInventories.
// +kubebuilder:object:root=true
type NodeInventoryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeInventory `json:"items"`
}
