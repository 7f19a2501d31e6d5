package nodehealth

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

// maxGangWaves is the MaxItems of DrainStatus.gangs.
const maxGangWaves = 8

// gangWaveRecord is one gang wave the status records as sent or held, for
// the metrics once the write succeeded.
type gangWaveRecord struct {
	kind   gang.Kind
	result string
	// size is the gang's members; strandedGPUSeconds the GPU-time its
	// members on healthy nodes held between the node's fence and the wave.
	size               int
	strandedGPUSeconds float64
}

const (
	waveSent = "sent"
	waveHeld = "held"
)

// gangWaves records the drain pass's gang waves in status.drain.gangs:
// each gang once, with the time its wave was first sent and why it is
// held while it is, and announces each wave sent (on the node and on the
// gang's owner) and each hold as it begins.
func (d *decider) gangWaves(waves []drain.Wave) {
	o, ds := d.o, d.p.status.Drain
	fenced := ds.StartedAt.Time
	if out := d.p.status.Outage; out != nil && out.Since.Before(ds.StartedAt) {
		fenced = out.Since.Time
	}
	for _, w := range waves {
		i := slices.IndexFunc(ds.Gangs, func(g gpuhealthv1alpha1.GangWave) bool {
			return g.Kind == string(w.Key.Kind) && g.Namespace == w.Key.Namespace && g.Name == w.Key.Name && g.Part == w.Key.Part
		})
		if i < 0 && len(ds.Gangs) < maxGangWaves {
			ds.Gangs = append(ds.Gangs, gpuhealthv1alpha1.GangWave{Kind: string(w.Key.Kind), Namespace: w.Key.Namespace, Name: w.Key.Name, Part: w.Key.Part})
			i = len(ds.Gangs) - 1
		}
		// A gang past the status's eight is not recorded; its wave is
		// still announced and counted each pass that evicts some of it
		// (its holds are not announced: nothing would say one was).
		g := &gpuhealthv1alpha1.GangWave{}
		if i >= 0 {
			g = &ds.Gangs[i]
		}
		if w.Owner.Kind != "" {
			g.Owner = w.Owner.Kind + " " + w.Owner.Name
		}
		if int32(w.Members) > g.Size {
			g.Size, g.Nodes, g.SpannedNodes = int32(w.Members), w.Nodes, int32(w.SpannedNodes)
		}
		wasHeld := g.Held != ""
		g.Held = w.Held
		if w.Held != "" && !wasHeld && g.EvictedAt == nil && i >= 0 {
			d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonGangHeld, "Drain", "%s", gpuhealthv1alpha1.Truncate(fmt.Sprintf(
				"the wave stopping %s (%d members on %d nodes) waits: %s", w.Key, w.Members, w.SpannedNodes, w.Held), 1024))
			d.p.gangWaves = append(d.p.gangWaves, gangWaveRecord{kind: w.Key.Kind, result: waveHeld, size: w.Members})
		}
		// Sent in this pass, or in one whose status write was lost (its
		// members are leaving, and nothing holds it).
		sent := w.Sent() || (i >= 0 && w.Held == "" && w.Leaving > 0)
		if !sent || g.EvictedAt != nil {
			continue
		}
		g.EvictedAt = &o.now
		stranded := float64(w.PeerGPUs) * max(o.now.Sub(fenced), 0).Seconds()
		d.p.gangWaves = append(d.p.gangWaves, gangWaveRecord{kind: w.Key.Kind, result: waveSent, size: w.Members, strandedGPUSeconds: stranded})
		note := fmt.Sprintf("stopped %s whole: %d members on %d nodes (%s) evicted in one wave, %s after node %s was fenced, because a member ran on it",
			w.Key, w.Members, w.SpannedNodes, nodeList(w), max(o.now.Sub(fenced), 0).Round(time.Second), o.node.Name)
		d.nodeEvent(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonGangStopped, "Drain", "%s", gpuhealthv1alpha1.Truncate(note, 1024))
		if w.Owner.Kind != "" {
			owner := &metav1.PartialObjectMetadata{
				TypeMeta:   metav1.TypeMeta{APIVersion: w.Owner.APIVersion, Kind: w.Owner.Kind},
				ObjectMeta: metav1.ObjectMeta{Namespace: w.Key.Namespace, Name: w.Owner.Name, UID: w.Owner.UID},
			}
			d.p.announce = append(d.p.announce, announcement{regarding: owner, related: o.node, eventType: corev1.EventTypeWarning,
				reason: gpuhealthv1alpha1.ReasonGangStopped, action: "Evict",
				note: gpuhealthv1alpha1.Truncate(fmt.Sprintf("gpuhealth stopped every member of %s (%d pods on %d nodes) in one wave: node %s, where a member ran, is being drained for %s",
					w.Key, w.Members, w.SpannedNodes, o.node.Name, describe(d.counting())), 1024)})
		}
	}
}

// nodeList names a wave's nodes, and how many more it spanned.
func nodeList(w drain.Wave) string {
	return gpuhealthv1alpha1.JoinMore(w.Nodes[:min(len(w.Nodes), 4)], w.SpannedNodes-min(len(w.Nodes), 4), ", ")
}

// gangSummary is the drain message's part about gangs: "2 gangs stopped
// whole (JobSet train/llama (0): 4 members on 4 nodes)".
func gangSummary(gangs []gpuhealthv1alpha1.GangWave) string {
	if len(gangs) == 0 {
		return ""
	}
	parts := make([]string, 0, len(gangs))
	for _, g := range gangs {
		k := gang.Key{Kind: gang.Kind(g.Kind), Namespace: g.Namespace, Name: g.Name, Part: g.Part}
		state := "stopped"
		if g.EvictedAt == nil {
			state = "held"
		}
		parts = append(parts, fmt.Sprintf("%s %s: %d members on %d nodes", k, state, g.Size, g.SpannedNodes))
	}
	return strings.Join(parts, "; ")
}
