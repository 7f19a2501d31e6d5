package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// writeFlags are the flags every command that changes something has.
type writeFlags struct {
	wait    bool
	timeout time.Duration
	dryRun  bool
}

func addWriteFlags(cmd *cobra.Command) *writeFlags {
	w := &writeFlags{}
	cmd.Flags().BoolVar(&w.wait, "wait", false, "Wait until the operator has acted on the change.")
	cmd.Flags().DurationVar(&w.timeout, "timeout", 5*time.Minute, "How long --wait waits.")
	cmd.Flags().BoolVar(&w.dryRun, "dry-run", false, "Say what would change and change nothing.")
	return w
}

// requestFlags are a manual request's id and reason. requestedBy is the
// deprecated --requested-by: the request names the user the plugin is
// authenticated as, and the flag may only repeat that name.
type requestFlags struct {
	id, reason, requestedBy string
}

func addRequestFlags(cmd *cobra.Command, reasonRequired bool) *requestFlags {
	r := &requestFlags{}
	cmd.Flags().StringVar(&r.id, "id", "", "The request's id, e.g. a ticket number; each id is carried out once (default: kubectl-gpuhealth-<unix time>).")
	help := "Why, in words that go into the node's history and Events."
	if reasonRequired {
		help += " Required: the request is audited."
	}
	cmd.Flags().StringVar(&r.reason, "reason", "", help)
	cmd.Flags().StringVar(&r.requestedBy, "requested-by", "", "Who asks: only your own user name, which is the default.")
	// The request names the user the plugin is authenticated as, which the
	// install's admission policy checks; the flag stays so that scripts
	// that name their own user go on working, and a different name fails
	// here with a clear error rather than at the apiserver.
	_ = cmd.Flags().MarkDeprecated("requested-by", "the request names the user you are authenticated as (kubectl auth whoami); put a ticket or a person in --id or --reason")
	return r
}

// requestCommand is one of the commands that write a manual request.
type requestCommand struct {
	action  gpuhealthv1alpha1.RequestAction
	use     string
	short   string
	example string
	// audited requests need a --reason.
	audited bool
}

var requestCommands = []requestCommand{
	{gpuhealthv1alpha1.RequestRelease, "release NODE --reason REASON [--id TICKET]",
		"Return a node to service without recertification (audited)",
		`  kubectl gpuhealth release gpu-node-7 --reason "false alarm, DCGM diag clean by hand" --id INC-1234 --wait`, true},
	{gpuhealthv1alpha1.RequestRecertify, "recertify NODE [--id ID] [--reason REASON]",
		"Recertify a node now (drained first where it is not empty)",
		`  kubectl gpuhealth recertify gpu-node-7 --id after-riser-swap --wait`, false},
	{gpuhealthv1alpha1.RequestMaintenance, "maintenance NODE --reason REASON [--id TICKET]",
		"Take a Healthy node out for planned maintenance (audited)",
		`  kubectl gpuhealth maintenance gpu-node-7 --reason "BMC firmware" --id CHG-77`, true},
	{gpuhealthv1alpha1.RequestApprove, "approve NODE --reason REASON [--id TICKET]",
		"Approve the destructive act a node waits for: a GPU reset, a reboot or its replacement (audited)",
		`  kubectl gpuhealth approve gpu-node-7 --reason "reboot agreed with the tenant" --id CHG-78`, true},
}

func newRequestCommand(g *globals, rc requestCommand) *cobra.Command {
	var r *requestFlags
	var w *writeFlags
	cmd := &cobra.Command{
		Use:               rc.use,
		Short:             rc.short,
		Example:           rc.example,
		Args:              exactlyOneNode,
		ValidArgsFunction: completeNodeHealths(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.request(cmd.Context(), args[0], rc.action, r, w)
		},
	}
	r = addRequestFlags(cmd, rc.audited)
	w = addWriteFlags(cmd)
	return cmd
}

