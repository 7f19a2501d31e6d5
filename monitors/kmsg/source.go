package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Defaults for the Source fields left zero.
const (
	// DefaultPath is the kernel's structured log device.
	DefaultPath = "/dev/kmsg"
	// DefaultBootIDPath holds a random UUID the kernel picks at every boot.
	DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"
	// DefaultUptimePath holds the seconds since boot, to turn record
	// timestamps into wall-clock times.
	DefaultUptimePath = "/proc/uptime"
	// DefaultPollInterval is how often a regular file or FIFO is checked for
	// new data once it is read to the end. 100 ms keeps a test fast and costs
	// one read system call per tick; /dev/kmsg itself is not polled.
	DefaultPollInterval = 100 * time.Millisecond
	// DefaultFlushInterval is the least time between two cursor writes. A
	// burst of XIDs (XID 13 prints several lines per fault) then costs one
	// write a second, and a crash replays at most a second of findings.
	DefaultFlushInterval = time.Second
)

// Sizes of the reader's buffers.
const (
	// recordBufferSize holds any /dev/kmsg record: the kernel's limit for a
	// record with its dictionary (CONSOLE_EXT_LOG_MAX) is 8 KiB, and a read
	// into a smaller buffer fails with EINVAL.
	recordBufferSize = 16 << 10
	// maxLineSize bounds a line of a regular file or FIFO without a newline;
	// longer text is cut into pieces (and is then malformed or not ours).
	maxLineSize = 64 << 10
	// queueSize is how many records the reader may read ahead of the parser.
	// When the kernel buffer is replayed at start (a few thousand records),
	// the parser catches up in milliseconds.
	queueSize = 1024
)

