package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// TestRabbitMQDeadLettersSharingAnEventID: on RabbitMQ a delivery's
// BrokerID is its AMQP message-id, which is the event ID, so two dead
// letters of one event (a producer's duplicate that failed too, a redriven
// copy that failed again) share it. Inspect and Redrive took the second for
// a redelivery of the first one they held: inspect listed one, and a
// filtered redrive neither moved the second (although it matched) nor went
// on, stopping with "repeat: every message was seen" while the dead letters
// behind it were still there.
//
// The same with the consumer-timeout warning passed at once: a plain source
// keeps its deliveries valid until their channel dies (Valid would
// otherwise turn false past ConsumerTimeoutWarn, and inspect and redrive
// took that for a redelivery of the held dead letter).
func TestRabbitMQDeadLettersSharingAnEventID(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	t.Parallel()
	for name, params := range map[string]string{"default": "", "warned": "&consumer_timeout=10s&consumer_timeout_warn=1ms"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			deadLettersSharingAnEventID(t, params)
		})
	}
}

func deadLettersSharingAnEventID(t *testing.T, params string) {
	conn, queue := freshRabbitQueue(t, "ackwise-cli-dupid-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := declareQueues(t, conn, queue, queue+".dlq")
	workURL := rabbitURL() + "/" + queue
	deadURL := rabbitURL() + "/" + queue + ".dlq?plain=true" + params

	sink, err := adapters.OpenSink(ctx, rabbitURL()+"/"+queue+".dlq")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for _, l := range []struct {
		id     string
		reason dlq.Reason
	}{{"e1", dlq.ReasonMaxAttempts}, {"e1", dlq.ReasonPermanent}, {"e2", dlq.ReasonPermanent}} {
		env := dlq.Envelope{Reason: l.reason, Error: "bad", ErrorClass: "permanent", Source: queue, Partition: -1, Offset: -1, Attempts: 1, LastFailure: lastFailure}
		m := &ackwise.Message{ID: l.id, Payload: []byte(l.id + "-" + string(l.reason)), Headers: env.Apply(nil)}
		if err := sink.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := ackwiseRun(t, "dlq", "inspect", deadURL, "--idle", "300ms")
	if code != exitOK || len(lines(out)) != 3 {
		t.Errorf("inspect: exit %d, want the 3 dead letters:\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--reason", "permanent", "--rate", "-1", "--idle", "300ms")
	if code != exitOK || !strings.HasPrefix(out, "moved 2 ") || !strings.Contains(out, "skipped 1 ") {
		t.Errorf("redrive -reason permanent: exit %d, want 2 moved and 1 skipped:\nstdout %s\nstderr %s", code, out, errOut)
	}
	for q, want := range map[string]int{queue: 2, queue + ".dlq": 1} {
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Messages != want {
			t.Errorf("%s holds %d messages, want %d", q, st.Messages, want)
		}
	}
}
