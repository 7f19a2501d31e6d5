package kmsg

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The probe-time text as the driver prints it (osapi.c, one nv_printf with
// two embedded newlines), delivered as three records, as syslog and journal
// exports do.
var lostSplit = []string{
	"3,200,10,-;NVRM: The NVIDIA GPU 0000:b3:00.0",
	"3,201,10,-;NVRM: (PCI ID: 10de:26b5) installed in this system has",
	"3,202,10,-;NVRM: fallen off the bus and is not responding to commands.",
}

func TestJoinerJoinsTheSplitGPULostText(t *testing.T) {
	g := NewWithT(t)
	var j Joiner
	now := time.Now()
	g.Expect(j.Feed(lostSplit[0], now)).To(BeEmpty())
	g.Expect(j.Feed(lostSplit[1], now)).To(BeEmpty())
	out := j.Feed(lostSplit[2], now)
	g.Expect(out).To(HaveLen(1))
	e, err := Parse(out[0])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e.Kind).To(Equal(KindGPULost))
	g.Expect(e.PCIBusID).To(Equal("0000:b3:00.0"))
	g.Expect(e.Seq).To(BeEquivalentTo(202), "the joined record carries the last record's sequence, so the cursor covers all three")
	g.Expect(e.Text).To(Equal("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands."))
	_, holding := j.Holding()
	g.Expect(holding).To(BeFalse())
}

func TestJoinerGivesBackWhatIsNotTheGPULostText(t *testing.T) {
	g := NewWithT(t)
	var j Joiner
	now := time.Now()
	other := "6,203,11,-;usb 1-1: new high-speed USB device"
	g.Expect(j.Feed(lostSplit[0], now)).To(BeEmpty())
	// A record that does not continue the text: both come back as they were.
	g.Expect(j.Feed(other, now)).To(Equal([]string{lostSplit[0], other}))

	// An unsupported-GPU notice split the same way is given back once it
	// has more lines than the GPU-lost text.
	notice := []string{
		"4,300,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)",
		"4,301,1,-;NVRM: installed in this system is not supported by the",
		"4,302,1,-;NVRM: NVIDIA 535.104 driver release.",
		"4,303,1,-;NVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'",
		"4,304,1,-;NVRM: in this release's README.",
	}
	var got []string
	for _, r := range notice {
		got = append(got, j.Feed(r, now)...)
	}
	g.Expect(got).To(Equal(notice))

	// A held first line is given back by Flush.
	g.Expect(j.Feed(lostSplit[0], now)).To(BeEmpty())
	at, holding := j.Holding()
	g.Expect(holding).To(BeTrue())
	g.Expect(at).To(Equal(now))
	g.Expect(j.Flush()).To(Equal([]string{lostSplit[0]}))
}

func TestJoinerJoinsOnlyKernelRecords(t *testing.T) {
	g := NewWithT(t)
	var j Joiner
	now := time.Now()
	// A process's copy of the first line is not held: it comes straight back.
	forged := "11,210,10,-;NVRM: The NVIDIA GPU 0000:b3:00.0"
	g.Expect(j.Feed(forged, now)).To(Equal([]string{forged}))
	// A process's record does not continue the kernel's text either.
	g.Expect(j.Feed(lostSplit[0], now)).To(BeEmpty())
	cont := "11,211,10,-;NVRM: (PCI ID: 10de:26b5) installed in this system has"
	g.Expect(j.Feed(cont, now)).To(Equal([]string{lostSplit[0], cont}))
}

func TestJoinerPassesOtherRecordsStraight(t *testing.T) {
	g := NewWithT(t)
	var j Joiner
	for _, r := range []string{
		"3,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.",
		"3,2,1,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
		"3,3,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands.",
		"garbage",
		" SUBSYSTEM=pci",
	} {
		g.Expect(j.Feed(r, time.Now())).To(Equal([]string{r}))
	}
}

func TestMalformedShapesAreLoggedOnce(t *testing.T) {
	g := NewWithT(t)
	var r run
	_, err1 := Parse("3,1,1,-;NVRM: Xid (PCI:0000:3b:00): abc, x")
	_, err2 := Parse("3,2,1,-;NVRM: Xid (PCI:0000:5e:00): xyz, y")
	_, err3 := Parse("3,3,1,-;NVRM: Xid (invalid): z")
	g.Expect(r.newShape(err1)).To(BeTrue())
	g.Expect(r.newShape(err2)).To(BeFalse(), "the same shape with other text")
	g.Expect(r.newShape(err3)).To(BeTrue(), "another shape")
}