// Source reads NVIDIA XID and NVSwitch SXid lines, and the mlx5 driver's
// faults of ConnectX network adapters, from the kernel log and reports each
// as a finding. It works when NVML itself is hung.
//
// Only the kernel's own records count (see Parse): a record a process wrote
// to /dev/kmsg is counted (result "userspace") and never reported, so a
// privileged container on the node cannot forge an XID.
//
// Findings:
//   - XID: Source kmsg, Check XID, Component GPU with the GPU's UUID when
//     Resolver knows the PCI bus id (the canonical bus id otherwise), Code the
//     XID number, Message the text after the number. Severity and Action
//     are left empty: the pipeline classifies XIDs from api/xid (XID 154's
//     recovery action is decoded from the message).
//   - SXid: Source kmsg, Check SXID, Component NVSwitch with the switch's
//     canonical bus id, Code the SXid number, Message the text after the
//     fatal flag. A "Fatal" SXid is Severity Fatal with Action RebootNode:
//     the switch stops forwarding on the affected links and NVIDIA's fabric
//     manager guidance is to reset the switch and its GPUs, which on a
//     single-host system is a reboot; recertification then proves the
//     fabric. It is not ContactSupport, because most fatal SXids clear
//     after that reset. A "Non-fatal" SXid is Severity Degraded with Action
//     None: the hardware corrected or contained it; it is recorded so that
//     a rate of them is visible.
//   - NIC: Source kmsg, Check NIC, Component NIC, Code one of the NIC*
//     codes, Severity and Action from the NIC table (nic.go), Message the
//     driver's text and the reason. Which NIC a line is about decides
//     whether it is reported and how hard (see NICResolver): a line about a
//     management NIC is not reported at all, one about the compute fabric
//     is named by its RDMA device and judged by the table, and one about a
//     NIC nobody vouches for is named by its PCI address (its interface
//     name when the line has no address) and never judged worse than
//     Degraded, with Action None.
//
// Time: a finding's time is the record's kernel timestamp (time since boot)
// plus the boot time, which Run computes once from UptimePath; when that
// cannot be read, or the sum lies in the future, it is the time the record
// was read. The kernel stamps records with its monotonic clock, which stops
// while the machine is suspended and /proc/uptime does not; GPU servers do
// not suspend.
//
// Cursor and replay: after the findings of a batch of records, Run makes
// them durable (Sync) and then saves the last processed sequence number and
// the boot id to StateDir/kmsg.cursor. At
// start, when the saved boot id is the current one, records up to the saved
// sequence number are skipped, so that a restart does not replay them. When
// the boot id differs (the node rebooted) or there is no cursor, every
// record still in the kernel's ring buffer is processed: all of this boot's
// log is new to us, and a fault logged while the agent was starting (or
// while it was down) must not be lost. The pipeline coalesces a repeated
// report into the same NodeHealthEvent. A crash between reporting a finding
// and saving the cursor reports it again after the restart; one counted and
// spooled before the cursor moved is never reported twice, so the counts
// after a crash are exact.
type Source struct {
	// Path is the file to read; empty means DefaultPath. A character device
	// is read as /dev/kmsg, one record per read from the start of the ring
	// buffer. Anything else (a regular file, a FIFO) is read line by line
	// and then followed like `tail -f`, for tests and replays.
	Path string
	// StateDir is the directory of the cursor file; it is created if
	// missing. Empty means no cursor: every start processes the whole ring
	// buffer again.
	StateDir string
	// BootIDPath is the file with the current boot id; empty means
	// DefaultBootIDPath. When it cannot be read the cursor is neither used
	// nor saved, because skipping by sequence number is only safe within one
	// boot.
	BootIDPath string
	// UptimePath is the file whose first field is the seconds since boot;
	// empty means DefaultUptimePath.
	UptimePath string
	// Resolver maps a GPU's canonical PCI bus id (see NormalizePCIBusID) to
	// its UUID. Nil, or ok false, reports the GPU by its bus id.
	Resolver func(pciBusID string) (uuid string, ok bool)
	// NICResolver says which network adapter an mlx5 line is about. It gets
	// the adapter function's canonical PCI bus id and the interface name the
	// line names; either may be empty (a netdev_err line has both, a dev_err
	// line only the address, the NETDEV WATCHDOG text before v6.8 only the
	// interface). It returns the adapter's RDMA device name ("mlx5_0") and
	// whether it is part of the compute fabric; ok false means it does not
	// know the adapter. The agent wires the ib source's view (ib.Source's
	// Resolve), which is the one place that decides which ports are the
	// compute fabric.
	//
	// Nil, or ok false, reports the line with the adapter's PCI address (or
	// interface name) as the component id and its severity capped at
	// Degraded with Action None: without the ib source's view a management
	// NIC cannot be told from the compute fabric, and a fault of a
	// management NIC must never quarantine a node. ok true and compute
	// false is a management NIC: the line is not reported. It must not
	// block: Run calls it for each NIC line.
	NICResolver func(pciBusID, netdev string) (device string, compute bool, ok bool)
	// PollInterval is how often a regular file or FIFO at its end is checked
	// for new data; zero means DefaultPollInterval.
	PollInterval time.Duration
	// FlushInterval is the least time between two cursor writes; zero means
	// DefaultFlushInterval. The cursor is also saved when Run returns.
	FlushInterval time.Duration
	// Clock gives the time of findings; nil means the real clock.
	Clock clock.PassiveClock
	// Sync, when set, makes the findings reported so far durable, marked
	// with the generation of the cursor write about to happen (the agent
	// passes the pipeline's Sync). It is called before every cursor write,
	// and a failure keeps the cursor where it was: the cursor never covers
	// a count that a crash could lose.
	Sync func(gen uint64) error
	// Seal, when set, is told the generation of each cursor write once it
	// is durable: the pipeline publishes the counts it covers only then,
	// so that a crash never counts an occurrence twice (the pipeline's
	// Seal).
	Seal func(gen uint64)
	// Reading, when set, is told true once the log is open and being read,
	// and false when Run returns.
	Reading func(bool)
}

// Name returns "kmsg".
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceKmsg) }

var _ monitors.Source = &Source{}

