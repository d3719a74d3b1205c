package describe

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// A long condition message is shortened in the tree without cutting a
// UTF-8 character in two: the terminal would show a replacement character.
func TestRenderTruncatesMessagesOnRunes(t *testing.T) {
	for _, msg := range []string{
		strings.Repeat("a", 116) + strings.Repeat("é", 10), // é's two bytes straddle the cut
		strings.Repeat("ü", 200),                           // every character is two bytes
		strings.Repeat("水", 130),                           // three bytes
		"machine " + strings.Repeat("🚢", 150) + " is late", // four bytes
	} {
		var out bytes.Buffer
		tree := &Node{Kind: "Machine", Name: "m", Reason: "Waiting", Message: msg}
		if err := Render(&out, tree, Options{}); err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(out.Bytes()) {
			t.Errorf("the tree is not valid UTF-8 for a message of %d bytes:\n%q", len(msg), out.String())
		}
		if !strings.Contains(out.String(), "...") {
			t.Errorf("a message of %d characters was not shortened:\n%s", utf8.RuneCountInString(msg), out.String())
		}
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"one more char", 10, "one mor..."},
		{"ééééééééééé", 10, "ééééééé..."},
	} {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
