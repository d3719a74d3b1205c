package upgrade

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	avail := []string{"v1.36.3", "v1.37.2"}
	tests := []struct {
		from, to string
		wantErr  string
	}{
		{"v1.36.3", "v1.37.2", ""},
		{"v1.37.2", "v1.37.2", ""},
		{"", "v1.37.2", ""},
		{"v1.36.3", "v1.38.0", "was not built here: available are v1.36.3, v1.37.2"},
		{"v1.35.1", "v1.37.2", "skips a minor version: upgrade to v1.36 first"},
		{"v1.37.2", "v1.36.3", "downgrade from v1.37.2 to v1.36.3 crosses a minor version"},
		{"v1.36.3", "1.37", "is not a Kubernetes version"},
	}
	for _, tc := range tests {
		err := Check(tc.from, tc.to, avail)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("Check(%s, %s) = %v, want %q", tc.from, tc.to, err, tc.wantErr)
		}
	}
}

func TestKubeletAllowed(t *testing.T) {
	if err := KubeletAllowed("v1.37.2", "v1.36.3"); err == nil || !strings.Contains(err.Error(), "newer than the oldest API server") {
		t.Errorf("a kubelet newer than the API server: %v", err)
	}
	if err := KubeletAllowed("v1.36.3", "v1.37.2"); err != nil {
		t.Errorf("an older kubelet: %v", err)
	}
}

func TestRewriteFlags(t *testing.T) {
	table := []FlagChange{
		{Component: APIServer, Since: "1.37", Old: "old-flag", New: "new-flag"},
		{Component: APIServer, Since: "1.37", Old: "gone-flag"},
		{Component: Scheduler, Since: "1.37", Old: "v", New: "verbosity"},
	}
	in := map[string]string{"old-flag": "x", "gone-flag": "y", "v": "2"}
	got, err := RewriteFlags(table, APIServer, "v1.37.2", in)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["new-flag"] != "x" || got["v"] != "2" {
		t.Errorf("at v1.37: %v", got)
	}
	if got, _ := RewriteFlags(table, APIServer, "v1.36.3", in); len(got) != 3 || got["old-flag"] != "x" {
		t.Errorf("at v1.36 nothing changes: %v", got)
	}
	if in["old-flag"] != "x" || len(in) != 3 {
		t.Errorf("the input was modified: %v", in)
	}
}
