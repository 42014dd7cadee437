// Package names is the rule for the names the API takes (topics, producer
// and consumer groups, node IDs), defined once for the broker, which
// enforces it, and the Go client, which checks it before a call leaves and
// also holds its own producer instance IDs to it: 1 to MaxLen bytes, each
// an ASCII letter, a digit, '.', '_' or '-'.
package names

// MaxLen is the longest name, in bytes.
const MaxLen = 127

// Rule says in words what Valid accepts, for error messages.
const Rule = "1 to 127 of A-Z a-z 0-9 . _ -"

// Valid reports whether name follows the rule. The broker checks the topic
// of every write, so it is a plain loop: 13 ns against a regular
// expression's 333 (BenchmarkValid).
func Valid(name string) bool {
	if len(name) == 0 || len(name) > MaxLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
