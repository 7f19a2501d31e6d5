package framework

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Case is one step of an end-to-end tier: a subtest that runs against the
// installation every case of the tier shares, at its place in the tier's
// list. Cases do not call t.Parallel: they share one cluster.
type Case struct {
	// Name is the subtest's name, so `go test -run 'TestE2E/^Name$'` runs
	// the case alone. Letters, digits, '-' and '_' only: a -run pattern
	// then matches it as written.
	Name string
	// Run is the case's body.
	Run func(t *testing.T)
	// After names the earlier cases whose results this one reads: objects
	// they left, counts the operator kept of what they did. The case runs
	// only when each of them ran and passed before it in the same go test
	// run; otherwise it is skipped, and the message says which did not and
	// which -run pattern runs the case with what it needs. Empty: the case
	// needs nothing but the installation.
	After []string
	// AfterAll says the case reads what every case before it left (the
	// metrics of the whole run), as if After named each of them.
	AfterAll bool
	// Disruptive says the case takes away what the cases share: it
	// uninstalls the product, or replaces the operator the others watched
	// (its counters start again). Only disruptive cases may follow one.
	Disruptive bool
}

// Cases is a tier's cases in the order they run.
type Cases []Case

// caseName is what a Case's Name may be.
var caseName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Check says why the list cannot run as it is ordered, or returns nil:
// each case has a body and a name of its own that -run can match; every
// name in After is a case listed before it; and no case follows a
// disruptive one unless it is disruptive too.
func (cs Cases) Check() error {
	var errs []error
	listed := map[string]bool{}
	disruptive := ""
	for i, c := range cs {
		switch {
		case !caseName.MatchString(c.Name):
			errs = append(errs, fmt.Errorf("case %d: name %q is not one -run matches as written (letters, digits, - and _)", i, c.Name))
		case listed[c.Name]:
			errs = append(errs, fmt.Errorf("case %s is listed twice", c.Name))
		}
		if c.Run == nil {
			errs = append(errs, fmt.Errorf("case %s has no body", c.Name))
		}
		for _, a := range c.After {
			if listed[a] {
				continue
			}
			if slices.ContainsFunc(cs[i:], func(l Case) bool { return l.Name == a }) {
				errs = append(errs, fmt.Errorf("case %s reads what %s left, but %s is not listed before it", c.Name, a, a))
			} else {
				errs = append(errs, fmt.Errorf("case %s reads what %s left, but no case is named %s", c.Name, a, a))
			}
		}
		switch {
		case c.Disruptive && disruptive == "":
			disruptive = c.Name
		case !c.Disruptive && disruptive != "":
			errs = append(errs, fmt.Errorf("case %s follows %s, which is disruptive: list %s before it, or mark %s disruptive", c.Name, disruptive, c.Name, c.Name))
		}
		listed[c.Name] = true
	}
	return errors.Join(errs...)
}

// outcome is what became of a case in this run.
type outcome string

const (
	passed  outcome = "passed"
	failed  outcome = "failed"
	skipped outcome = "skipped"
	// notRun is the outcome of a case that -run, -skip or -failfast left
	// out.
	notRun outcome = "not run"
)

// Run runs the cases as subtests of t (the tier's one Test function), in
// order, after Check; a list that fails Check fails t and runs nothing,
// even when -run selects a single case. A case whose After (with
// AfterAll: any case before it) did not run and pass before it is skipped
// with a message that names each and, when some did not run, a -run
// pattern that runs the case with everything it needs.
func (cs Cases) Run(t *testing.T) {
	t.Helper()
	if err := cs.Check(); err != nil {
		t.Fatalf("the list of cases is out of order:\n%v", err)
	}
	var tier []string
	for _, level := range strings.Split(t.Name(), "/") {
		tier = append(tier, "^"+regexp.QuoteMeta(level)+"$")
	}
	outcomes := map[string]outcome{}
	for i, c := range cs {
		t.Run(c.Name, func(t *testing.T) {
			defer func() { outcomes[c.Name] = outcomeOf(t) }()
			if why := cs.unmet(i, outcomes, strings.Join(tier, "/")); why != "" {
				t.Skip(why)
			}
			c.Run(t)
		})
	}
}

func outcomeOf(t *testing.T) outcome {
	t.Helper()
	switch {
	case t.Failed():
		return failed
	case t.Skipped():
		return skipped
	}
	return passed
}

// reads lists the cases case i reads from directly, in the list's order.
func (cs Cases) reads(i int) []string {
	var out []string
	for _, c := range cs[:i] {
		if cs[i].AfterAll || slices.Contains(cs[i].After, c.Name) {
			out = append(out, c.Name)
		}
	}
	return out
}

// needs lists the cases case i reads from, directly or through the cases
// it reads from, in the list's order.
func (cs Cases) needs(i int) []string {
	want := map[string]bool{}
	var walk func(i int)
	walk = func(i int) {
		for j, c := range cs[:i] {
			if !want[c.Name] && (cs[i].AfterAll || slices.Contains(cs[i].After, c.Name)) {
				want[c.Name] = true
				walk(j)
			}
		}
	}
	walk(i)
	var out []string
	for _, c := range cs[:i] {
		if want[c.Name] {
			out = append(out, c.Name)
		}
	}
	return out
}

// unmet says why case i is skipped, or returns "" when every case it reads
// from passed. tier is the -run pattern that selects the tier's Test.
func (cs Cases) unmet(i int, outcomes map[string]outcome, tier string) string {
	reads := cs.reads(i)
	by := map[outcome][]string{}
	for _, name := range reads {
		o, ok := outcomes[name]
		if !ok {
			o = notRun
		}
		if o != passed {
			by[o] = append(by[o], name)
		}
	}
	if len(by) == 0 {
		return ""
	}
	msg := "it reads what " + strings.Join(reads, ", ") + " left"
	if cs[i].AfterAll {
		msg = fmt.Sprintf("it reads what the %d cases before it left", len(reads))
	}
	var parts []string
	for _, o := range []outcome{notRun, failed, skipped} {
		names := by[o]
		if len(names) == 0 {
			continue
		}
		if len(names) == len(reads) && len(names) > 1 {
			names = []string{"all of them"}
		}
		parts = append(parts, string(o)+": "+strings.Join(names, ", "))
	}
	msg += " (" + strings.Join(parts, "; ") + ")"
	if len(by[notRun]) > 0 {
		if needs := cs.needs(i); len(needs) == i {
			msg += fmt.Sprintf("; run the whole tier: go test -run '%s'", tier)
		} else {
			msg += fmt.Sprintf("; run it with what it needs: go test -run '%s/^(%s)$'", tier, strings.Join(append(needs, cs[i].Name), "|"))
		}
	}
	return msg
}
