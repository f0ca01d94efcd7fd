package retry_test

import (
	"math"
	"strings"
	"testing"

	"github.com/ackwise/ackwise/retry"
)

// TestValidateRefusesNaN: a NaN Multiplier or Jitter passes no comparison,
// so the range checks let it through. Before, Validate accepted both and
// Delay then returned about -292 years (a NaN converted to a Duration): the
// engine retried at once, with no backoff at all, and the RabbitMQ wait
// queues built from the schedule (TiersFor) got nonsense tiers.
func TestValidateRefusesNaN(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	cases := []struct {
		p    retry.Policy
		want string
	}{
		{retry.Policy{Multiplier: nan}, "Multiplier = NaN"},
		{retry.Policy{Jitter: nan}, "Jitter = NaN"},
	}
	for _, tc := range cases {
		if err := tc.p.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.p, err, tc.want)
		}
	}
}
