// Command marina is the single marina binary: it runs the embedded
// management plane (up), the controllers against any cluster (controller),
// and the command-line verbs built on marina's API.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
