package dcgm

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// TestSlowGPUFromDCGMFields: the DCGM fields feed the same slow-GPU judges
// as NVML: a GPU under HW slowdown (DCGM_FI_DEV_CLOCKS_EVENT_REASONS 0x8)
// and on a gen 4 link of 5 while busy for more than half of a 30 s window,
// and with a failed row remap, gives Throttled, PCIeDegraded and
// MemoryRepair findings from the dcgm source; a GPU whose fields DCGM has
// no value for gives none.
func TestSlowGPUFromDCGMFields(t *testing.T) {
	g := NewWithT(t)
	client := newFakeClient()
	p := newPoller(t, Source{Performance: slowgpu.Config{Window: 30 * time.Second}}, client)
	for f, v := range map[Field]int64{
		FieldClocksEventReasons: 0x8, FieldSMClock: 1095, FieldMaxSMClock: 1980,
		FieldPCIeLinkGen: 4, FieldPCIeMaxLinkGen: 5, FieldPCIeLinkWidth: 16, FieldPCIeMaxLinkWidth: 16, FieldGPUUtil: 97,
		FieldRowRemapPending: 0, FieldRowRemapFailed: 1, FieldRowRemapUncorrectable: 3,
		FieldGPUTemp: 60, FieldSlowdownTemp: 87,
	} {
		client.setCounter(0, f, v)
	}
	var got []monitors.Finding
	for i := range 4 {
		d := poll
		if i == 0 {
			d = 0
		}
		p.poll(d)
		got = append(got, p.rec.take()...)
	}
	codes := map[gpuhealthv1alpha1.Check]string{}
	for _, f := range got {
		g.Expect(f.Source).To(Equal(gpuhealthv1alpha1.SourceDCGM))
		g.Expect(f.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-aaaa"}))
		codes[f.Check] = f.Code
	}
	g.Expect(codes).To(Equal(map[gpuhealthv1alpha1.Check]string{
		gpuhealthv1alpha1.CheckMemoryRepair: slowgpu.CodeRowRemapFailure,
		gpuhealthv1alpha1.CheckThrottled:    "HW_SLOWDOWN",
		gpuhealthv1alpha1.CheckPCIeDegraded: slowgpu.CodePCIeGeneration,
	}), "27 °C of thermal margin is no finding")
}
