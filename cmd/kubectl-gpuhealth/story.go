package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// Story is one node's story: what `story` prints, and its -o json|yaml form.
type Story struct {
	Node       string                              `json:"node"`
	Policy     string                              `json:"policy,omitempty"`
	NodeHealth *gpuhealthv1alpha1.NodeHealth       `json:"nodeHealth"`
	NodeFound  bool                                `json:"nodeFound"`
	Cordoned   bool                                `json:"cordoned"`
	Taints     []corev1.Taint                      `json:"taints,omitempty"`
	GPUHealthy *corev1.NodeCondition               `json:"gpuHealthy,omitempty"`
	Findings   []gpuhealthv1alpha1.NodeHealthEvent `json:"findings"`
	Jobs       []JobSummary                        `json:"jobs"`
	Timeline   []Entry                             `json:"timeline"`
	Events     []EventSummary                      `json:"events"`
}

// JobSummary is one of the node's recertification or remediation Jobs.
type JobSummary struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Attempt string `json:"attempt,omitempty"`
	Step    string `json:"step,omitempty"`
	Result  string `json:"result"`
	// Created is when the Job started (its creation, before it has).
	Created  time.Time  `json:"created"`
	Finished *time.Time `json:"finished,omitempty"`
	Message  string     `json:"message,omitempty"`
}

// Entry is one line of the timeline.
type Entry struct {
	Time time.Time `json:"time"`
	// What is the kind of entry: finding, resolved, transition, request,
	// drain, job, domain or certificate.
	What string `json:"what"`
	Text string `json:"text"`
}

// EventSummary is one Kubernetes Event about the node.
type EventSummary struct {
	Time   time.Time `json:"time"`
	Type   string    `json:"type"`
	Reason string    `json:"reason"`
	Count  int32     `json:"count"`
	From   string    `json:"from,omitempty"`
	Note   string    `json:"note"`
}

func newStoryCommand(g *globals) *cobra.Command {
	var out *outputFlag
	var events int
	cmd := &cobra.Command{
		Use:     "story NODE",
		Aliases: []string{"describe"},
		Short:   "One node's story in time order: findings, transitions, drain, Jobs, ComputeDomain, condition",
		Example: `  kubectl gpuhealth story gpu-node-7
  kubectl gpuhealth story gpu-node-7 -o yaml`,
		Args:              exactlyOneNode,
		ValidArgsFunction: completeNodeHealths(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.reader(out)
			if err != nil {
				return err
			}
			s, err := nodeStory(cmd.Context(), c, args[0], g.operatorNamespace(), events)
			if err != nil {
				return err
			}
			if done, err := out.structured(g.streams.Out, s); done {
				return err
			}
			return printStory(g.streams.Out, g.now(), s)
		},
	}
	out = addOutputFlag(cmd, "json", "yaml")
	cmd.Flags().IntVar(&events, "events", 15, "How many of the node's latest Kubernetes Events to show.")
	return cmd
}

func exactlyOneNode(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("name one node (kubectl get nodehealths lists them), got %d arguments", len(args))
	}
	return nil
}

// notManaged is the error for a node without a NodeHealth.
func notManaged(node string) error {
	return fmt.Errorf("nodehealth %q not found: gpuhealth does not manage node %s; check that a RemediationPolicy selects it (kubectl get remediationpolicies) and that the operator runs", node, node)
}

