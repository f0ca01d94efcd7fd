package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/internal/pgtest"
)

// rabbitURL is the broker: ACKWISE_RABBITMQ_URL, else the machine's server.
func rabbitURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672"
}

// The example on PostgreSQL and RabbitMQ, by URL: the code path of the
// default run, with a schema and queues of the test's own (removed when it
// ends) and a schedule in real time.
func TestWebhooksOnPostgresAndRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and RabbitMQ; -short runs offline tests only")
	}
	pool := pgtest.Connect(t, 2) // fails the test when PostgreSQL is down
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		t.Fatalf("RabbitMQ unreachable (start it with rabbitmq-server -detached): %v", err)
	}
	id := newRunID()
	cfg := config{invoices: 60, customers: 8, seed: 7, timeout: 300 * time.Millisecond,
		db: pgtest.URL(), schema: "webhooks_test_" + id, broker: rabbitURL(), queue: "ackwise-webhooks-" + id,
		schedule: mustSchedule(t, "100ms,200ms,300ms,400ms,500ms")}
	t.Cleanup(func() {
		defer conn.Close()
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{cfg.schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		qs := []string{cfg.queue, cfg.queue + dlqSuffix}
		for _, d := range cfg.schedule {
			qs = append(qs, rabbitmq.WaitQueueName(cfg.queue, d))
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("delete queues: %v", err)
			return
		}
		defer ch.Close()
		for _, q := range qs {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
	})
	sum, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	checkSummary(t, cfg, sum)
	var rows int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{cfg.schema, "outbox"}.Sanitize()+` WHERE sent_at IS NOT NULL`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != sum.paid {
		t.Errorf("%d outbox rows sent in PostgreSQL, want %d", rows, sum.paid)
	}
}

// The example on PostgreSQL and Kafka (kfake, Kafka's protocol in this
// process), by URL.
func TestWebhooksOnPostgresAndKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL; -short runs offline tests only")
	}
	pool := pgtest.Connect(t, 2)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	id := newRunID()
	cfg := config{invoices: 60, customers: 8, seed: 7, timeout: 300 * time.Millisecond,
		db: pgtest.URL(), schema: "webhooks_test_" + id, broker: "kafka://" + c.ListenAddrs()[0], queue: "invoice-paid",
		schedule: mustSchedule(t, "100ms,200ms,300ms,400ms,500ms")}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{cfg.schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	sum, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	checkSummary(t, cfg, sum)
}

// checkSummary checks the promise of a run on real services.
func checkSummary(t *testing.T, cfg config, sum summary) {
	t.Helper()
	if sum.lost != 0 || sum.duplicates != 0 || sum.badSignatures != 0 {
		t.Fatalf("%v: want lost=0 duplicates=0 bad_signatures=0", sum)
	}
	if want := eventsOf(cfg, 0); sum.gone != want || want == 0 {
		t.Errorf("gone = %d, want the %d events of the customer whose endpoint answers 410", sum.gone, want)
	}
	if want := eventsOf(cfg, 1); sum.exhausted != want || want == 0 {
		t.Errorf("exhausted = %d, want the %d events of the customer whose endpoint is down", sum.exhausted, want)
	}
	if sum.delivered+sum.deadLettered != sum.events || sum.events != sum.paid || sum.retries == 0 {
		t.Errorf("%v: delivered + dead_lettered must be every event of a paid invoice, after retries", sum)
	}
}
