package middleware_test

import (
	"strings"
	"testing"

	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

func TestVersionGateConfigErrors(t *testing.T) {
	t.Parallel()
	store := meminbox.New(nil)
	for _, c := range []struct {
		cfg  middleware.VersionGateConfig
		want string
	}{
		{middleware.VersionGateConfig{}, "VersionGateConfig.Consumer"},
		{middleware.VersionGateConfig{Consumer: "c", MaxVersionGap: -2}, "MaxVersionGap = -2"},
	} {
		if _, err := middleware.VersionGate(store, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("VersionGate(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
		}
	}
	for _, gap := range []int64{0, 1, middleware.NoVersionGapLimit, middleware.DefaultMaxVersionGap} {
		if _, err := middleware.VersionGate(store, middleware.VersionGateConfig{Consumer: "c", MaxVersionGap: gap}); err != nil {
			t.Errorf("MaxVersionGap %d: %v", gap, err)
		}
	}
}
