package ownedflags

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"marina.dev/marina/tools"
)

// wiringWords in a flag's help text suggest it wires the component to a
// file, an address or a credential.
var wiringWords = regexp.MustCompile(`(?i)\b(file|files|path|directory|address|port|url|host|kubeconfig|certificate|key|token|ca)\b`)

// notWiring are flags whose help mentions such a word but which only tune
// the component, each reviewed: the test fails on any other flag whose help
// suggests wiring and that is not owned, so that a release adding a
// wiring flag is noticed.
var notWiring = map[string]string{
	"kube-apiserver --allow-metric-labels":                                   "metric labels allowed, as values",
	"kube-apiserver --audit-log-compress":                                    "rotation of the audit log, whose path is owned",
	"kube-apiserver --audit-log-maxage":                                      "rotation of the audit log",
	"kube-apiserver --audit-log-maxbackup":                                   "rotation of the audit log",
	"kube-apiserver --audit-log-maxsize":                                     "rotation of the audit log",
	"kube-apiserver --cors-allowed-origins":                                  "browser origins; callers are still authenticated and authorized",
	"kube-apiserver --feature-gates":                                         "features",
	"kube-apiserver --profiling":                                             "pprof behind authentication and authorization",
	"kube-apiserver --runtime-config":                                        "which APIs are served",
	"kube-apiserver --tls-curve-preferences":                                 "TLS tuning",
	"kube-apiserver --vmodule":                                               "verbosity",
	"kube-controller-manager --allow-metric-labels":                          "metric labels allowed, as values",
	"kube-controller-manager --concurrent-serviceaccount-token-syncs":        "concurrency",
	"kube-controller-manager --feature-gates":                                "features",
	"kube-controller-manager --legacy-service-account-token-clean-up-period": "a period",
	"kube-controller-manager --profiling":                                    "pprof behind authentication and authorization",
	"kube-controller-manager --tls-curve-preferences":                        "TLS tuning",
	"kube-controller-manager --vmodule":                                      "verbosity",
	"kube-scheduler --allow-metric-labels":                                   "metric labels allowed, as values",
	"kube-scheduler --contention-profiling":                                  "profiling",
	"kube-scheduler --feature-gates":                                         "features",
	"kube-scheduler --kube-api-burst":                                        "client rate",
	"kube-scheduler --kube-api-content-type":                                 "client encoding",
	"kube-scheduler --kube-api-qps":                                          "client rate",
	"kube-scheduler --profiling":                                             "pprof behind authentication and authorization",
	"kube-scheduler --tls-curve-preferences":                                 "TLS tuning",
	"kube-scheduler --vmodule":                                               "verbosity",
}

// helpFlags runs a component's --help and returns each flag with its help
// text.
func helpFlags(t *testing.T, binary string) map[string]string {
	t.Helper()
	out, err := exec.Command(binary, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", binary, err, out)
	}
	start := regexp.MustCompile(`^\s+(?:-[a-z], )?--([a-z0-9][-a-z0-9._]*)\b(.*)$`)
	flags := map[string]string{}
	current := ""
	for _, line := range strings.Split(string(out), "\n") {
		if m := start.FindStringSubmatch(line); m != nil {
			current = m[1]
			flags[current] = m[2]
			continue
		}
		if !strings.HasPrefix(line, " ") {
			current = "" // a section's title, or the end of the flags
		}
		if current != "" {
			flags[current] += " " + strings.TrimSpace(line)
		}
	}
	if len(flags) < 20 {
		t.Fatalf("%s --help lists %d flags: the output format changed?\n%s", binary, len(flags), out)
	}
	return flags
}

// Every flag of the pinned releases whose help speaks of files, addresses
// or credentials is owned, or reviewed as tuning (notWiring).
func TestEveryWiringFlagOfTheReleasesIsOwned(t *testing.T) {
	bin, err := filepath.Abs(filepath.Join("..", "..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range tools.Pinned().Kube {
		for _, c := range Components {
			checkRelease(t, filepath.Join(bin, c+"-"+v), c)
		}
	}
}

func checkRelease(t *testing.T, binary, c string) {
	for name, help := range helpFlags(t, binary) {
		if _, owned := Owned(c, name); owned || !wiringWords.MatchString(help) {
			continue
		}
		if _, ok := notWiring[c+" --"+name]; ok {
			continue
		}
		t.Errorf("%s --%s is neither owned nor reviewed as tuning; its help: %s", filepath.Base(binary), name, strings.Join(strings.Fields(help), " "))
	}
}