// nodeStory reads everything gpuhealth knows about one node.
func nodeStory(ctx context.Context, c client.Client, node, namespace string, maxEvents int) (*Story, error) {
	s := &Story{Node: node, Findings: []gpuhealthv1alpha1.NodeHealthEvent{}, Jobs: []JobSummary{}, Timeline: []Entry{}, Events: []EventSummary{}}
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := c.Get(ctx, client.ObjectKey{Name: node}, nh); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notManaged(node)
		}
		return nil, fmt.Errorf("reading nodehealth %q: %w", node, err)
	}
	nh.ManagedFields = nil
	s.NodeHealth = nh

	n := &corev1.Node{}
	switch err := c.Get(ctx, client.ObjectKey{Name: node}, n); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("reading node %q: %w", node, err)
	default:
		s.NodeFound = true
		s.Cordoned = n.Spec.Unschedulable
		s.Taints = n.Spec.Taints
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == gpuhealthv1alpha1.GPUHealthyNodeCondition {
				s.GPUHealthy = &n.Status.Conditions[i]
			}
		}
		var policies gpuhealthv1alpha1.RemediationPolicyList
		if err := c.List(ctx, &policies); err != nil {
			return nil, listError("remediationpolicies", err)
		}
		if p := gpuhealthv1alpha1.ManagingPolicy(policies.Items, n.Labels); p != nil {
			s.Policy = p.Name
		}
	}

	var findings gpuhealthv1alpha1.NodeHealthEventList
	if err := c.List(ctx, &findings, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: node}); err != nil {
		return nil, listError("nodehealthevents", err)
	}
	s.Findings = findings.Items
	for i := range s.Findings {
		s.Findings[i].ManagedFields = nil
	}
	sort.SliceStable(s.Findings, func(i, j int) bool {
		return lastSeen(&s.Findings[i]).After(lastSeen(&s.Findings[j]))
	})

	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{job.NodeLabel: node}); err != nil {
		return nil, fmt.Errorf("listing the node's Jobs in namespace %s: %w", namespace, err)
	}
	for i := range jobs.Items {
		s.Jobs = append(s.Jobs, summarizeJob(&jobs.Items[i]))
	}
	sort.SliceStable(s.Jobs, func(i, j int) bool { return s.Jobs[i].Created.Before(s.Jobs[j].Created) })

	var evs corev1.EventList
	sel := fields.SelectorFromSet(fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node})
	if err := c.List(ctx, &evs, client.MatchingFieldsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing the node's Events: %w", err)
	}
	for i := range evs.Items {
		s.Events = append(s.Events, summarizeEvent(&evs.Items[i]))
	}
	sort.SliceStable(s.Events, func(i, j int) bool { return s.Events[i].Time.Before(s.Events[j].Time) })
	if maxEvents >= 0 && len(s.Events) > maxEvents {
		s.Events = s.Events[len(s.Events)-maxEvents:]
	}

	s.Timeline = timeline(s)
	return s, nil
}

func lastSeen(ev *gpuhealthv1alpha1.NodeHealthEvent) time.Time {
	if ev.Status.LastSeen != nil {
		return ev.Status.LastSeen.Time
	}
	return ev.CreationTimestamp.Time
}

func summarizeJob(j *batchv1.Job) JobSummary {
	js := JobSummary{
		Name: j.Name, Kind: j.Labels[job.KindLabel], Attempt: j.Labels[job.AttemptLabel], Step: j.Labels[job.StepLabel],
		Result: "Running", Created: j.CreationTimestamp.Time,
	}
	if j.Status.StartTime != nil {
		js.Created = j.Status.StartTime.Time
	} else if j.Status.Active == 0 {
		js.Result = "Pending"
	}
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			js.Result = "Succeeded"
		case batchv1.JobFailed:
			js.Result, js.Message = "Failed", c.Message
		default:
			continue
		}
		t := c.LastTransitionTime.Time
		js.Finished = &t
	}
	if js.Finished == nil && j.Status.CompletionTime != nil {
		t := j.Status.CompletionTime.Time
		js.Finished = &t
	}
	return js
}

func summarizeEvent(e *corev1.Event) EventSummary {
	es := EventSummary{Type: e.Type, Reason: e.Reason, Count: e.Count, Note: e.Message, From: e.ReportingController}
	if es.From == "" {
		es.From = e.Source.Component
	}
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		es.Time, es.Count = e.Series.LastObservedTime.Time, e.Series.Count
	case !e.LastTimestamp.IsZero():
		es.Time = e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		es.Time = e.EventTime.Time
	default:
		es.Time = e.CreationTimestamp.Time
	}
	if es.Count == 0 {
		es.Count = 1
	}
	return es
}

