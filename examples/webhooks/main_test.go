package main

import (
	"testing"
	"time"
)

// eventsOf counts the paid invoices of customer c (declined every 13th).
func eventsOf(cfg config, c int) int {
	n := 0
	for i := range cfg.invoices {
		if i%cfg.customers == c && i%13 != 12 {
			n++
		}
	}
	return n
}

// The example's promise, as a test: every paid invoice's event reaches its
// customer or is dead-lettered, none twice; the gone endpoint's events are
// dead-lettered at once, the down endpoint's after the whole schedule, and
// every other customer gets all of its events despite 503s, 429s, a
// timeout and duplicate deliveries.
func TestWebhooksDeliverOnceOrDeadLetter(t *testing.T) {
	cfg := config{invoices: 130, customers: 10, seed: 7, timeout: 300 * time.Millisecond, schedule: mustSchedule(t, defaultSchedule)}
	sum, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	if sum.lost != 0 || sum.duplicates != 0 || sum.badSignatures != 0 {
		t.Fatalf("%v: want lost=0 duplicates=0 bad_signatures=0", sum)
	}
	if want := eventsOf(cfg, 0); sum.gone != want {
		t.Errorf("gone = %d, want the %d events of the customer whose endpoint answers 410", sum.gone, want)
	}
	if want := eventsOf(cfg, 1); sum.exhausted != want {
		t.Errorf("exhausted = %d, want the %d events of the customer whose endpoint is down", sum.exhausted, want)
	}
	if sum.delivered+sum.deadLettered != sum.events || sum.events != sum.paid {
		t.Errorf("%v: delivered + dead_lettered must be every event of a paid invoice", sum)
	}
	if sum.retries == 0 || sum.virtual < 14*time.Hour || sum.virtual > 24*time.Hour {
		t.Errorf("%v: want retries on the 1m…12h schedule, within a virtual day", sum)
	}
}

func TestWebhooksRejectsBadFlags(t *testing.T) {
	if _, err := run(t.Context(), config{invoices: 0, customers: 10, timeout: time.Second, schedule: []time.Duration{time.Second}}); err == nil {
		t.Fatal("invoices=0 accepted")
	}
}

func mustSchedule(t *testing.T, s string) []time.Duration {
	t.Helper()
	ds, err := parseSchedule(s)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}
