// Package scope names the version of ackwise for the instrumentation scopes
// of its meters and tracers (metric.WithInstrumentationVersion,
// trace.WithInstrumentationVersion).
package scope

import (
	"runtime/debug"
	"sync"
)

// modulePath is ackwise's module path, looked up in the build info.
const modulePath = "github.com/ackwise/ackwise"

// Version returns the version of the ackwise module built into the running
// binary, as the Go toolchain recorded it ("v1.2.3", a pseudo-version, or
// "(devel)" when ackwise is the main module built from a work tree), or
// "unknown" without build info (a binary built without module support).
// It reads the build info once.
var Version = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return versionIn(bi)
})

// versionIn returns ackwise's version in bi: the main module's when ackwise
// is the main module, else the dependency's (its replacement's, if
// replaced).
func versionIn(bi *debug.BuildInfo) string {
	if bi.Main.Path == modulePath {
		return orUnknown(bi.Main.Version)
	}
	for _, d := range bi.Deps {
		if d.Path != modulePath {
			continue
		}
		if d.Replace != nil && d.Replace.Version != "" {
			return d.Replace.Version
		}
		return orUnknown(d.Version)
	}
	return "unknown"
}

func orUnknown(v string) string {
	if v == "" {
		return "unknown"
	}
	return v
}
