// Command testreport reads `go test -json` on its standard input and
// prints what a person running the suite needs: each package's result line
// as it finishes, the whole output of every failing test, and at the end
// the wall time of each package and the slowest tests, so that a run that
// got slower is seen in the next one (issue 34). It exits non-zero when a
// test or a package failed.
//
//	go test -json ./... | go run ./tools/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string
	seconds float64
}

type report struct {
	out      io.Writer
	buffered map[string]*strings.Builder // the output of each running test
	packages []timing
	tests    []timing
	failed   []string
}

func main() {
	r := &report{out: os.Stdout, buffered: map[string]*strings.Builder{}}
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r.summary(10)
	if len(r.failed) > 0 {
		os.Exit(1)
	}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event (a build error go test printed as text): show it.
			fmt.Fprintln(r.out, sc.Text())
			continue
		}
		r.add(e)
	}
	return sc.Err()
}

func (r *report) add(e event) {
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Test == "" && e.Action == "output":
		// The package's own lines: "ok pkg 1.2s", "FAIL pkg", a panic in
		// TestMain.
		fmt.Fprint(r.out, e.Output)
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		r.packages = append(r.packages, timing{e.Package, e.Elapsed})
		if e.Action == "fail" {
			r.failed = append(r.failed, e.Package)
		}
	case e.Action == "output":
		b := r.buffered[key]
		if b == nil {
			b = &strings.Builder{}
			r.buffered[key] = b
		}
		b.WriteString(e.Output)
	case e.Action == "pass" || e.Action == "skip":
		delete(r.buffered, key)
		r.addTest(e)
	case e.Action == "fail":
		if b := r.buffered[key]; b != nil {
			fmt.Fprint(r.out, b.String())
		}
		delete(r.buffered, key)
		r.failed = append(r.failed, e.Package+" "+e.Test)
		r.addTest(e)
	}
}

// addTest counts the top-level tests only: a subtest's time is in its
// parent's.
func (r *report) addTest(e event) {
	if !strings.Contains(e.Test, "/") {
		r.tests = append(r.tests, timing{e.Package + " " + e.Test, e.Elapsed})
	}
}

func (r *report) summary(slowest int) {
	bySeconds := func(s []timing) {
		sort.SliceStable(s, func(i, j int) bool { return s[i].seconds > s[j].seconds })
	}
	bySeconds(r.packages)
	bySeconds(r.tests)
	// A package killed by its -timeout ends its running tests with no
	// event of their own: their output is all there is to read.
	keys := make([]string, 0, len(r.buffered))
	for k := range r.buffered {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(r.out, "== %s did not finish; its output:\n%s", k, r.buffered[k].String())
	}
	fmt.Fprintln(r.out, "== wall time of each package")
	for _, p := range r.packages {
		fmt.Fprintf(r.out, "%8.1fs  %s\n", p.seconds, p.name)
	}
	fmt.Fprintf(r.out, "== the %d slowest tests\n", slowest)
	for i, t := range r.tests {
		if i == slowest {
			break
		}
		fmt.Fprintf(r.out, "%8.1fs  %s\n", t.seconds, t.name)
	}
	if len(r.failed) > 0 {
		fmt.Fprintf(r.out, "== %d failed\n", len(r.failed))
		for _, f := range r.failed {
			fmt.Fprintln(r.out, "  "+f)
		}
	}
}
