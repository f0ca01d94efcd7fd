package worker

import (
	"strings"
	"testing"
)

func TestOptionsCheck(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string // "" for valid
	}{
		{Options{}, ""},
		{Options{Demo: 3, ExitWhenDone: true}, ""},
		{Options{Demo: -1}, "-demo -1"},
		{Options{ExitWhenDone: true}, "N ≥ 1 with -exit-when-done"},
	} {
		err := tc.o.Check()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v.Check() = %v, want %q", tc.o, err, tc.want)
		}
	}
}