// Run reads the kernel log until ctx is done. It returns an error wrapping
// monitors.ErrUnavailable when Path does not exist or may not be read (the
// agent needs CAP_SYSLOG, or kernel.dmesg_restrict=0, for /dev/kmsg), and
// another error when reading fails for good.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	log := ctrllog.FromContext(ctx).WithValues("source", s.Name())
	path := valueOr(s.Path, DefaultPath)

	f, device, err := openLog(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return monitors.Unavailable("opening %s: %v", path, err)
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	if s.Reading != nil {
		s.Reading(true)
		defer s.Reading(false)
	}
	// Closing the file is what ends a read blocked on /dev/kmsg or a FIFO:
	// both are in the runtime's poller, so Close wakes the reader.
	stopClose := context.AfterFunc(ctx, func() { _ = f.Close() })
	defer stopClose()

	r := &run{
		src:    s,
		log:    log,
		report: report,
		clock:  s.Clock,
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	r.boot, r.bootOK = bootTime(valueOr(s.UptimePath, DefaultUptimePath), r.clock.Now())
	r.start(valueOr(s.BootIDPath, DefaultBootIDPath))

	records := make(chan string, queueSize)
	readDone := make(chan error, 1)
	go func() {
		if device {
			readDone <- readRecords(ctx, f, records)
		} else {
			readDone <- readLines(ctx, f, monitors.PositiveOr(s.PollInterval, DefaultPollInterval), records)
		}
	}()

	flushEvery := monitors.PositiveOr(s.FlushInterval, DefaultFlushInterval)
	// Armed only while a cursor write waits for flushEvery to pass. Since
	// Go 1.23 a stopped timer's channel never delivers a stale value.
	flushTimer := time.NewTimer(time.Hour)
	flushTimer.Stop()
	timerArmed := false
	var lastFlush time.Time

	flush := func() {
		r.saveCursor()
		lastFlush = time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			// The reader stops on the closed file. Records it queued are
			// not processed: nothing is reported after cancellation, and
			// the cursor does not cover them, so the next start reads them.
			if err := <-readDone; err != nil {
				log.V(1).Info("Kernel log reader stopped with an error after cancellation", "err", err)
			}
			flush()
			return nil
		case err := <-readDone:
			if ctx.Err() != nil {
				flush()
				return nil
			}
			r.drain(records)
			flush()
			return fmt.Errorf("reading %s: %w", path, err)
		case rec := <-records:
			r.feed(rec)
			// A batch ends when the reader has nothing more queued. Save
			// the cursor then, but not more often than flushEvery.
			if len(records) > 0 || !r.needFlush || timerArmed {
				continue
			}
			if wait := flushEvery - time.Since(lastFlush); wait > 0 {
				flushTimer.Reset(wait)
				timerArmed = true
				continue
			}
			flush()
		case <-flushTimer.C:
			timerArmed = false
			flush()
		}
		// A GPU-lost text whose end never came is processed as it was.
		if at, ok := r.joiner.Holding(); ok && time.Since(at) > joinWait {
			for _, rec := range r.joiner.Flush() {
				r.process(rec)
			}
			if !timerArmed {
				flushTimer.Reset(flushEvery)
				timerArmed = true
			}
		}
	}
}

// run is the state of one Run.
type run struct {
	src    *Source
	log    logr.Logger
	report monitors.Reporter
	clock  clock.PassiveClock

	// boot is the wall-clock time of boot; set when bootOK.
	boot   time.Time
	bootOK bool

	// bootID is the current boot id; empty when it could not be read, and
	// then the cursor is neither used nor saved.
	bootID string
	// skipThrough is the last sequence number processed before this start;
	// records up to it are skipped. Set when skipping.
	skipThrough uint64
	skipping    bool

	// lastSeq is the sequence number of the last record processed; set when
	// haveSeq.
	lastSeq uint64
	haveSeq bool
	// savedSeq is the sequence number in the cursor file; set when haveSaved.
	savedSeq  uint64
	haveSaved bool
	// needFlush is true when a finding was reported since the cursor was
	// last saved. Records that are not ours do not ask for a write: to read
	// them again after a crash is harmless.
	needFlush bool
	// joiner holds the first records of a split GPU-lost text; held records
	// are not processed yet, so the cursor does not cover them.
	joiner Joiner
	// gen is the generation of the last cursor written.
	gen uint64
	// shapes are the malformed-record shapes logged so far.
	shapes map[string]struct{}
}

