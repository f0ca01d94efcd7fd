package middleware_test

import (
	"errors"
	"testing"

	"github.com/ackwise/ackwise/middleware"
)

func TestPruneInBatches(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name      string
		rows      int64
		failAt    int // the call that fails; 0: none
		wantTotal int64
		wantCalls int
		wantErr   error
	}{
		{"last batch short", 12, 0, 12, 3, nil},                               // 5, 5, 2
		{"last batch full: one more call deletes nothing", 10, 0, 10, 3, nil}, // 5, 5, 0
		{"nothing to delete", 0, 0, 0, 1, nil},
		{"an error ends it with the total before it", 20, 2, 5, 2, boom},
	} {
		left, calls := tc.rows, 0
		total, err := middleware.PruneInBatches(5, func() (int64, error) {
			calls++
			if calls == tc.failAt {
				return 0, boom
			}
			n := min(left, 5)
			left -= n
			return n, nil
		})
		if !errors.Is(err, tc.wantErr) || total != tc.wantTotal || calls != tc.wantCalls {
			t.Errorf("%s: PruneInBatches = %d, %v after %d calls; want %d, %v after %d", tc.name, total, err, calls, tc.wantTotal, tc.wantErr, tc.wantCalls)
		}
	}
}
