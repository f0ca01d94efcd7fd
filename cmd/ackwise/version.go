package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func versionCmd(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the module version this binary was built from",
		Args:  positional(),
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprintln(e.stdout, versionText())
			return nil
		},
	}
}

// versionText is "ackwise <module version>, built with <Go version>[,
// revision <commit>[, modified]]"
// from the build information: the module version is the tag go install
// built (v1.2.3), "(devel)" for a build from a work tree.
func versionText() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "ackwise (unknown version: built without module information)"
	}
	s := fmt.Sprintf("ackwise %s, built with %s", bi.Main.Version, bi.GoVersion)
	var rev, modified string
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.modified":
			if kv.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		s += ", revision " + rev + modified
	}
	return s
}
