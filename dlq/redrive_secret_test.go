package dlq_test

import (
	"testing"

	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// TestRedriveCopyHasNoSecretHeaders: a dead letter that carries a
// credential header (one written before it was left out, or by another
// tool) goes back without it (dlq.SecretHeaders, docs/dead-letters.md).
func TestRedriveCopyHasNoSecretHeaders(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	m := message("e0")
	m.Headers.Set("Authorization", "Bearer s3cret")
	m.Headers.Set("x-api-key", "k3y")
	env := dlq.Envelope{Reason: dlq.ReasonPermanent, ErrorClass: "permanent", Source: tb.work, Partition: -1, Offset: -1}
	env.Encode(&m.Headers)
	memorytest.Publish(t, tb.b, tb.dead, m)
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: quick})
	if err != nil || res.Moved != 1 {
		t.Fatalf("result %+v, %v", res, err)
	}
	got, err := tb.b.Messages(tb.work)
	if err != nil || len(got) != 1 {
		t.Fatalf("work queue: %v, %v", got, err)
	}
	for _, kv := range got[0].Headers {
		if dlq.IsSecretHeader(kv.Key) {
			t.Errorf("redriven message carries %s", kv.Key)
		}
	}
	if got[0].ID != "e0" || got[0].Headers.Get("x-tenant") != "acme" {
		t.Errorf("redriven message %+v", got[0])
	}
}
