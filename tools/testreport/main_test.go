package main

import (
	"strings"
	"testing"
)

const run = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestFast"}
{"Action":"output","Package":"m/a","Test":"TestFast","Output":"=== RUN   TestFast\n"}
{"Action":"pass","Package":"m/a","Test":"TestFast","Elapsed":0.5}
{"Action":"run","Package":"m/a","Test":"TestSlow"}
{"Action":"output","Package":"m/a","Test":"TestSlow/sub","Output":"quiet\n"}
{"Action":"pass","Package":"m/a","Test":"TestSlow/sub","Elapsed":90}
{"Action":"output","Package":"m/a","Test":"TestSlow","Output":"    slow_test.go:9: the reason it broke\n"}
{"Action":"fail","Package":"m/a","Test":"TestSlow","Elapsed":91}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t92.0s\n"}
{"Action":"fail","Package":"m/a","Elapsed":92}
{"Action":"output","Package":"m/b","Test":"TestHung","Output":"waiting for Ready\n"}
{"Action":"output","Package":"m/b","Output":"panic: test timed out after 1m0s\n"}
{"Action":"fail","Package":"m/b","Elapsed":60}
{"Action":"output","Package":"m/c","Output":"ok  \tm/c\t3.0s\n"}
{"Action":"pass","Package":"m/c","Elapsed":3}
`

func TestReport(t *testing.T) {
	var out strings.Builder
	r := &report{out: &out, buffered: map[string]*strings.Builder{}}
	if err := r.read(strings.NewReader(run + "# m/d [build failed]\n")); err != nil {
		t.Fatal(err)
	}
	r.summary(1)
	got := out.String()
	for _, want := range []string{
		"the reason it broke", // a failing test's output
		"FAIL\tm/a\t92.0s",    // the package's line
		"ok  \tm/c\t3.0s",     // a passing package's line
		"== m/b TestHung did not finish; its output:\nwaiting for Ready", // cut by the timeout
		"# m/d [build failed]", // text that is no event
		"== wall time of each package\n    92.0s  m/a\n    60.0s  m/b\n     3.0s  m/c\n",
		"== the 1 slowest tests\n    91.0s  m/a TestSlow\n== ", // subtests not counted
		"== 3 failed\n  m/a TestSlow\n  m/a\n  m/b\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"=== RUN   TestFast", "quiet"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("the report shows a passing test's output %q:\n%s", unwanted, got)
		}
	}
}
