package scope

import (
	"runtime/debug"
	"testing"
)

func TestVersionIn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"main module", debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"}}, "(devel)"},
		{"dependency", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{{Path: "other", Version: "v9"}, {Path: modulePath, Version: "v1.4.0"}}}, "v1.4.0"},
		{"replaced", debug.BuildInfo{Deps: []*debug.Module{{Path: modulePath, Version: "v1.4.0", Replace: &debug.Module{Path: "../ackwise", Version: "v1.4.1"}}}}, "v1.4.1"},
		{"replaced by a directory", debug.BuildInfo{Deps: []*debug.Module{{Path: modulePath, Version: "v1.4.0", Replace: &debug.Module{Path: "../ackwise"}}}}, "v1.4.0"},
		{"absent", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, "unknown"},
		{"empty version", debug.BuildInfo{Main: debug.Module{Path: modulePath}}, "unknown"},
	} {
		if got := versionIn(&tc.bi); got != tc.want {
			t.Errorf("%s: versionIn = %q, want %q", tc.name, got, tc.want)
		}
	}
	if Version() == "" {
		t.Error("Version() is empty")
	}
}