// effect says what the operator will do for a request on a node in a phase.
func effect(action gpuhealthv1alpha1.RequestAction, phase gpuhealthv1alpha1.NodeHealthPhase) string {
	switch action {
	case gpuhealthv1alpha1.RequestRelease:
		return "the operator returns the node to Healthy without recertification: it closes the node's findings and lifts its cordon and taint (never a cordon or taint that was there before gpuhealth's); audited in the history and an Event"
	case gpuhealthv1alpha1.RequestApprove:
		return "the operator lets the act the node waits for (status.approval) go ahead, for that occasion only, and records who approved it; with nothing waiting it records the request and does nothing; audited"
	case gpuhealthv1alpha1.RequestMaintenance:
		if phase != gpuhealthv1alpha1.PhaseHealthy {
			return fmt.Sprintf("the node is %s, not Healthy: the operator records the request and refuses it (status.lastRequest.result says why)", phase)
		}
		return "the operator cordons and drains the node under the policy's budgets, then holds it in phase Maintenance until a recertify (the usual way back) or a release; audited"
	default:
		switch phase {
		case gpuhealthv1alpha1.PhaseHealthy:
			return "the operator quarantines the node, drains it under the policy's budgets and recertifies it; it returns to service if the suite passes"
		case gpuhealthv1alpha1.PhaseFailed:
			return "the operator starts the node's recertification again with fresh attempts (drained first where pods remain)"
		case gpuhealthv1alpha1.PhaseRecertifying:
			return "the node is already recertifying: the operator starts a fresh attempt"
		default:
			return fmt.Sprintf("the node is %s: the operator drains it where pods remain and recertifies it; it returns to service if the suite passes", phase)
		}
	}
}

// audited says whether a request action needs a reason.
func audited(action gpuhealthv1alpha1.RequestAction) bool {
	for _, rc := range requestCommands {
		if rc.action == action {
			return rc.audited
		}
	}
	return false
}

// request writes a manual request into a NodeHealth's spec, after saying
// what it changes, and waits for the operator's acknowledgement.
func (g *globals) request(ctx context.Context, node string, action gpuhealthv1alpha1.RequestAction, r *requestFlags, w *writeFlags) error {
	if audited(action) && r.reason == "" {
		return fmt.Errorf("a %s is audited: give a --reason", action)
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	nh, err := getNodeHealth(ctx, c, node)
	if err != nil {
		return err
	}
	if nh.Spec.Exclude {
		return fmt.Errorf("node %s is excluded from gpuhealth's management (spec.exclude): run kubectl gpuhealth include %s first", node, node)
	}
	if action == gpuhealthv1alpha1.RequestRelease && nh.Spec.Hold {
		return fmt.Errorf("node %s is held (spec.hold), which a release contradicts: run kubectl gpuhealth unhold %s first", node, node)
	}
	id := r.id
	if id == "" {
		id = "kubectl-gpuhealth-" + strconv.FormatInt(g.now().Unix(), 10)
	}
	if last := nh.Status.LastRequest; last != nil && last.ID == id {
		return fmt.Errorf("request id %s was already carried out on node %s (%s): use a new --id to repeat it", id, node, last.Action)
	}
	user, err := whoami(ctx, c)
	if err != nil {
		return err
	}
	if r.requestedBy != "" && r.requestedBy != user {
		return fmt.Errorf("--requested-by %s: a request names the user you are authenticated as, %s, and the apiserver refuses any other name; put a ticket or a person in --id or --reason", r.requestedBy, user)
	}
	req := gpuhealthv1alpha1.ManualRequest{Action: action, ID: id, Reason: r.reason, RequestedBy: user}
	fmt.Fprintf(g.streams.Out, "nodehealth/%s: set spec.request to %s id=%s", node, action, id)
	if r.reason != "" {
		fmt.Fprintf(g.streams.Out, " reason=%q", r.reason)
	}
	fmt.Fprintf(g.streams.Out, " requestedBy=%s", user)
	fmt.Fprintf(g.streams.Out, ".\nThe node is %s; %s.\n", orNone(string(nh.Status.Phase)), effect(action, nh.Status.Phase))
	if w.dryRun {
		fmt.Fprintln(g.streams.Out, "(dry run: nothing changed)")
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"request": req}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, nh, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("writing the request to nodehealth %s: %w", node, err)
	}
	fmt.Fprintf(g.streams.Out, "nodehealth/%s: request %s written.\n", node, id)
	if !w.wait {
		fmt.Fprintf(g.streams.Out, "Follow it with: kubectl gpuhealth story %s\n", node)
		return nil
	}
	return g.waitFor(ctx, w.timeout, fmt.Sprintf("the operator to carry out request %s on node %s", id, node), func() (bool, error) {
		cur, err := getNodeHealth(ctx, c, node)
		if err != nil {
			return false, err
		}
		last := cur.Status.LastRequest
		if last == nil || last.ID != id {
			return false, nil
		}
		msg := fmt.Sprintf("nodehealth/%s: request %s carried out; phase %s", node, id, orNone(string(cur.Status.Phase)))
		if last.Result != "" {
			msg += ": " + last.Result
		}
		fmt.Fprintln(g.streams.Out, msg)
		return true, nil
	})
}

