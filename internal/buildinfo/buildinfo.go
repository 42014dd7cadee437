// Package buildinfo says what a txmq binary was built from: the module
// version, the VCS revision and its time, whether the tree had local
// changes, and the Go version. Every binary prints it for --version, and
// the broker exports it as the txmq_build_info metric.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version, when set at link time, overrides the module version, for
// builds that do not know it (a checkout builds "(devel)"):
//
//	go build -ldflags "-X github.com/txmq/txmq/internal/buildinfo.Version=v1.4.0" ./cmd/...
var Version string

// Info is what the binary was built from. A field the build did not
// record (VCS data under `go run` or without .git) is empty.
type Info struct {
	Version   string
	Revision  string
	Time      string
	Modified  bool
	GoVersion string
}

// Get reads the build information embedded in the running binary.
func Get() Info {
	info := Info{Version: "(devel)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if v := bi.Main.Version; v != "" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if Version != "" {
		info.Version = Version
	}
	return info
}

// Line is the one line a binary prints for --version, such as
// "brokerctl v1.4.0 (revision 0123abcd, 2026-12-01T10:00:00Z, modified) go1.27.3".
func (i Info) Line(program string) string {
	var details []string
	if i.Revision != "" {
		details = append(details, "revision "+shortRevision(i.Revision))
	}
	if i.Time != "" {
		details = append(details, i.Time)
	}
	if i.Modified {
		details = append(details, "modified")
	}
	s := program + " " + i.Version
	if len(details) > 0 {
		s += " (" + strings.Join(details, ", ") + ")"
	}
	return fmt.Sprintf("%s %s", s, i.GoVersion)
}

// shortRevision is the first 12 characters of a commit hash, as git shows
// it.
func shortRevision(r string) string {
	if len(r) > 12 {
		return r[:12]
	}
	return r
}
