package rabbitmq

import (
	"log/slog"
	"testing"
	"time"
)

// A consumer connection lost soon after each reconnection (as one a
// poison delivery kills each time would be) is made again ever more
// slowly: the reconnection schedule starts over only after a connection
// that stayed up for ReconnectMaxInterval. Before, it started over at each
// loss, so such a connection was remade every ReconnectInitialInterval, 66
// times in 13 s. Jitter is ±50%: a schedule that started over would wait
// at most 1.5 × the initial interval each time; the sixth wait of a
// growing one (×1.5 each) is at least 0.5 × 1.5⁵ ≈ 3.8 × it.
func TestQuickConnectionLossesBackOff(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	p, proxyURL := newHandshakeProxy(t)
	cfg.URL = proxyURL
	cfg.ReconnectInitialInterval = 50 * time.Millisecond
	cfg.ReconnectMaxInterval = time.Minute
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	newSource(t, cfg)
	const losses = 6
	for i := range losses {
		waitFor(t, "reconnection", func() bool { return len(logs.matching("consumer reconnected")) == i })
		p.closeAll()
		waitFor(t, "connection loss", func() bool { return len(logs.matching("consumer channel lost")) == i+1 })
	}
	lost := logs.matching("consumer channel lost")
	var waits []time.Duration
	for _, r := range lost {
		var d time.Duration
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "retry_in" {
				d = a.Value.Duration()
			}
			return true
		})
		waits = append(waits, d)
	}
	if waits[losses-1] <= 3*cfg.ReconnectInitialInterval {
		t.Fatalf("waits before each reconnection %v: the schedule started over after connections that lived moments", waits)
	}
}
