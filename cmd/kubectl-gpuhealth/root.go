package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// defaultOperatorNamespace is where the chart installs the operator and
// where it runs its Jobs; -n on the command line names another.
const defaultOperatorNamespace = "gpuhealth-system"

// fieldManager is the field manager of every write the plugin makes, so the
// operator's audit (status.lastRequest.by, the history's by) names it.
const fieldManager = "kubectl-gpuhealth"

// globals are what every command shares: the kubeconfig flags kubectl has
// (--kubeconfig, --context, -n, --as, …), the streams, and the clock that
// ages are counted from.
type globals struct {
	config  *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	now     func() time.Time
	// restConfig, when set, replaces the kubeconfig (tests).
	restConfig *rest.Config
	// poll is how often --wait reads the object again.
	poll time.Duration
}

// exitError carries a command's exit code (2 for a timeout of --wait).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func execute(args []string, streams genericiooptions.IOStreams) int {
	g := &globals{
		config:  genericclioptions.NewConfigFlags(true).WithDiscoveryBurst(300).WithWarningPrinter(streams),
		streams: streams,
		now:     time.Now,
		poll:    time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, g, args)
}

// run executes one command line and returns the process's exit code.
func run(ctx context.Context, g *globals, args []string) int {
	cmd := newRootCommand(g)
	cmd.SetArgs(args)
	cmd.SetIn(g.streams.In)
	cmd.SetOut(g.streams.Out)
	cmd.SetErr(g.streams.ErrOut)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(g.streams.ErrOut, "error:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}

func newRootCommand(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-gpuhealth",
		Short: "Look at and steer gpuhealth's GPU nodes",
		Long: `kubectl gpuhealth shows where gpuhealth's GPU nodes stand and makes the
manual requests a human has over them. Every command that changes something
says what it changes and what the operator will do.`,
		Annotations: map[string]string{
			// kubectl plugin naming: help shows "kubectl gpuhealth".
			cobra.CommandDisplayNameAnnotation: "kubectl gpuhealth",
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	g.config.AddFlags(root.PersistentFlags())
	root.AddCommand(newStatusCommand(g), newStoryCommand(g), newFindingsCommand(g))
	for _, rc := range requestCommands {
		root.AddCommand(newRequestCommand(g, rc))
	}
	root.AddCommand(
		newFlagCommand(g, flagHold, true),
		newFlagCommand(g, flagHold, false),
		newFlagCommand(g, flagExclude, true),
		newFlagCommand(g, flagExclude, false),
		newResetBreakerCommand(g),
	)
	return root
}

// client returns a client for gpuhealth's and Kubernetes' own types, from
// the kubeconfig flags (so impersonation and contexts work as in kubectl).
func (g *globals) client() (client.Client, error) {
	cfg := g.restConfig
	if cfg == nil {
		var err error
		if cfg, err = g.config.ToRESTConfig(); err != nil {
			return nil, err
		}
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := gpuhealthv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster: %w", err)
	}
	return client.WithFieldOwner(c, fieldManager), nil
}

// operatorNamespace is the namespace of the operator's Jobs: -n when given
// on the command line, else the chart's namespace.
func (g *globals) operatorNamespace() string {
	if g.config.Namespace != nil && *g.config.Namespace != "" {
		return *g.config.Namespace
	}
	return defaultOperatorNamespace
}