// specFlag is one of the NodeHealth spec's switches.
type specFlag string

const (
	flagHold    specFlag = "hold"
	flagExclude specFlag = "exclude"
)

func newFlagCommand(g *globals, f specFlag, set bool) *cobra.Command {
	var w *writeFlags
	use, short := string(f), ""
	switch {
	case f == flagHold && set:
		short = "Hold a node where it is once quarantined: no drain, recertification or return until unhold"
	case f == flagHold:
		use, short = "unhold", "Let a held node go on with its remediation"
	case set:
		short = "Take a node out of gpuhealth's management: never cordoned, tainted, drained or labelled by it"
	default:
		use, short = "include", "Give an excluded node back to gpuhealth's management"
	}
	cmd := &cobra.Command{
		Use:               use + " NODE",
		Short:             short,
		Args:              exactlyOneNode,
		ValidArgsFunction: completeNodeHealths(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.setFlag(cmd.Context(), args[0], f, set, w)
		},
	}
	w = addWriteFlags(cmd)
	return cmd
}

// setFlag sets or clears spec.hold or spec.exclude, after saying so, and
// waits until the operator's status reflects the new generation.
func (g *globals) setFlag(ctx context.Context, node string, f specFlag, set bool, w *writeFlags) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	nh, err := getNodeHealth(ctx, c, node)
	if err != nil {
		return err
	}
	cur := nh.Spec.Hold
	if f == flagExclude {
		cur = nh.Spec.Exclude
	}
	if cur == set {
		fmt.Fprintf(g.streams.Out, "nodehealth/%s: spec.%s is already %t; nothing changed.\n", node, f, set)
		return nil
	}
	if set && f == flagExclude && nh.Spec.Hold {
		return fmt.Errorf("node %s is held (spec.hold): an excluded node is not managed at all, so run kubectl gpuhealth unhold %s first", node, node)
	}
	if set && f == flagHold && nh.Spec.Exclude {
		return fmt.Errorf("node %s is excluded (spec.exclude), so it cannot be held: run kubectl gpuhealth include %s first", node, node)
	}
	var what string
	switch {
	case f == flagHold && set:
		what = "the node stays where it is once quarantined; it is not drained, recertified or returned to service until unhold"
	case f == flagHold:
		what = "the operator goes on with the node's remediation from where it stands"
	case set:
		what = "the operator stops managing the node: it never cordons, taints, drains or labels it, and only records its findings"
	default:
		what = "the operator manages the node again and judges its active findings"
	}
	fmt.Fprintf(g.streams.Out, "nodehealth/%s: set spec.%s to %t.\nThe node is %s; %s.\n", node, f, set, orNone(string(nh.Status.Phase)), what)
	if w.dryRun {
		fmt.Fprintln(g.streams.Out, "(dry run: nothing changed)")
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{string(f): set}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, nh, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("writing spec.%s to nodehealth %s: %w", f, node, err)
	}
	fmt.Fprintf(g.streams.Out, "nodehealth/%s: spec.%s written.\n", node, f)
	if !w.wait {
		return nil
	}
	gen := nh.Generation
	return g.waitFor(ctx, w.timeout, fmt.Sprintf("the operator to observe spec.%s of node %s", f, node), func() (bool, error) {
		cur, err := getNodeHealth(ctx, c, node)
		if err != nil {
			return false, err
		}
		if cur.Status.ObservedGeneration < gen {
			return false, nil
		}
		fmt.Fprintf(g.streams.Out, "nodehealth/%s: observed by the operator; phase %s\n", node, orNone(string(cur.Status.Phase)))
		return true, nil
	})
}

func newResetBreakerCommand(g *globals) *cobra.Command {
	var reason string
	var w *writeFlags
	cmd := &cobra.Command{
		Use:     "reset-breaker POLICY --reason REASON",
		Short:   "Close a RemediationPolicy's open circuit breaker",
		Example: `  kubectl gpuhealth reset-breaker default --reason "storm was a bad driver push, rolled back"`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("name one RemediationPolicy (kubectl get remediationpolicies lists them), got %d arguments", len(args))
			}
			return nil
		},
		ValidArgsFunction: completePolicies(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.resetBreaker(cmd.Context(), args[0], reason, w)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "Why, recorded in the annotation and the policy's Event. Required.")
	w = addWriteFlags(cmd)
	return cmd
}

