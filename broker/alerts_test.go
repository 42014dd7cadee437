package broker

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type alertRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
	For   string `yaml:"for"`
}

// alertRules parses docs/alerts.yml as Prometheus rule groups.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	raw, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	require.NotEmpty(t, rules.Groups)
	var out []alertRule
	for _, g := range rules.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// dashboardExprs are the queries of docs/grafana-dashboard.json, by panel
// title.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile("../docs/grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.UID)
	require.NotEmpty(t, dash.Panels)
	out := map[string][]string{}
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, p.Title)
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

var metricRE = regexp.MustCompile(`\btxmq_[a-z0-9_]+`)

// metricNames are the txmq metric names an expression uses, with the
// _bucket, _sum and _count of histograms cut back to the histogram's name
// when known names says it is one.
func metricNames(expr string, known map[string]bool) []string {
	var out []string
	for _, name := range metricRE.FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				name = b
			}
		}
		out = append(out, name)
	}
	return out
}

// docNames are every metric name docs/alerts.yml and the dashboard use.
func docNames(t *testing.T, known map[string]bool) []string {
	set := map[string]bool{}
	for _, r := range alertRules(t) {
		for _, n := range metricNames(r.Expr, known) {
			set[n] = true
		}
	}
	for _, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			for _, n := range metricNames(e, known) {
				set[n] = true
			}
		}
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// docs/alerts.yml parses as Prometheus rule groups, has the alerts
// docs/operations.md promises, and every txmq metric its expressions name
// is one the broker exports.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	exported := exportedNames(t)
	rules := alertRules(t)
	have := map[string]bool{}
	for _, r := range rules {
		require.NotEmpty(t, r.Alert)
		require.NotEmpty(t, r.Expr, r.Alert)
		require.False(t, have[r.Alert], "alert %s twice", r.Alert)
		have[r.Alert] = true
		names := metricNames(r.Expr, exported)
		require.NotEmpty(t, names, "%s names no txmq metric", r.Alert)
		for _, name := range names {
			require.True(t, exported[name], "%s: metric %s is not exported", r.Alert, name)
		}
	}
	for _, want := range []string{
		"TxmqNoLeader", "TxmqApplyLag", "TxmqHalfMessagesExpired", "TxmqHalfMessagesExpiring", "TxmqOldestPendingHalf",
		"TxmqCheckbackErrors", "TxmqDeadLetters", "TxmqConsumerLagAge", "TxmqEndToEndP95", "TxmqEndToEndP99",
		"TxmqCheckbackScanSlow", "TxmqSlowFsync",
	} {
		require.True(t, have[want], "docs/alerts.yml has no %s", want)
	}
	t.Logf("%d alert rules checked against %d exported metric names", len(rules), len(exported))
}

// docs/grafana-dashboard.json parses, and every txmq metric its queries
// use is one the broker exports.
func TestDashboardNamesRealMetrics(t *testing.T) {
	exported := exportedNames(t)
	exprs := dashboardExprs(t)
	for title, list := range exprs {
		for _, e := range list {
			names := metricNames(e, exported)
			require.NotEmpty(t, names, "%s: %s names no txmq metric", title, e)
			for _, name := range names {
				require.True(t, exported[name], "%s: metric %s is not exported", title, name)
			}
		}
	}
	for _, want := range []string{"Commit rate", "End to end: commit to ack (SLO p95 < 5 s, p99 < 10 s)", "Pending half messages",
		"Check-back results", "Consumer lag", "Dead letters", "Raft state and term", "Fsync: Raft log write time"} {
		require.Contains(t, exprs, want)
	}
}

// exportedNames lists every metric name the broker's registry describes.
func exportedNames(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for name := range exportedLabels(t) {
		out[name] = true
	}
	return out
}

// runbookBase is where every alert's runbook_url points: a section of
// docs/operations.md › Runbooks named after the alert.
const runbookBase = "https://github.com/txmq/txmq/blob/main/docs/operations.md#"

// Every alert links to its runbook, and the runbook section exists.
func TestAlertRunbooks(t *testing.T) {
	raw, err := os.ReadFile("../docs/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	ops, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			require.Equal(t, runbookBase+strings.ToLower(r.Alert), r.Annotations["runbook_url"], r.Alert)
			require.Contains(t, string(ops), "\n### "+r.Alert+"\n", "docs/operations.md has no runbook for %s", r.Alert)
		}
	}
	require.Equal(t, len(alertRules(t)), n)
}

// A producer group with a callback URL of its own is checked back without
// registered instances: TxmqPendingWithoutProducer leaves it out by
// txmq_checkback_static_callback, which TestMetricsEndToEnd sees exported
// for such a group.
func TestPendingWithoutProducerSparesStaticCallbacks(t *testing.T) {
	for _, r := range alertRules(t) {
		if r.Alert == "TxmqPendingWithoutProducer" {
			require.Regexp(t, `unless on \(group\) max by \(group\) \(txmq_checkback_static_callback\) > 0`, r.Expr)
			return
		}
	}
	t.Fatal("no TxmqPendingWithoutProducer")
}

// The dashboard has instance, topic and group variables, and every query
// filters each txmq series by the instance and by whichever of topic and
// group the metric has.
func TestDashboardVariables(t *testing.T) {
	raw, err := os.ReadFile("../docs/grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			vars[v.Name], _ = q["query"].(string)
		}
	}
	labels := exportedLabels(t)
	names := exportedNames(t)
	for _, name := range []string{"instance", "topic", "group"} {
		require.Contains(t, vars, name)
		require.Contains(t, vars[name], name, "variable %s lists label values of %s", name, name)
		for _, metric := range metricRE.FindAllString(vars[name], -1) {
			require.Contains(t, labels, metric, "variable %s", name)
		}
	}
	selector := regexp.MustCompile(`\b(txmq_[a-z0-9_]+)(\{[^}]*\})?`)
	for title, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			for _, m := range selector.FindAllStringSubmatch(e, -1) {
				name := metricNames(m[1], names)[0]
				require.Contains(t, m[2], `instance=~"$instance"`, "%s: %s", title, e)
				for _, l := range []string{"topic", "group"} {
					if slices.Contains(labels[name], l) {
						require.Contains(t, m[2], l+`=~"$`+l+`"`, "%s: %s", title, e)
					}
				}
			}
		}
	}
}

// exportedLabels maps every metric name the broker's registry describes to
// its variable labels.
func exportedLabels(t *testing.T) map[string][]string {
	m := newMetrics(&Broker{})
	ch := make(chan *prometheus.Desc, 1024)
	go func() {
		for _, c := range m.collectors() {
			c.Describe(ch)
		}
		close(ch)
	}()
	re := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		if sub := re.FindStringSubmatch(d.String()); sub != nil {
			out[sub[1]] = strings.Split(sub[2], ",")
		}
	}
	require.NotEmpty(t, out)
	return out
}