// shapeNoise is what a parse error's shape leaves out: the quoted text and
// the numbers, which differ from line to line.
var shapeNoise = regexp.MustCompile(`"[^"]*"|[0-9]+`)

// maxShapes bounds the malformed shapes remembered for logging.
const maxShapes = 64

// newShape says whether err is the first malformed record of its shape
// this run, and remembers it.
func (r *run) newShape(err error) bool {
	k := shapeNoise.ReplaceAllString(err.Error(), "")
	if _, seen := r.shapes[k]; seen || len(r.shapes) >= maxShapes {
		return false
	}
	if r.shapes == nil {
		r.shapes = map[string]struct{}{}
	}
	r.shapes[k] = struct{}{}
	return true
}

// joinWait is how long the first line of a split GPU-lost text waits for the
// rest; the driver prints the three lines in one call.
const joinWait = 2 * time.Second

// feed passes a record through the joiner and processes what comes out.
func (r *run) feed(rec string) {
	for _, out := range r.joiner.Feed(rec, time.Now()) {
		r.process(out)
	}
}

// start reads the boot id and the cursor and decides what to skip.
func (r *run) start(bootIDPath string) {
	id, err := readBootID(bootIDPath)
	if err != nil {
		r.log.Error(err, "Reading boot id failed; processing the whole kernel log and keeping no cursor")
		return
	}
	r.bootID = id
	if r.src.StateDir == "" {
		return
	}
	c, ok, err := loadCursor(r.src.StateDir)
	switch {
	case err != nil:
		r.log.Error(err, "Ignoring unreadable kmsg cursor; processing the whole kernel log")
	case !ok:
		r.log.V(1).Info("No kmsg cursor; processing the whole kernel log")
	case c.BootID != id:
		r.log.V(1).Info("Node rebooted since the kmsg cursor was saved; processing the whole kernel log", "cursorBootID", c.BootID)
	default:
		r.skipping, r.skipThrough = true, c.Seq
		r.savedSeq, r.haveSaved = c.Seq, true
		r.log.V(1).Info("Resuming the kernel log after the kmsg cursor", "seq", c.Seq)
	}
	if ok {
		r.gen = c.Gen
	}
}

// process handles one record.
func (r *run) process(rec string) {
	// The prefix alone decides about the cursor, so that a record with a
	// readable prefix and a bad message still moves it.
	line, _, _ := strings.Cut(rec, "\n")
	h, _, herr := parseHeader(line)
	if herr == nil {
		if r.skipping && h.seq <= r.skipThrough {
			lines.WithLabelValues(resultIgnored).Inc()
			return
		}
		r.lastSeq, r.haveSeq = h.seq, true
	}
	e, err := Parse(rec)
	switch {
	case err != nil:
		lines.WithLabelValues(resultMalformed).Inc()
		if r.newShape(err) {
			r.log.V(1).Info("Skipping malformed kernel log record; more of this shape are only counted", "err", err)
		}
	case e.Userspace:
		lines.WithLabelValues(resultUserspace).Inc()
	case e.Kind == KindNone:
		lines.WithLabelValues(resultIgnored).Inc()
	default:
		f, ok := r.finding(e)
		if !ok {
			lines.WithLabelValues(resultManagement).Inc()
			r.log.V(1).Info("Not reporting a kernel log line about a management NIC", "pciBusID", e.PCIBusID, "netdev", e.Netdev, "code", e.NICCode)
			return
		}
		lines.WithLabelValues(resultFinding).Inc()
		r.log.V(4).Info("Reporting kernel log finding", "finding", f.String())
		r.report(f)
		r.needFlush = true
	}
}

// drain processes what the reader queued before it stopped.
func (r *run) drain(records <-chan string) {
	for {
		select {
		case rec := <-records:
			r.feed(rec)
		default:
			for _, rec := range r.joiner.Flush() {
				r.process(rec)
			}
			return
		}
	}
}

