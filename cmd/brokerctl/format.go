package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// printJSON prints v as one line of JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (c *cli) jsonOutput() bool { return c.output == "json" }

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// printFields prints label/value pairs as an aligned two-column table.
func printFields(w io.Writer, fields [][2]string) error {
	tw := newTable(w)
	for _, f := range fields {
		label := f[0]
		if label != "" {
			// An empty label continues the previous field on a new line.
			label += ":"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, f[1])
	}
	return tw.Flush()
}

// propertyFields are the lines of a message's properties, one per
// property, sorted by key; a line "-" when there is none.
func propertyFields(props map[string]string) [][2]string {
	if len(props) == 0 {
		return [][2]string{{"Properties", "-"}}
	}
	var fields [][2]string
	label := "Properties"
	for _, k := range sortedKeys(props) {
		fields = append(fields, [2]string{label, k + "=" + props[k]})
		label = ""
	}
	return fields
}

// printMessage prints a message's fields, then its body: below the table,
// where tabs and line breaks in it cannot disturb the alignment, as text
// or, when it is not UTF-8, base64; "-" in the table when empty.
func printMessage(w io.Writer, fields [][2]string, body []byte) error {
	if len(body) == 0 {
		return printFields(w, append(fields, [2]string{"Body", "-"}))
	}
	if err := printFields(w, fields); err != nil {
		return err
	}
	var err error
	if utf8.Valid(body) {
		_, err = fmt.Fprintf(w, "Body:\n%s\n", body)
	} else {
		_, err = fmt.Fprintf(w, "Body (base64):\n%s\n", base64.StdEncoding.EncodeToString(body))
	}
	return err
}

func stateName(s txmqv1.HalfState) string {
	return strings.TrimPrefix(s.String(), "HALF_STATE_")
}

func sourceName(s txmqv1.ResolutionSource) string {
	if s == txmqv1.ResolutionSource_RESOLUTION_SOURCE_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(s.String(), "RESOLUTION_SOURCE_")
}

// resolutionName is "COMMIT", "ROLLBACK" or "UNKNOWN", or "" when unset.
func resolutionName(r txmqv1.Resolution) string {
	if r == txmqv1.Resolution_RESOLUTION_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(r.String(), "RESOLUTION_")
}

// expiryName is "PARK" or "ROLLBACK", or "" when unset.
func expiryName(a txmqv1.ExpiryAction) string {
	if a == txmqv1.ExpiryAction_EXPIRY_ACTION_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(a.String(), "EXPIRY_ACTION_")
}

// poisonName is "SKIP" or "HOLD", or "" when unset.
func poisonName(p txmqv1.OrderedPoison) string {
	if p == txmqv1.OrderedPoison_ORDERED_POISON_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(p.String(), "ORDERED_POISON_")
}

// endpointText renders a producer's callback endpoint the way a group's
// callback URL is written: grpc://host:port, or the HTTP URL.
func endpointText(e *txmqv1.CallbackEndpoint) string {
	switch {
	case e.GetGrpcAddress() != "":
		return "grpc://" + e.GetGrpcAddress()
	case e.GetHttpUrl() != "":
		return e.GetHttpUrl()
	case e.GetSession() != "":
		return "session://" + e.GetSession()
	}
	return ""
}

// jsonDuration is a Go duration string such as "6s" or "1m0s", or "" when
// unset.
func jsonDuration(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	return d.AsDuration().String()
}

// tableDuration is a Go duration string, or "-" when unset.
func tableDuration(d *durationpb.Duration) string {
	return orDash(jsonDuration(d))
}

func jsonTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

// tableTime is RFC 3339 to the second, in UTC, or "-" when unset.
func tableTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

// tableBackoff renders a redelivery backoff schedule the way
// --redelivery-backoff reads it, or "-" when empty.
func tableBackoff(list []*durationpb.Duration) string {
	ds := make([]time.Duration, len(list))
	for i, d := range list {
		ds[i] = d.AsDuration()
	}
	return orDash(joinDurations(ds))
}

// lagAge is how old the oldest unacked message is, for a person: whole
// seconds without zero units ("3m12s", "2h", "1h5s"), or "-" when nothing
// is unacked.
func lagAge(lag uint64, age *durationpb.Duration) string {
	if lag == 0 || age == nil {
		return "-"
	}
	return humanDuration(age.AsDuration())
}

// humanDuration is d in hours, minutes and seconds, leaving out zero units;
// below a second it is d rounded to the millisecond.
func humanDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	d = d.Truncate(time.Second)
	var b strings.Builder
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.unit; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			d -= n * u.unit
		}
	}
	return b.String()
}

// orDash returns s, or "-" for an empty s, so table columns never collapse.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tableCell renders free text, such as an error, as one table cell of at
// most width characters: runs of white space and control characters become one
// space, and a longer text is cut and ends in "...".
func tableCell(s string, width int) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if utf8.RuneCountInString(s) <= width {
		return orDash(s)
	}
	runes := []rune(s)
	return strings.TrimRightFunc(string(runes[:width-3]), unicode.IsSpace) + "..."
}

// lineBody renders a body on one line: text as it is, text with line breaks
// or other control characters Go-quoted, anything else as base64.
func lineBody(b []byte) string {
	if !utf8.Valid(b) {
		return "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	s := string(b)
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