func (g *globals) resetBreaker(ctx context.Context, name, reason string, w *writeFlags) error {
	if reason == "" {
		return errors.New("resetting a circuit breaker lets quarantines through in a storm: give a --reason")
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	p := &gpuhealthv1alpha1.RemediationPolicy{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("remediationpolicy %q not found (kubectl get remediationpolicies lists them)", name)
		}
		return fmt.Errorf("reading remediationpolicy %q: %w", name, err)
	}
	token := g.now().UTC().Format(time.RFC3339) + " " + reason
	if len(token) > 253 {
		token = token[:253]
	}
	state := "Closed"
	if cb := p.Status.CircuitBreaker; cb != nil && cb.State != "" {
		state = string(cb.State)
	}
	fmt.Fprintf(g.streams.Out, "remediationpolicy/%s: set annotation %s=%q.\nThe breaker is %s; the operator closes it once for this value and lets quarantines through again.\n",
		name, gpuhealthv1alpha1.ResetCircuitBreakerAnnotation, token, state)
	if w.dryRun {
		fmt.Fprintln(g.streams.Out, "(dry run: nothing changed)")
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: token}}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotating remediationpolicy %s: %w", name, err)
	}
	fmt.Fprintf(g.streams.Out, "remediationpolicy/%s: annotated.\n", name)
	if !w.wait {
		return nil
	}
	return g.waitFor(ctx, w.timeout, "the operator to reset the breaker of policy "+name, func() (bool, error) {
		cur := &gpuhealthv1alpha1.RemediationPolicy{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, cur); err != nil {
			return false, err
		}
		cb := cur.Status.CircuitBreaker
		if cb == nil || cb.LastReset != token {
			return false, nil
		}
		fmt.Fprintf(g.streams.Out, "remediationpolicy/%s: breaker reset; now %s\n", name, orNone(string(cb.State)))
		return true, nil
	})
}

// whoami returns the user name the apiserver authenticates the plugin as
// (under --as, the impersonated user's), from a SelfSubjectReview: the name
// a request must carry as requestedBy. Every authenticated user may create
// one (the system:basic-user ClusterRole grants it).
func whoami(ctx context.Context, c client.Client) (string, error) {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the apiserver who you are (a SelfSubjectReview; the request names you): %w", err)
	}
	user := review.Status.UserInfo.Username
	if user == "" {
		return "", errors.New("the apiserver's SelfSubjectReview names no user, and a request must name who asks")
	}
	return user, nil
}

func getNodeHealth(ctx context.Context, c client.Client, node string) (*gpuhealthv1alpha1.NodeHealth, error) {
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := c.Get(ctx, client.ObjectKey{Name: node}, nh); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notManaged(node)
		}
		return nil, fmt.Errorf("reading nodehealth %q: %w", node, err)
	}
	return nh, nil
}

// waitFor polls done until it reports true; past timeout it fails with
// exit code 2.
func (g *globals) waitFor(ctx context.Context, timeout time.Duration, what string, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(g.poll)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil && ctx.Err() == nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return &exitError{code: 2, err: fmt.Errorf("timed out after %s waiting for %s (is the operator running? kubectl -n %s get pods)", timeout, what, g.operatorNamespace())}
		case <-tick.C:
		}
	}
}

// completeNodeHealths completes a node name from the NodeHealths.
func completeNodeHealths(g *globals) cobra.CompletionFunc {
	return completeNames(g, &gpuhealthv1alpha1.NodeHealthList{})
}

// completePolicies completes a RemediationPolicy name.
func completePolicies(g *globals) cobra.CompletionFunc {
	return completeNames(g, &gpuhealthv1alpha1.RemediationPolicyList{})
}

// completeNames completes the first argument with the names of the
// objects list holds (a cluster-scoped kind).
func completeNames(g *globals, list client.ObjectList) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := g.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		if err := c.List(cmd.Context(), list); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []string
		if err := meta.EachListItem(list, func(o runtime.Object) error {
			if m, ok := o.(client.Object); ok {
				names = append(names, m.GetName())
			}
			return nil
		}); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}