// saveCursor writes the cursor when it moved and can be trusted: first the
// counts it will cover (Sync), then the cursor, then Seal.
func (r *run) saveCursor() {
	r.needFlush = false
	if r.src.StateDir == "" || r.bootID == "" {
		// No cursor: a restart reads everything again anyway, so what was
		// reported may be published once it is spooled (Sync, then Seal,
		// as with a cursor: Seal releases only what Sync covered).
		if r.src.Sync != nil {
			if err := r.src.Sync(^uint64(0)); err != nil {
				r.needFlush = true
				r.log.Error(err, "Making kernel log findings durable failed")
				return
			}
		}
		if r.src.Seal != nil {
			r.src.Seal(^uint64(0))
		}
		return
	}
	if !r.haveSeq || (r.haveSaved && r.savedSeq == r.lastSeq) {
		return
	}
	gen := r.gen + 1
	if r.src.Sync != nil {
		if err := r.src.Sync(gen); err != nil {
			// The next save tries again; until then a restart replays.
			r.needFlush = true
			r.log.Error(err, "Making kernel log findings durable failed; keeping the kmsg cursor where it was")
			return
		}
	}
	if err := saveCursor(r.src.StateDir, cursor{BootID: r.bootID, Seq: r.lastSeq, Gen: gen}); err != nil {
		// The next save tries again; until then a restart replays a little.
		r.needFlush = true
		r.log.Error(err, "Saving kmsg cursor failed")
		return
	}
	r.savedSeq, r.haveSaved, r.gen = r.lastSeq, true, gen
	if r.src.Seal != nil {
		r.src.Seal(gen)
	}
}

// finding turns a parsed record into a finding; ok is false for a NIC line
// about a management NIC, which is not reported.
func (r *run) finding(e Entry) (f monitors.Finding, ok bool) {
	f = monitors.Finding{
		Source:  gpuhealthv1alpha1.SourceKmsg,
		Code:    strconv.Itoa(e.Code),
		Message: e.Text,
		Time:    r.timeOf(e),
	}
	switch e.Kind {
	case KindXID, KindGPULost:
		// The GPU-lost text is XID 79 without the number: it coalesces
		// with the XID 79 line the driver usually prints beside it.
		f.Check = gpuhealthv1alpha1.CheckXID
		f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: r.gpuID(e.PCIBusID)}
		if e.GPUInstance >= 0 {
			f.Component.Instance = fmt.Sprintf("GPU-I:%02d", e.GPUInstance)
			if e.ComputeInstance >= 0 {
				f.Component.Instance += fmt.Sprintf(" GPU-CI:%02d", e.ComputeInstance)
			}
			f.Message = "MIG " + f.Component.Instance + ": " + f.Message
		}
	case KindSXID:
		f.Check = gpuhealthv1alpha1.CheckSXID
		f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: e.PCIBusID}
		var why string
		f.Severity, f.Action, why = judgeSXid(e)
		flag := e.Flag
		if flag == "" {
			flag = "no severity flag"
		}
		f.Message = fmt.Sprintf("%s (%s; %s)", e.Text, flag, why)
	case KindNIC:
		return r.nicFinding(f, e)
	}
	return f, true
}

// nicFinding fills a NIC line's finding; see Source.NICResolver for who
// the component is and how hard the line is judged.
func (r *run) nicFinding(f monitors.Finding, e Entry) (monitors.Finding, bool) {
	v := nicVerdicts[e.NICCode]
	f.Check, f.Code = gpuhealthv1alpha1.CheckNIC, e.NICCode
	f.Severity, f.Action = v.severity, v.action
	id := e.PCIBusID
	if id == "" {
		id = e.Netdev
	}
	vouched := false
	if r.src.NICResolver != nil {
		device, compute, ok := r.src.NICResolver(e.PCIBusID, e.Netdev)
		switch {
		case ok && !compute:
			return monitors.Finding{}, false
		case ok:
			vouched = true
			if nicComponentID.MatchString(device) {
				id = device
			}
		}
	}
	f.Component = gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: id}
	f.Message = fmt.Sprintf("%s (%s)", e.Text, v.why)
	if !vouched && f.Severity == gpuhealthv1alpha1.SeverityFatal {
		// Capped: nothing says this is the compute fabric, and a management
		// NIC must never take the node out of service.
		f.Severity, f.Action = gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionNone
		f.Message = fmt.Sprintf("%s (%s; judged Degraded: not known to be a compute-fabric NIC)", e.Text, v.why)
	}
	return f, true
}

