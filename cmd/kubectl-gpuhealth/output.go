package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// outputFlag is -o as kubectl has it, for the formats a command offers.
type outputFlag struct {
	value   string
	allowed []string
}

func addOutputFlag(cmd *cobra.Command, allowed ...string) *outputFlag {
	o := &outputFlag{allowed: allowed}
	cmd.Flags().StringVarP(&o.value, "output", "o", "", "Output format: "+strings.Join(allowed, ", ")+"; a table when unset.")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(allowed, cobra.ShellCompDirectiveNoFileComp))
	return o
}

func (o *outputFlag) validate() error {
	if o.value == "" {
		return nil
	}
	for _, a := range o.allowed {
		if o.value == a {
			return nil
		}
	}
	return fmt.Errorf("unknown output format %q: use one of %s, or none for a table", o.value, strings.Join(o.allowed, ", "))
}

// reader checks the output flag and returns a client: how every
// read-only command starts.
func (g *globals) reader(out *outputFlag) (client.Client, error) {
	if err := out.validate(); err != nil {
		return nil, err
	}
	return g.client()
}

func (o *outputFlag) wide() bool { return o.value == "wide" }

// structured prints v as JSON or YAML when -o asks for it, and says whether it did.
func (o *outputFlag) structured(w io.Writer, v any) (bool, error) {
	switch o.value {
	case "json":
		b, err := json.MarshalIndent(v, "", "    ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintln(w, string(b))
		return true, err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}

// table writes rows the way kubectl does: upper-case headers, columns
// separated by spaces, no borders.
type table struct {
	w    io.Writer
	rows [][]string
}

// newTable starts a table with a header row; with no headers it is a
// list of key-value rows.
func newTable(w io.Writer, headers ...string) *table {
	t := &table{w: w}
	if len(headers) > 0 {
		t.rows = [][]string{headers}
	}
	return t
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) flush() error {
	tw := printers.GetNewTabWriter(t.w)
	for _, r := range t.rows {
		for i := range r {
			r[i] = oneLine(r[i])
		}
		if _, err := fmt.Fprintln(tw, strings.Join(r, "\t")); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// oneLine keeps a table cell on its line: tabs and newlines become spaces.
func oneLine(s string) string {
	return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s)
}

// age is how long ago t was, as kubectl prints ages; <unknown> for no time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

// orNone is s, or <none> when it is empty, as kubectl prints empty cells.
func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// truncate cuts s to n runes with an ellipsis, for table cells. It counts
// runes, roughly the columns a terminal gives them, where
// gpuhealthv1alpha1.Truncate counts the bytes a stored field may hold.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
