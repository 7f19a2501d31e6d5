package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	prom "github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

// loggedError is one error-level log line.
type loggedError struct {
	err           error
	msg           string
	keysAndValues []any
}

// errorLog is a logr sink that keeps the error-level lines and drops the
// rest.
type errorLog struct {
	mu     sync.Mutex
	errors []loggedError
}

func (l *errorLog) Init(logr.RuntimeInfo)                  {}
func (l *errorLog) Enabled(int) bool                       { return true }
func (l *errorLog) Info(int, string, ...any)               {}
func (l *errorLog) WithValues(...any) logr.LogSink         { return l }
func (l *errorLog) WithName(string) logr.LogSink           { return l }
func (l *errorLog) Error(err error, msg string, kv ...any) { l.add(loggedError{err, msg, kv}) }
func (l *errorLog) add(e loggedError)                      { l.mu.Lock(); l.errors = append(l.errors, e); l.mu.Unlock() }
func (l *errorLog) lines() []loggedError {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loggedError(nil), l.errors...)
}
func withLog(l *errorLog) harnessOption   { return func(o *Options) { o.Log = logr.New(l) } }
func value(e loggedError, key string) any { return valueOf(e.keysAndValues, key) }
func valueOf(kv []any, key string) any {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == key {
			return kv[i+1]
		}
	}
	return nil
}

func TestAForeignObjectUnderTheNameIsLoggedAndTheFindingWrittenUnderAnAlternate(t *testing.T) {
	cases := []struct {
		name string
		// foreign changes the finding's spec into the one of the object
		// someone else created under its name.
		foreign func(*gpuhealthv1alpha1.NodeHealthEventSpec)
	}{
		{"an object about another node", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.NodeName = "node-squatter" }},
		{"an object about another GPU of the node", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Component.ID = "GPU-other" }},
		{"an object of another code", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Code = "48" }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			node := []string{"node-taken-a", "node-taken-b", "node-taken-c"}[i]
			log := &errorLog{}
			dir := t.TempDir()
			h := start(t, node, dir, nil, withLog(log))
			f := xidFinding("GPU-t", "79")
			name := h.name(f)
			spec := gpuhealthv1alpha1.NodeHealthEventSpec{
				NodeName: node, Source: f.Source, Check: f.Check, Component: f.Component, Code: f.Code,
				Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
			}
			alternate := spec.AlternateEventName(name, 1)

			foreign := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
			tc.foreign(&foreign.Spec)
			g.Expect(admin.Create(ctx, foreign)).To(Succeed())
			t.Cleanup(func() { _ = admin.Delete(context.Background(), foreign) })
			takenBefore := prom.ToFloat64(publishErrors.WithLabelValues(reasonNameTaken))

			h.p.Report(f)
			got := &gpuhealthv1alpha1.NodeHealthEvent{}
			g.Eventually(func(g Gomega) int64 {
				g.Expect(admin.Get(ctx, client.ObjectKey{Name: alternate}, got)).To(Succeed())
				return got.Status.Count
			}).Should(Equal(int64(1)), "the finding arrives under its alternate name")
			g.Expect(got.Spec.NodeName).To(Equal(node))
			g.Expect(got.Spec.Component.ID).To(Equal("GPU-t"))
			g.Expect(got.Spec.Code).To(Equal("79"))
			g.Eventually(h.p.Pending).Should(BeZero())
			g.Expect(spoolFiles(t, dir)).To(BeZero())

			after := &gpuhealthv1alpha1.NodeHealthEvent{}
			g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(foreign), after)).To(Succeed())
			g.Expect(after.Spec).To(Equal(foreign.Spec), "the other finding's object is left alone")
			g.Expect(after.Status.Count).To(BeZero(), "and its count too")

			lines := log.lines()
			g.Expect(lines).To(HaveLen(1), "one error: the name is taken")
			g.Expect(errors.Is(lines[0].err, errNameTaken)).To(BeTrue(), "got %v", lines[0].err)
			g.Expect(value(lines[0], "NodeHealthEvent")).To(HaveField("Name", name))
			g.Expect(value(lines[0], "takenBy")).To(ContainSubstring(foreign.Spec.NodeName + "/nvml/XID/" + foreign.Spec.Component.ID + "/" + foreign.Spec.Code))
			g.Expect(prom.ToFloat64(publishErrors.WithLabelValues(reasonNameTaken)) - takenBefore).To(Equal(1.0))

			// A repeat goes to the alternate at once: the entry knows it.
			h.p.Report(f)
			g.Eventually(func(g Gomega) int64 {
				g.Expect(admin.Get(ctx, client.ObjectKey{Name: alternate}, got)).To(Succeed())
				return got.Status.Count
			}).Should(Equal(int64(2)))
			g.Expect(log.lines()).To(HaveLen(1), "no new error for a repeat")
			h.stop()

			// After a crash with occurrences spooled, the record names the
			// alternate: the replay adds to its count without reading the
			// taken name again.
			sp, _, _, err := spool.Open(dir, 0)
			g.Expect(err).NotTo(HaveOccurred())
			now := time.Now()
			_, err = sp.Put(&spool.Record{Spec: got.Spec, Base: 2, Pending: 3, FirstSeen: now, LastSeen: now, Object: alternate})
			g.Expect(err).NotTo(HaveOccurred())
			replayLog := &errorLog{}
			start(t, node, dir, nil, withLog(replayLog))
			g.Eventually(func() int { return spoolFiles(t, dir) }).Should(BeZero())
			g.Expect(admin.Get(ctx, client.ObjectKey{Name: alternate}, got)).To(Succeed())
			g.Expect(got.Status.Count).To(Equal(int64(5)))
			g.Expect(replayLog.lines()).To(BeEmpty())
			g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(foreign), after)).To(Succeed())
			g.Expect(after.Status.Count).To(BeZero())
		})
	}
}