// timeline puts what the NodeHealth, its findings and Jobs say happened in
// time order; entries at the same time keep the order they are added in.
func timeline(s *Story) []Entry {
	var out []Entry
	add := func(t time.Time, what, format string, args ...any) {
		if !t.IsZero() {
			out = append(out, Entry{Time: t.UTC(), What: what, Text: fmt.Sprintf(format, args...)})
		}
	}
	for i := range s.Findings {
		ev := &s.Findings[i]
		first := ev.CreationTimestamp.Time
		if ev.Status.FirstSeen != nil {
			first = ev.Status.FirstSeen.Time
		}
		add(first, "finding", "%s: %s", findingTitle(ev), judged(ev))
		if ev.Status.ResolvedAt != nil {
			add(ev.Status.ResolvedAt.Time, "resolved", "%s resolved (count %d)", findingTitle(ev), ev.Status.Count)
		}
		if ev.Status.SupersededAt != nil {
			add(ev.Status.SupersededAt.Time, "resolved", "%s superseded (count %d)", findingTitle(ev), ev.Status.Count)
		}
	}
	st := &s.NodeHealth.Status
	for _, tr := range st.History {
		from := string(tr.From)
		if from == "" {
			from = "(new)"
		}
		text := fmt.Sprintf("%s → %s  %s", from, tr.To, tr.Reason)
		if tr.From == tr.To && tr.From != "" {
			// A note: no phase changed (a GPU out alone, a hand-off).
			text = tr.Reason
		}
		if tr.Message != "" {
			text += ": " + tr.Message
		}
		if tr.By != "" {
			text += " (by " + tr.By + ")"
		}
		add(tr.Time.Time, "transition", "%s", text)
	}
	if r := st.LastRequest; r != nil {
		text := fmt.Sprintf("%s %s carried out", r.Action, r.ID)
		if r.By != "" {
			text += ", asked by " + r.By
		}
		if r.Result != "" {
			text += ": " + r.Result
		}
		add(r.Time.Time, "request", "%s", text)
	}
	if d := st.Drain; d != nil {
		add(timeOf(d.StartedAt), "drain", "drain started: %d pods to evict", d.PodsTotal)
		for _, g := range d.Gangs {
			add(timeOf(g.EvictedAt), "drain", "gang %s %s/%s stopped whole: %d members on %d nodes (%s) evicted in one wave",
				g.Kind, g.Namespace, g.Name, g.Size, g.SpannedNodes, gpuhealthv1alpha1.JoinMore(g.Nodes[:min(len(g.Nodes), 4)], int(g.SpannedNodes)-min(len(g.Nodes), 4), ", "))
		}
		add(timeOf(d.CompletedAt), "drain", "drain complete: no pod that must leave is left")
	}
	for _, j := range s.Jobs {
		add(j.Created, "job", "%s started (%s)", j.Name, jobTitle(j))
		if j.Finished != nil {
			text := fmt.Sprintf("%s %s", j.Name, j.Result)
			if j.Message != "" {
				text += ": " + j.Message
			}
			add(*j.Finished, "job", "%s", text)
		}
	}
	if cd := st.ComputeDomain; cd != nil {
		add(timeOf(cd.LeftAt), "domain", "left ComputeDomain %s", domainName(cd))
	}
	if c := st.Certificate; c != nil {
		add(c.Time.Time, "certificate", "passed suite %s (attempt %d)", c.Suite, c.Attempt)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

func findingTitle(ev *gpuhealthv1alpha1.NodeHealthEvent) string {
	t := string(ev.Spec.Check)
	if ev.Spec.Code != "" {
		t += " " + ev.Spec.Code
	}
	if ev.Spec.Component.ID != "" {
		t += " on " + ev.Spec.Component.ID
	}
	return t + " " + string(ev.Spec.Severity)
}

// judged says how the operator judged a finding, in words.
func judged(ev *gpuhealthv1alpha1.NodeHealthEvent) string {
	c := ev.Status.Classification
	if c == nil {
		return "not judged yet"
	}
	text := string(c.Verdict)
	if c.Policy != "" {
		text += " by policy " + c.Policy
	}
	text += " rule " + c.Rule
	if c.Reason != "" {
		text += " (" + c.Reason + ")"
	}
	return text
}

func jobTitle(j JobSummary) string {
	parts := []string{j.Kind}
	if j.Step != "" {
		parts = append(parts, "step "+j.Step)
	}
	if j.Attempt != "" {
		parts = append(parts, "attempt "+j.Attempt)
	}
	return strings.Join(parts, ", ")
}

func domainName(cd *gpuhealthv1alpha1.ComputeDomainMembership) string {
	if cd.Name != "" {
		return cd.Namespace + "/" + cd.Name
	}
	return cd.UID
}

func printStory(w io.Writer, now time.Time, s *Story) error {
	nh := s.NodeHealth
	st := &nh.Status
	kv := newTable(w)
	kv.row("Node:", s.Node)
	kv.row("Policy:", orNone(s.Policy))
	phase := orNone(string(st.Phase))
	if st.Reason != "" {
		phase += " (" + st.Reason + ")"
	}
	if st.Since != nil {
		phase += ", " + age(now, st.Since.Time) + " ago"
	}
	kv.row("Phase:", phase)
	if st.Message != "" {
		kv.row("Message:", st.Message)
	}
	kv.row("Spec:", specSummary(&nh.Spec))
	kv.row("Scheduling:", scheduling(s))
	if c := s.GPUHealthy; c != nil {
		kv.row("GPUHealthy:", fmt.Sprintf("%s (%s) %s", c.Status, c.Reason, c.Message))
	}
	if st.BlockingBudget != "" {
		kv.row("Waits for:", string(st.BlockingBudget))
	}
	if o := st.Outage; o != nil {
		text := fmt.Sprintf("%s since %s ago", o.Cause, age(now, o.Since.Time))
		if o.Check != "" {
			text += fmt.Sprintf(": %s %s, %s", o.Check, o.Code, o.Action)
		}
		kv.row("Out of service:", text)
	}
	if cd := st.ComputeDomain; cd != nil {
		text := fmt.Sprintf("%s (uid %s), clique %s, %s", domainName(cd), cd.UID, orNone(cd.CliqueID), orNone(string(cd.Membership)))
		if len(cd.Traces) > 0 {
			tr := make([]string, len(cd.Traces))
			for i, t := range cd.Traces {
				tr[i] = string(t)
			}
			text += ", still tied by " + strings.Join(tr, ", ")
		}
		kv.row("ComputeDomain:", text)
	}
	if d := st.Drain; d != nil {
		kv.row("Drain:", fmt.Sprintf("%d of %d pods remain, %d blocked by a PodDisruptionBudget", d.PodsRemaining, d.PodsTotal, d.PodsBlocked))
	}
	if r := st.Recertification; r != nil {
		text := fmt.Sprintf("attempt %d, %s", r.Attempt, orNone(string(r.Result)))
		if r.Message != "" {
			text += ": " + r.Message
		}
		kv.row("Recertification:", text)
	}
	if dg := st.Diagnostics; dg != nil {
		text := fmt.Sprintf("job %s before %s (attempt %d), %s", dg.Job, orNone(string(dg.Before)), dg.Attempt, orNone(string(dg.Result)))
		if dg.KeptUntil != nil {
			text += fmt.Sprintf(", its log kept until %s (kubectl logs job/%s in the operator's namespace)", dg.KeptUntil.UTC().Format(time.RFC3339), dg.Job)
		}
		kv.row("Diagnostics:", text)
	}
	if c := st.Certificate; c != nil {
		kv.row("Certified:", fmt.Sprintf("suite %s, %s ago", c.Suite, age(now, c.Time.Time)))
	}
	if h := st.HandOff; h != nil {
		kv.row("Handed off:", fmt.Sprintf("%s %s to %s (%s) %s", h.Type, h.State, orNone(h.Target), h.Reason, h.Message))
	}
	if err := kv.flush(); err != nil {
		return err
	}

	if d := st.Drain; d != nil && len(d.Gangs) > 0 {
		fmt.Fprintln(w, "\nGangs stopped whole:")
		t := newTable(w, "  KIND", "NAMESPACE", "NAME", "OWNER", "MEMBERS", "NODES", "WAVE")
		for _, g := range d.Gangs {
			wave := "held: " + g.Held
			if g.EvictedAt != nil {
				wave = "sent " + age(now, g.EvictedAt.Time) + " ago"
			}
			t.row("  "+g.Kind, g.Namespace, g.Name, orNone(g.Owner), fmt.Sprint(g.Size), fmt.Sprint(g.SpannedNodes), wave)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if d := st.Drain; d != nil && len(d.Blocked) > 0 {
		fmt.Fprintln(w, "\nBlocked pods:")
		t := newTable(w, "  NAMESPACE", "POD", "PDB", "MESSAGE")
		for _, b := range d.Blocked {
			t.row("  "+b.Namespace, b.Name, orNone(b.PodDisruptionBudget), b.Message)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nFindings:")
	if len(s.Findings) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		t := newTable(w, "  CHECK", "CODE", "COMPONENT", "SEVERITY", "COUNT", "PHASE", "VERDICT", "LAST SEEN", "MESSAGE")
		for i := range s.Findings {
			ev := &s.Findings[i]
			verdict := "<not judged>"
			if c := ev.Status.Classification; c != nil {
				verdict = string(c.Verdict) + " (" + c.Rule + ")"
			}
			t.row("  "+string(ev.Spec.Check), orNone(ev.Spec.Code), orNone(ev.Spec.Component.ID), string(ev.Spec.Severity),
				strconv.FormatInt(ev.Status.Count, 10), orNone(string(ev.Status.Phase)), verdict, age(now, lastSeen(ev)),
				truncate(ev.Spec.Message, 60))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nJobs:")
	if len(s.Jobs) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		t := newTable(w, "  NAME", "KIND", "STEP", "ATTEMPT", "RESULT", "AGE")
		for _, j := range s.Jobs {
			t.row("  "+j.Name, orNone(j.Kind), orNone(j.Step), orNone(j.Attempt), j.Result, age(now, j.Created))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nConditions:")
	if len(st.Conditions) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		t := newTable(w, "  TYPE", "STATUS", "REASON", "MESSAGE")
		for _, c := range st.Conditions {
			t.row("  "+c.Type, string(c.Status), c.Reason, c.Message)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nTimeline:")
	if len(s.Timeline) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		t := newTable(w, "  TIME", "AGO", "WHAT", "DETAIL")
		for _, e := range s.Timeline {
			t.row("  "+e.Time.Format(time.RFC3339), age(now, e.Time), e.What, e.Text)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nEvents:")
	if len(s.Events) == 0 {
		fmt.Fprintln(w, "  <none>")
		return nil
	}
	t := newTable(w, "  TYPE", "REASON", "AGE", "FROM", "MESSAGE")
	for _, e := range s.Events {
		a := age(now, e.Time)
		if e.Count > 1 {
			a += " (x" + strconv.Itoa(int(e.Count)) + ")"
		}
		t.row("  "+e.Type, e.Reason, a, orNone(e.From), e.Note)
	}
	return t.flush()
}

func specSummary(spec *gpuhealthv1alpha1.NodeHealthSpec) string {
	var parts []string
	if spec.Exclude {
		parts = append(parts, "excluded from gpuhealth's management")
	}
	if spec.Hold {
		parts = append(parts, "held")
	}
	if r := spec.Request; r != nil {
		parts = append(parts, fmt.Sprintf("request %s %s", r.Action, r.ID))
	}
	if len(parts) == 0 {
		return "<none>"
	}
	return strings.Join(parts, ", ")
}

func scheduling(s *Story) string {
	if !s.NodeFound {
		return "the Node object is gone"
	}
	parts := []string{"schedulable"}
	if s.Cordoned {
		parts[0] = "cordoned"
	}
	keys := make([]string, 0, len(s.Taints))
	for _, t := range s.Taints {
		keys = append(keys, t.Key+":"+string(t.Effect))
	}
	slices.Sort(keys)
	if len(keys) > 0 {
		parts = append(parts, "taints "+strings.Join(keys, ", "))
	}
	return strings.Join(parts, ", ")
}
