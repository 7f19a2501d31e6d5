package kmsg

import (
	"regexp"
	"strings"
	"time"
)

// The driver says a GPU fell off the bus in two texts besides XID 79:
//
//	NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.
//
// when it loses a GPU it runs, and, when it finds one that does not answer,
//
//	NVRM: The NVIDIA GPU 0000:b3:00.0
//	NVRM: (PCI ID: 10de:26b5) installed in this system has
//	NVRM: fallen off the bus and is not responding to commands.
//
// which is one printk with embedded newlines: /dev/kmsg writes it as one
// record with the newlines escaped ("\x0a"); a replay or relay may carry it
// as three consecutive records instead. Joiner puts those back together
// before Parse. (Only /dev/kmsg records are read: a syslog or journal line
// has no facility, so the kernel's lines could not be told from others'.) Like the XID line, the text must start the message.
var (
	gpuLostRuntime = regexp.MustCompile(`^NVRM: GPU ([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?): GPU has fallen off the bus`)
	gpuLostProbe   = regexp.MustCompile(`^NVRM: The NVIDIA GPU ([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\s*(?:\(PCI ID: [0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}\))?\s*installed in this system has\s+fallen off the bus`)
	// gpuLostStart is the first line of the probe text on its own.
	gpuLostStart = regexp.MustCompile(`^NVRM: The NVIDIA GPU [0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}`)
)

// unescape turns the escaped newlines of a /dev/kmsg message back into
// newlines; other escapes stay as they are.
func unescape(msg string) string {
	return strings.ReplaceAll(msg, `\x0a`, "\n")
}

// flatten joins a multi-line driver message into one line, dropping the
// "NVRM: " that starts each continuation line.
func flatten(msg string) string {
	if !strings.Contains(msg, "\n") {
		return msg
	}
	lines := strings.Split(msg, "\n")
	for i := 1; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if j := strings.Index(l, "NVRM: "); j >= 0 {
			l = l[j+len("NVRM: "):]
		}
		lines[i] = l
	}
	return strings.Join(lines, " ")
}

// gpuLost recognises the GPU-lost texts and returns the GPU's canonical bus
// id and the message in one line.
func gpuLost(msg string) (string, string, bool) {
	flat := flatten(msg)
	m := gpuLostRuntime.FindStringSubmatchIndex(flat)
	if m == nil {
		m = gpuLostProbe.FindStringSubmatchIndex(flat)
	}
	if m == nil {
		return "", "", false
	}
	bus, err := NormalizePCIBusID(flat[m[2]:m[3]])
	if err != nil {
		return "", "", false
	}
	return bus, strings.TrimSpace(flat[m[0]:]), true
}

// Joiner reassembles the GPU-lost text that arrives split over consecutive
// records. Feed returns the records to parse, in order: most records come
// straight back; a record that starts the text is held until the records
// that finish it arrive (then one joined record comes back) or until a
// record that is not a continuation does (then the held records come back
// as they were). Only the kernel's own records are held or joined: a record
// a process wrote (see Parse) neither starts nor continues the text.
type Joiner struct {
	held   []string
	heldAt time.Time
}

// maxContinuation is how many records may follow the first line.
const maxContinuation = 3

// Feed takes the next record.
func (j *Joiner) Feed(record string, now time.Time) []string {
	line, _, _ := strings.Cut(record, "\n")
	h, msg, err := parseHeader(line)
	kernel := err == nil && h.facility == kernelFacility
	if len(j.held) > 0 {
		if kernel && strings.HasPrefix(msg, "NVRM: ") && !gpuLostStart.MatchString(msg) {
			j.held = append(j.held, record)
			if joined := j.joined(); joined != "" {
				j.held = nil
				return []string{joined}
			}
			if len(j.held) <= maxContinuation {
				return nil
			}
			return j.Flush() // too long to be the GPU-lost text
		}
		return append(j.Flush(), j.Feed(record, now)...)
	}
	if kernel && gpuLostStart.MatchString(msg) {
		if _, _, ok := gpuLost(unescape(msg)); !ok {
			j.held, j.heldAt = []string{record}, now
			return nil
		}
	}
	return []string{record}
}

// joined returns the held records as one record when together they are the
// GPU-lost text: the last record's prefix (so that the cursor covers them
// all) and the messages joined by escaped newlines.
func (j *Joiner) joined() string {
	msgs := make([]string, 0, len(j.held))
	var prefix string
	for _, r := range j.held {
		line, _, _ := strings.Cut(r, "\n")
		p, msg, _ := strings.Cut(line, ";")
		prefix = p
		msgs = append(msgs, msg)
	}
	msg := strings.Join(msgs, `\x0a`)
	if _, _, ok := gpuLost(unescape(msg)); !ok {
		return ""
	}
	return prefix + ";" + msg
}

// Holding says since when records are held, if any.
func (j *Joiner) Holding() (time.Time, bool) { return j.heldAt, len(j.held) > 0 }

// Flush returns the held records as they were and holds nothing.
func (j *Joiner) Flush() []string {
	out := j.held
	j.held = nil
	return out
}
