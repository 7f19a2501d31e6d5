package pipeline

import (
	"strconv"
	"sync"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// NVIDIA's workflows for some XIDs depend on the XIDs that came with them:
// XID 45 follows the XID it cleans up after, 48 with 63 or 64 is a drain
// and reset, 159 beside another XID is a sympathetic report. The driver
// prints the causing XID first, within milliseconds; recentWindow is how far
// back an XID still counts as "with" another on the same GPU.
const (
	recentWindow = 10 * time.Second
	// maxRecent bounds what is remembered per GPU during a storm.
	maxRecent = 64
)

type seenXID struct {
	code int
	at   time.Time
}

// recentXIDs remembers, per GPU, the XIDs reported in the last recentWindow.
type recentXIDs struct {
	mu    sync.Mutex
	byGPU map[string][]seenXID
}

// observe returns the XIDs reported on f's GPU within recentWindow before
// now, oldest first, and remembers f. Anything other than an active XID on
// a GPU returns nil and is not remembered.
func (r *recentXIDs) observe(f *monitors.Finding, now time.Time) []int {
	if f.Check != gpuhealthv1alpha1.CheckXID || f.Resolved || f.Component.ID == "" {
		return nil
	}
	code, err := strconv.Atoi(f.Code)
	if err != nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.byGPU[f.Component.ID]
	keep := list[:0]
	var out []int
	for _, s := range list {
		if now.Sub(s.at) <= recentWindow {
			keep = append(keep, s)
			out = append(out, s.code)
		}
	}
	if len(keep) >= maxRecent {
		keep = keep[len(keep)-maxRecent+1:]
	}
	keep = append(keep, seenXID{code: code, at: now})
	r.byGPU[f.Component.ID] = keep
	// Forget GPUs with nothing recent, so that the map stays small.
	if len(r.byGPU) > 4*maxRecent {
		for id, l := range r.byGPU {
			if len(l) == 0 || now.Sub(l[len(l)-1].at) > recentWindow {
				delete(r.byGPU, id)
			}
		}
	}
	return out
}
