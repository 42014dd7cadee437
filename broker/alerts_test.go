package broker

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// docs/alerts.yml parses as Prometheus rule groups, and every txmq metric
// its expressions name is one the broker exports.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
				For   string `yaml:"for"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	require.NotEmpty(t, rules.Groups)

	exported := exportedNames(t)
	nameRE := regexp.MustCompile(`\btxmq_[a-z0-9_]+`)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Expr, r.Alert)
			names := nameRE.FindAllString(r.Expr, -1)
			require.NotEmpty(t, names, "%s names no txmq metric", r.Alert)
			for _, name := range names {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] {
						base = b
					}
				}
				require.True(t, exported[base], "%s: metric %s is not exported", r.Alert, name)
			}
		}
	}
	t.Logf("%d alert rules checked against %d exported metric names", n, len(exported))
}

// exportedNames lists every metric name the broker's registry describes.
func exportedNames(t *testing.T) map[string]bool {
	b := &Broker{}
	m := newMetrics(b)
	ch := make(chan *prometheus.Desc, 1024)
	go func() {
		for _, c := range m.collectors() {
			c.Describe(ch)
		}
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	for d := range ch {
		if sub := fq.FindStringSubmatch(d.String()); sub != nil {
			out[sub[1]] = true
		}
	}
	require.NotEmpty(t, out)
	return out
}
