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

	"k8s.io/klog/v2"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

var (
	// errGone: a resolution for an object that does not exist.
	errGone = errors.New("no such NodeHealthEvent to resolve")
	// errInvalid: the apiserver rejected the object; retrying cannot help.
	errInvalid = errors.New("rejected by the apiserver as invalid")
	// errNameTaken: the object under a finding's name is another finding's.
	errNameTaken = errors.New("NodeHealthEvent name taken by another finding")
)

// maxAlternates is how many alternate names a finding tries when the
// object under its own name is another finding's. The admission policy
// keeps every other node's agent off this node's names, so only an object
// someone else created (an administrator, an agent before the policy was
// installed) takes one, and one alternate is normally enough; the bound
// caps the reads each attempt costs when every alternate is taken too.
const maxAlternates = 3

// write makes the apiserver's copy of one event match rec and returns the
// event's count after the write (or, on failure, the count it learnt; -1 if
// none) and the name of the object it wrote (or learnt). The object is
// created from the spec when missing (a create ignores status: the CRD has
// a status subresource), then its status is merge-patched with the
// monitor's own fields only — count, firstSeen, lastSeen, resolved,
// resolvedAt — so the operator's fields (phase, classification) are never
// overwritten and no resourceVersion conflict can occur. The count written
// is absolute (known count + pending), which makes a replay idempotent.
//
// name is the finding's own name; the object is rec.Object when set (the
// finding fell back to an alternate name), else name.
func (p *Pipeline) write(ctx context.Context, rec *spool.Record, name string) (int64, string, error) {
	base, object := rec.Base, rec.Object
	if object == "" {
		object = name
	}
	verified := false
	for attempt := 0; ; attempt++ {
		if base < 0 {
			b, o, err := p.ensureExists(ctx, rec, name)
			if err != nil {
				return -1, object, err
			}
			base, object, verified = b, o, true
			p.rememberBase(name, object, base)
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
			return base, object, fmt.Errorf("encoding status patch: %w", err)
		}
		obj := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: object}}
		err = p.opts.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, data))
		switch {
		case err == nil:
			writesTotal.WithLabelValues("patch_status").Inc()
			return base + rec.Pending, object, nil
		case apierrors.IsNotFound(err) && attempt == 0:
			// Deleted since we learnt its count (garbage-collected
			// after it resolved): create it anew.
			base = -1
			continue
		case apierrors.IsForbidden(err) && attempt == 0 && !verified:
			// Deleted since we learnt its count and created again by
			// someone else, about another node, which the admission
			// policy keeps this agent from writing: read it again, and
			// fall back to an alternate name if it is not ours.
			base = -1
			continue
		default:
			return base, object, countError("patching status of NodeHealthEvent "+object, err)
		}
	}
}

// ensureExists returns the event's current count and the name of its
// object, creating the object when it does not exist and rec carries
// occurrences. The object is under name unless an object of another
// finding is there; then it is under the first of name's alternates
// (NodeHealthEventSpec.AlternateEventName) that is free or holds this
// finding, and the taken name is logged as an error, since it means
// someone wrote an object this agent would write.
func (p *Pipeline) ensureExists(ctx context.Context, rec *spool.Record, name string) (int64, string, error) {
	for i := 0; i <= maxAlternates; i++ {
		object := name
		if i > 0 {
			object = rec.Spec.AlternateEventName(name, i)
		}
		base, foreign, err := p.claim(ctx, rec, object)
		if err != nil {
			return -1, object, err
		}
		if foreign == nil {
			return base, object, nil
		}
		publishErrors.WithLabelValues(reasonNameTaken).Inc()
		s := &foreign.Spec
		p.opts.Log.Error(errNameTaken, "Writing finding under an alternate name", "NodeHealthEvent", klog.KRef("", object),
			"takenBy", klog.KRef("", s.NodeName).String()+"/"+string(s.Source)+"/"+string(s.Check)+"/"+s.Component.ID+"/"+s.Code,
			"alternate", i+1)
	}
	return -1, name, fmt.Errorf("%w: %s and its %d alternate names", errNameTaken, name, maxAlternates)
}

// claim returns the count of rec's finding under object, creating the
// object when it does not exist and rec carries occurrences; when another
// finding's object is there it returns that object instead.
func (p *Pipeline) claim(ctx context.Context, rec *spool.Record, object string) (int64, *gpuhealthv1alpha1.NodeHealthEvent, error) {
	obj := &gpuhealthv1alpha1.NodeHealthEvent{}
	err := p.opts.Client.Get(ctx, client.ObjectKey{Name: object}, obj)
	switch {
	case err == nil:
		return ours(obj, rec)
	case !apierrors.IsNotFound(err):
		return -1, nil, countError("reading NodeHealthEvent "+object, err)
	case rec.Pending == 0:
		return -1, nil, errGone
	}
	obj = &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: object}, Spec: rec.Spec}
	err = p.opts.Client.Create(ctx, obj)
	switch {
	case err == nil:
		writesTotal.WithLabelValues("create").Inc()
		return 0, nil, nil
	case apierrors.IsAlreadyExists(err):
		// Created meanwhile (a stale read): read its count.
		if err := p.opts.Client.Get(ctx, client.ObjectKey{Name: object}, obj); err != nil {
			return -1, nil, countError("reading NodeHealthEvent "+object, err)
		}
		return ours(obj, rec)
	default:
		return -1, nil, countError("creating NodeHealthEvent "+object, err)
	}
}

// ours returns obj's count when it records rec's finding, else obj as
// another finding's.
func ours(obj *gpuhealthv1alpha1.NodeHealthEvent, rec *spool.Record) (int64, *gpuhealthv1alpha1.NodeHealthEvent, error) {
	if !sameFinding(&obj.Spec, &rec.Spec) {
		return -1, obj, nil
	}
	return obj.Status.Count, nil, nil
}

// sameFinding says whether two specs record the same finding: whether they
// agree on every field xid.EventName covers (node, source, check, component
// id, code, and for a finding named by its verdict, severity and action).
// The fields are compared, not the names, because a name's hash is short
// enough to be matched on purpose.
func sameFinding(a, b *gpuhealthv1alpha1.NodeHealthEventSpec) bool {
	if a.NodeName != b.NodeName || a.Source != b.Source || a.Check != b.Check || a.Component.ID != b.Component.ID || a.Code != b.Code {
		return false
	}
	if xid.EventName(b) != b.EventName() {
		return a.Severity == b.Severity && a.RecommendedAction == b.RecommendedAction
	}
	return true
}

// rememberBase records a learnt count, and the object it is of, in the
// entry and the spool before the status write that builds on it, so that a
// crash after that write replays the same absolute count to the same object
// instead of adding the pending occurrences twice.
func (p *Pipeline) rememberBase(name, object string, base int64) {
	if object == name {
		object = ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[name]; ok && (e.rec.Base < 0 || e.rec.Object != object) {
		e.rec.Base, e.rec.Object = base, object
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
