package nvml

import (
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	. "github.com/onsi/gomega"
)

// TestFabricInfoFallsBackOnR535: a driver without
// nvmlDeviceGetGpuFabricInfoV (R535) is asked the old call, never the new
// one, which would abort the agent there.
func TestFabricInfoFallsBackOnR535(t *testing.T) {
	g := NewWithT(t)
	dev := &mock.Device{
		GetGpuFabricInfoFunc: func() (gonvml.GpuFabricInfo, gonvml.Return) {
			return gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_COMPLETED, CliqueId: 3}, gonvml.SUCCESS
		},
	}
	s := &Source{}
	info, ret := s.fabricInfo(&device{handle: dev})
	g.Expect(ret).To(Equal(gonvml.SUCCESS))
	g.Expect(info.State).To(Equal(uint8(gonvml.GPU_FABRIC_STATE_COMPLETED)))
	g.Expect(info.CliqueId).To(Equal(uint32(3)))
	g.Expect(dev.GetGpuFabricInfoCalls()).To(HaveLen(1))
	g.Expect(dev.GetGpuFabricInfoVCalls()).To(BeEmpty())
	g.Expect(OptionalSymbols[2]).To(Equal("nvmlDeviceGetGpuFabricInfoV"), "lookupSymbols reads them by index")
}
