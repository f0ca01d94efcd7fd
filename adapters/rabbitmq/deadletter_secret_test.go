package rabbitmq

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestDeadLetterTableDropsSecretHeaders: a dead letter leaves out the
// credential headers (dlq.SecretHeaders, any case, any wire type), although
// the dead letter is built over the delivery's own table.
func TestDeadLetterTableDropsSecretHeaders(t *testing.T) {
	t.Parallel()
	orig := amqp.Table{
		"Authorization": "Bearer s3cret",
		"x-api-key":     []byte("k3y"),
		"COOKIE":        "session=abc",
		"x-tenant":      "acme",
		"x-death":       []any{wellFormedDeath("q.wait.1s", "expired", 1)},
	}
	msg := &ackwise.Message{ID: "e1", Headers: fromTable(orig), Partition: -1, Offset: -1}
	env := dlq.New(msg, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "c", "")
	got := deadLetterTable(orig, msg.Headers, env, true) // a return from a wait queue
	for k := range got {
		if dlq.IsSecretHeader(k) {
			t.Errorf("dead letter kept credential header %s = %v", k, got[k])
		}
	}
	if got["x-tenant"] != "acme" || got["x-death"] == nil || got[dlq.HeaderReason] != "permanent" {
		t.Errorf("dead letter table %v: want x-tenant, x-death and the envelope kept", got)
	}
}
