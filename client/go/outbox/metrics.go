package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are a relay's collectors, labelled with the table's name.
// RelayConfig.Registerer registers them all.
type Metrics struct {
	// Backlog, OldestPending and Failed are refreshed every 5 s while
	// Run runs, and by Relay.Stats.
	Backlog, OldestPending, Failed prometheus.Gauge
	Sent, SendErrors, Parked       prometheus.Counter
	ScanDuration                   prometheus.Histogram
}

func newMetrics(table string) *Metrics {
	labels := prometheus.Labels{"table": table}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	return &Metrics{
		Backlog:       gauge("txmq_outbox_backlog", "Outbox rows PENDING or SENDING."),
		OldestPending: gauge("txmq_outbox_oldest_pending_age_seconds", "Age of the oldest outbox row PENDING or SENDING, 0 without any."),
		Failed:        gauge("txmq_outbox_failed_rows", "Outbox rows parked as FAILED, waiting for an operator."),
		Sent:          counter("txmq_outbox_sent_total", "Outbox rows sent to the broker and marked SENT."),
		SendErrors:    counter("txmq_outbox_send_errors_total", "Failed sends of outbox rows."),
		Parked:        counter("txmq_outbox_parked_total", "Outbox rows parked as FAILED after their last failed send."),
		// Seed 003 §5.2: a scan that takes seconds means the backlog will
		// grow; alert on it.
		ScanDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "txmq_outbox_scan_duration_seconds", Help: "Duration of one relay scan: claim, send, record.",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}),
	}
}

func (m *Metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Backlog, m.OldestPending, m.Failed, m.Sent, m.SendErrors, m.Parked, m.ScanDuration} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