// withOwnNodePolicy makes the pipeline's client refuse, as the own-node
// admission policy does, a status write to an event about another node
// than node.
func withOwnNodePolicy(t *testing.T, node string) harnessOption {
	t.Helper()
	c, err := client.NewWithWatch(restConfig, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	funcs := interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			cur := &gpuhealthv1alpha1.NodeHealthEvent{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err == nil && cur.Spec.NodeName != node {
				return apierrors.NewForbidden(schema.GroupResource{Group: gpuhealthv1alpha1.GroupVersion.Group, Resource: "nodehealthevents"},
					obj.GetName(), fmt.Errorf("gpuhealth-monitor on node %s may only write NodeHealthEvents about its own node, not %s", node, cur.Spec.NodeName))
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}
	return func(o *Options) { o.Client = interceptor.NewClient(c, funcs) }
}

// TestAnObjectReplacedByAnotherNodesIsReadAgain: the finding's object is
// deleted (garbage-collected after it resolved) and created again by
// someone else, about another node, before the next repeat. The status
// write the agent makes from the count it knew is refused; it reads the
// name again, finds it taken and writes under an alternate name.
func TestAnObjectReplacedByAnotherNodesIsReadAgain(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const node = "node-replaced"
	log := &errorLog{}
	h := start(t, node, t.TempDir(), nil, withLog(log), withOwnNodePolicy(t, node))
	f := xidFinding("GPU-replaced", "79")
	h.p.Report(f)
	g.Eventually(h.event(f)).Should(count(1))
	g.Eventually(h.p.Pending).Should(BeZero())

	own := h.event(f)(g)
	g.Expect(admin.Delete(ctx, own)).To(Succeed())
	foreign := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: own.Name}, Spec: own.Spec}
	foreign.Spec.NodeName = "node-squatter"
	g.Eventually(func() error { return admin.Create(ctx, foreign) }).Should(Succeed())
	t.Cleanup(func() { _ = admin.Delete(context.Background(), foreign) })

	h.p.Report(f)
	alternate := own.Spec.AlternateEventName(own.Name, 1)
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	g.Eventually(func(g Gomega) int64 {
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: alternate}, got)).To(Succeed())
		return got.Status.Count
	}).Should(Equal(int64(1)), "the repeat arrives under the alternate name")
	g.Expect(got.Spec).To(Equal(own.Spec))
	g.Expect(log.lines()).To(HaveLen(1))
	g.Expect(errors.Is(log.lines()[0].err, errNameTaken)).To(BeTrue())
	g.Eventually(h.p.Pending).Should(BeZero())
}