// nicComponentID is the NodeHealthEvent schema's component id; a device
// name the resolver returns that is not one is replaced by the address.
var nicComponentID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// gpuID names a GPU by its UUID when Resolver knows its bus id.
func (r *run) gpuID(bus string) string {
	if r.src.Resolver != nil {
		if uuid, ok := r.src.Resolver(bus); ok && uuid != "" {
			return uuid
		}
	}
	return bus
}

// timeOf returns the wall-clock time of a record (see Source, Time).
func (r *run) timeOf(e Entry) time.Time {
	now := r.clock.Now()
	if !r.bootOK {
		return now
	}
	t := r.boot.Add(e.Timestamp)
	if t.After(now) {
		return now
	}
	return t
}

// bootTime returns now minus the uptime in path.
func bootTime(path string, now time.Time) (time.Time, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return time.Time{}, false
	}
	secs, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || secs < 0 || secs > maxTimestamp.Seconds() {
		return time.Time{}, false
	}
	return now.Add(-time.Duration(secs * float64(time.Second))), true
}

// openLog opens path for reading. device is true for a character device
// (/dev/kmsg). A FIFO is opened non-blocking, because a blocking open waits
// for a writer and could not be cancelled.
func openLog(path string) (f *os.File, device bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, false, err
	}
	switch mode := fi.Mode(); {
	case mode&os.ModeCharDevice != 0:
		f, err = os.Open(path)
		return f, true, err
	case mode&os.ModeNamedPipe != 0:
		f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		return f, false, err
	default:
		f, err = os.Open(path)
		return f, false, err
	}
}

// readRecords reads /dev/kmsg, one record per read, and queues each record.
// The kernel documents the device in Documentation/ABI/testing/dev-kmsg.
func readRecords(ctx context.Context, f *os.File, out chan<- string) error {
	buf := make([]byte, recordBufferSize)
	for {
		n, err := f.Read(buf)
		switch {
		case err == nil:
			if !send(ctx, out, string(buf[:n])) {
				return nil
			}
		case errors.Is(err, syscall.EPIPE):
			// The kernel overwrote records we had not read yet; the next
			// read returns the oldest record still there.
			overruns.Inc()
		case ctx.Err() != nil || errors.Is(err, os.ErrClosed):
			return nil //nolint:nilerr // the context is done or the file closed: the source stops, which is no failure
		default:
			return err
		}
	}
}

// readLines reads a regular file or a FIFO line by line, then follows it:
// at its end it waits poll and reads again, and it starts over when a
// regular file shrank (it was truncated).
func readLines(ctx context.Context, f *os.File, poll time.Duration, out chan<- string) error {
	buf := make([]byte, 32<<10)
	var pending []byte
	var offset int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			offset += int64(n)
			pending = append(pending, buf[:n]...)
			for {
				i := indexNewline(pending)
				if i < 0 && len(pending) < maxLineSize {
					break
				}
				if i < 0 {
					i = maxLineSize
				}
				line := string(pending[:i])
				pending = pending[min(i+1, len(pending)):]
				if !send(ctx, out, line) {
					return nil
				}
			}
			pending = append(pending[:0:0], pending...)
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(poll):
			}
			if fi, serr := f.Stat(); serr == nil && fi.Mode().IsRegular() && fi.Size() < offset {
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
				offset, pending = 0, nil
			}
		case ctx.Err() != nil || errors.Is(err, os.ErrClosed):
			return nil //nolint:nilerr // the context is done or the file closed: the source stops, which is no failure
		default:
			return err
		}
	}
}

// indexNewline returns the index of the first '\n' in b, or -1.
func indexNewline(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}

// send queues a record unless ctx is done first.
func send(ctx context.Context, out chan<- string, rec string) bool {
	select {
	case out <- rec:
		return true
	case <-ctx.Done():
		return false
	}
}

// valueOr returns s, or def when s is empty.
func valueOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
