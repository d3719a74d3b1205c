package describe

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Options say how to draw the tree.
type Options struct {
	// Color marks readiness in colour (a terminal).
	Color bool
	// AllConditions lists every condition of every object under it.
	AllConditions bool
}

const (
	green  = "\x1b[32m"
	red    = "\x1b[31m"
	yellow = "\x1b[33m"
	reset  = "\x1b[0m"
)

// Render writes the tree as aligned columns: NAME (with the tree drawn in
// front), READY, PHASE, VERSION, AGE, and the worst condition's reason and
// message.
func Render(w io.Writer, root *Node, o Options) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREADY\tPHASE\tVERSION\tAGE\tREASON")
	var walk func(n *Node, prefix, childPrefix string)
	walk = func(n *Node, prefix, childPrefix string) {
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\n", prefix, title(n), o.ready(n.Ready), dash(n.Phase), dash(n.Version), dash(n.Age), why(n))
		var extra []string
		if n.Detail != "" {
			extra = append(extra, n.Detail)
		}
		if o.AllConditions {
			for _, c := range n.Conditions {
				extra = append(extra, condition(c))
			}
		}
		below := childPrefix
		if len(n.Children) > 0 {
			below += "│ "
		} else {
			below += "  "
		}
		for _, e := range extra {
			fmt.Fprintf(tw, "%s\t\t\t\t\t%s\n", below, e)
		}
		for i, c := range n.Children {
			if i == len(n.Children)-1 {
				walk(c, childPrefix+"└─", childPrefix+"  ")
			} else {
				walk(c, childPrefix+"├─", childPrefix+"│ ")
			}
		}
	}
	walk(root, "", "")
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line == "" {
			continue
		}
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func title(n *Node) string {
	if n.Name == "" {
		return n.Kind
	}
	return n.Kind + "/" + n.Name
}

func why(n *Node) string {
	switch {
	case n.Reason == "" && n.Message == "":
		return ""
	case n.Message == "":
		return n.Reason
	}
	return n.Reason + ": " + truncate(n.Message, 120)
}

// truncate shortens s to at most n runes, ending in "..." when it cuts,
// and never in the middle of a UTF-8 character.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-3]) + "..."
}

func condition(c metav1.Condition) string {
	s := fmt.Sprintf("%s=%s", c.Type, c.Status)
	if c.Reason != "" {
		s += " " + c.Reason
	}
	if c.Message != "" {
		s += ": " + strings.ReplaceAll(c.Message, "\n", " ")
	}
	return s
}

// ready colours a readiness; tabwriter counts the escape codes as width,
// so every value gets codes of the same length.
func (o Options) ready(s string) string {
	if s == "" {
		s = "-"
	}
	if !o.Color {
		return s
	}
	colour := yellow
	switch s {
	case string(metav1.ConditionTrue):
		colour = green
	case string(metav1.ConditionFalse):
		colour = red
	}
	return colour + s + reset
}
