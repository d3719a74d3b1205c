package names

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestFitKeepsShortNamesAndBoundsLongOnes(t *testing.T) {
	long := strings.Repeat("a", 60) + "-b"
	other := strings.Repeat("a", 60) + "-c"
	for _, tc := range []struct {
		base, suffix string
		max          int
		want         string // "" when only the bound and label form matter
	}{
		{"minimal", "-cp", 57, "minimal-cp"},
		{strings.Repeat("x", 54), "-cp", 57, strings.Repeat("x", 54) + "-cp"},
		{long, "-cp", 57, ""},
		{"a-" + strings.Repeat("b", 61), "-workers", 46, ""},
	} {
		got := Fit(tc.base, tc.suffix, tc.max)
		if tc.want != "" && got != tc.want {
			t.Errorf("Fit(%q) = %q, want %q", tc.base, got, tc.want)
		}
		if len(got) > tc.max || !strings.HasSuffix(got, tc.suffix) {
			t.Errorf("Fit(%q) = %q: longer than %d or without %q", tc.base, got, tc.max, tc.suffix)
		}
		if errs := validation.IsDNS1123Label(got + "-xxxxx"); len(got) <= 57 && len(errs) > 0 {
			t.Errorf("Fit(%q) = %q is no DNS label prefix: %v", tc.base, got, errs)
		}
	}
	if Fit(long, "-cp", 57) == Fit(other, "-cp", 57) {
		t.Error("two long names sharing a prefix give the same name")
	}
	if Fit(long, "-cp", 57) != Fit(long, "-cp", 57) {
		t.Error("one name gives two names")
	}
}
