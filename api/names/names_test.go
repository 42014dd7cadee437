package names

import (
	"regexp"
	"strings"
	"testing"
)

// The rule as it was first written, a regular expression: Valid must
// agree with it on every input.
var pattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,127}$`)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"orders", true},
		{"Orders.v2_eu-west", true},
		{"a", true},
		{strings.Repeat("x", MaxLen), true},
		{"", false},
		{strings.Repeat("x", MaxLen+1), false},
		{"a b", false},
		{"a/b", false},
		{"a\x00", false},
		{"ordérs", false},
		{"a\n", false},
		{"*", false},
	} {
		if got := Valid(tc.name); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.name, got, tc.want)
		}
		if got := pattern.MatchString(tc.name); got != tc.want {
			t.Errorf("the pattern says %v for %q, the table %v", got, tc.name, tc.want)
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range []string{"orders", "", "a b", "ordérs", strings.Repeat("y", 128)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Valid(s), pattern.MatchString(s); got != want {
			t.Fatalf("Valid(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	name := "bench-backlog.orders_v2"
	b.Run("loop", func(b *testing.B) {
		for b.Loop() {
			if !Valid(name) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("regexp", func(b *testing.B) {
		for b.Loop() {
			if !pattern.MatchString(name) {
				b.Fatal("invalid")
			}
		}
	})
}
