package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// A limit below its minimum is raised to it; one at or above is kept; a
// value that is no number is a clear error.
func TestHostLimitsAreRaisedNeverLowered(t *testing.T) {
	for _, tc := range []struct {
		now, want string
		err       string
	}{
		{now: "128\n", want: "8192"}, // Debian's default
		{now: "8192\n", want: "8192\n"},
		{now: "65536\n", want: "65536\n"}, // a host that gives more keeps it
		{now: "lots\n", want: "lots\n", err: `reading fs.inotify.max_user_instances: "lots\n" is not a number`},
	} {
		root := t.TempDir()
		path := filepath.Join(root, "fs", "inotify", "max_user_instances")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(tc.now), 0o644); err != nil {
			t.Fatal(err)
		}
		err := raiseLimits(klog.Background(), root, []hostLimit{{Key: "fs.inotify.max_user_instances", Min: 8192}})
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("from %q: error %v, want %q", tc.now, err, tc.err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != tc.want {
			t.Errorf("from %q: the limit is %q, want %q", tc.now, got, tc.want)
		}
	}
}
