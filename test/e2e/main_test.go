package e2e

import (
	"fmt"
	"os"
	"testing"

	"marina.dev/marina/internal/testenv"
)

// marinaBin is the marina binary built for this run of the suite.
var marinaBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
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
