package nodeagent

import "testing"

func TestHostLimitIsRaisedNeverLowered(t *testing.T) {
	l := hostLimit{Key: "fs.inotify.max_user_instances", Min: 8192}
	for _, tc := range []struct {
		current int64
		want    int64
		raise   bool
	}{
		{current: 128, want: 8192, raise: true}, // Debian's default
		{current: 8191, want: 8192, raise: true},
		{current: 8192, raise: false},
		{current: 65536, raise: false}, // a host that gives more keeps it
	} {
		got, raise := l.raiseTo(tc.current)
		if got != tc.want || raise != tc.raise {
			t.Errorf("raiseTo(%d) = %d, %v; want %d, %v", tc.current, got, raise, tc.want, tc.raise)
		}
	}
}
