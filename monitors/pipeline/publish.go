package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

var (
	// errGone: a resolution for an object that does not exist.
	errGone = errors.New("no such NodeHealthEvent to resolve")
	// errInvalid: the apiserver rejected the object; retrying cannot help.
	errInvalid = errors.New("rejected by the apiserver as invalid")
)

// write makes the apiserver's copy of one event match rec and returns the
// event's count after the write (or, on failure, the count it learnt; -1 if
// none). The object is created from the spec when missing (a create ignores
// status: the CRD has a status subresource), then its status is merge-patched
// with the monitor's own fields only — count, firstSeen, lastSeen, resolved,
// resolvedAt — so the operator's fields (phase, classification) are never
// overwritten and no resourceVersion conflict can occur. The count written
// is absolute (known count + pending), which makes a replay idempotent.
func (p *Pipeline) write(ctx context.Context, rec *spool.Record, name string) (int64, error) {
	base := rec.Base
	for attempt := 0; ; attempt++ {
		if base < 0 {
			b, err := p.ensureExists(ctx, rec, name)
			if err != nil {
				return -1, err
			}
			base = b
			p.rememberBase(name, base)
		}
		status := map[string]any{
			"count":      base + rec.Pending,
			"resolved":   rec.Resolved,
			"resolvedAt": nil,
		}
		if rec.ResolvedAt != nil {
			status["resolvedAt"] = metav1.NewTime(*rec.ResolvedAt)
		}
		if rec.Pending > 0 {
			status["lastSeen"] = metav1.NewTime(rec.LastSeen)
			if base == 0 {
				status["firstSeen"] = metav1.NewTime(rec.FirstSeen)
			}
		}
		data, err := json.Marshal(map[string]any{"status": status})
		if err != nil {
			return base, fmt.Errorf("encoding status patch: %w", err)
		}
		obj := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}}
		err = p.opts.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, data))
		switch {
		case err == nil:
			writesTotal.WithLabelValues("patch_status").Inc()
			return base + rec.Pending, nil
		case apierrors.IsNotFound(err) && attempt == 0:
			// Deleted since we learnt its count (garbage-collected
			// after it resolved): create it anew.
			base = -1
			continue
		default:
			return base, countError("patching status of NodeHealthEvent "+name, err)
		}
	}
}

// ensureExists returns the event's current count, creating the event when it
// does not exist and rec carries occurrences.
func (p *Pipeline) ensureExists(ctx context.Context, rec *spool.Record, name string) (int64, error) {
	obj := &gpuhealthv1alpha1.NodeHealthEvent{}
	err := p.opts.Client.Get(ctx, client.ObjectKey{Name: name}, obj)
	switch {
	case err == nil:
		return obj.Status.Count, nil
	case !apierrors.IsNotFound(err):
		return -1, countError("reading NodeHealthEvent "+name, err)
	case rec.Pending == 0:
		return -1, errGone
	}
	obj = &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: rec.Spec}
	err = p.opts.Client.Create(ctx, obj)
	switch {
	case err == nil:
		writesTotal.WithLabelValues("create").Inc()
		return 0, nil
	case apierrors.IsAlreadyExists(err):
		// Created meanwhile (a stale read): read its count.
		if err := p.opts.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return -1, countError("reading NodeHealthEvent "+name, err)
		}
		return obj.Status.Count, nil
	default:
		return -1, countError("creating NodeHealthEvent "+name, err)
	}
}

// rememberBase records a learnt count in the entry and the spool before the
// status write that builds on it, so that a crash after that write replays
// the same absolute count instead of adding the pending occurrences twice.
func (p *Pipeline) rememberBase(name string, base int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[name]; ok && e.rec.Base < 0 {
		e.rec.Base = base
		e.gen++
		_ = p.persistLocked(name, e) // logged; the status write goes ahead
	}
}

// countError wraps err with what was being done, counts it by reason, and
// marks errors that retrying cannot fix as errInvalid.
func countError(doing string, err error) error {
	reason := "Other"
	switch {
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		reason = "Invalid"
		err = errors.Join(errInvalid, err)
	case apierrors.IsForbidden(err):
		reason = "Forbidden"
	case apierrors.IsConflict(err):
		reason = "Conflict"
	case apierrors.IsTooManyRequests(err):
		reason = "TooManyRequests"
	case apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || errors.Is(err, context.DeadlineExceeded) || !isStatusError(err):
		reason = "Unavailable"
	}
	publishErrors.WithLabelValues(reason).Inc()
	return fmt.Errorf("%s: %w", doing, err)
}

func isStatusError(err error) bool {
	var s apierrors.APIStatus
	return errors.As(err, &s)
}
