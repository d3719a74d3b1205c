package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"marina.dev/marina/internal/testenv"
)

// marinaBin is the marina binary built for this run of the suite.
var marinaBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The suite's clients log nothing worth reading; without a logger
	// controller-runtime prints a stack trace into the output instead.
	ctrllog.SetLogger(logr.Discard())
	tmp, err := os.MkdirTemp("", "marina-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if marinaBin, err = testenv.BuildMarina(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
