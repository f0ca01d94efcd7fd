package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
)

// The outbox benchmarks: relay throughput from PostgreSQL to RabbitMQ
// (rows of 200 bytes over 1,000 keys, every publish confirmed), ackwise's
// relay against Watermill's forwarder (watermill-sql's subscriber feeding
// components/forwarder into watermill-amqp with confirms), and the cost of
// adding to the outbox inside a transaction. Run with a fixed count, e.g.
//
//	go test -run '^$' -bench 'Outbox' -benchtime 20000x -count 3 .

const (
	outboxKeys    = 1000
	outboxPayload = 200
	outboxFillTx  = 500 // rows per filling transaction
)

// outboxSchema creates a schema of its own on a pool, dropped at the end.
func outboxSchema(b *testing.B, conns int32) (*pgxpool.Pool, string) {
	b.Helper()
	pool := pgtest.Connect(b, conns)
	name := strings.ReplaceAll(rabbitName("outbox"), "-", "_")
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA `+name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+name+` CASCADE`); err != nil {
			b.Errorf("drop schema: %v", err)
		}
	})
	return pool, name
}

// waitQueueDepth waits until queue holds n messages.
func waitQueueDepth(b *testing.B, queue string, n int) {
	b.Helper()
	c := rabbitDial(b)
	ch, err := c.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		if q.Messages >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages relayed after 10 minutes", q.Messages, n)
		}
		time.Sleep(5 * time.Millisecond) // polling the broker's count
	}
}

func outboxBody() []byte {
	return []byte(`{"type":"invoice.paid","invoice_id":"inv-000000","pad":"` + strings.Repeat("x", outboxPayload-52) + `"}`)
}

func BenchmarkOutboxRelayPostgresToRabbitMQ(b *testing.B) {
	b.Run("ackwise", func(b *testing.B) {
		pool, schema := outboxSchema(b, 8)
		store, err := pgoutbox.New(pool, pgoutbox.Config{Table: schema + ".outbox"})
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Migrate(context.Background()); err != nil {
			b.Fatal(err)
		}
		queue := rabbitPlainQueue(b, "outbox")
		body := outboxBody()
		ctx := context.Background()
		for start := 0; start < b.N; start += outboxFillTx {
			msgs := make([]*ackwise.Message, 0, outboxFillTx)
			for i := start; i < min(b.N, start+outboxFillTx); i++ {
				msgs = append(msgs, &ackwise.Message{Key: fmt.Sprintf("customer-%d", i%outboxKeys), Payload: body})
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return store.Add(ctx, tx, msgs...) }); err != nil {
				b.Fatal(err)
			}
		}
		// A table that has lived has statistics (autovacuum analyzes it);
		// one filled a moment ago has none, and its claims are planned as
		// if it were empty (docs/outbox.md, Several relays).
		if _, err := pool.Exec(ctx, `ANALYZE `+pgx.Identifier{schema, "outbox"}.Sanitize()); err != nil {
			b.Fatal(err)
		}
		sink, err := rabbitmq.NewSink(ctx, rabbitmq.SinkConfig{URL: rabbitURL(), RoutingKey: queue})
		if err != nil {
			b.Fatal(err)
		}
		defer sink.Close()
		counted := &countingStore{Store: store}
		relay, err := outbox.NewRelay(counted, sink, outbox.Config{BatchSize: 500, Workers: 2, Retention: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cpu0 := cpuNow()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(rctx) }()
		waitQueueDepth(b, queue, b.N)
		b.StopTimer()
		cpu := cpuNow() - cpu0
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
		b.ReportMetric(float64(counted.claims.Load()+counted.marks.Load())/float64(b.N), "stmts/event")
		b.ReportMetric(float64(counted.claimNs.Load())/float64(b.N), "claim-ns/event")
		b.ReportMetric(float64(counted.markNs.Load())/float64(b.N), "mark-ns/event")
	})

	b.Run("watermill-forwarder", func(b *testing.B) {
		pool, schema := outboxSchema(b, 8)
		logger := watermill.NopLogger{}
		sqlSchema := wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(topic string) string { return `"` + schema + `"."messages_` + topic + `"` },
			GeneratePayloadType:       func(string) string { return "BYTEA" },
		}
		offsets := wsql.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string { return `"` + schema + `"."offsets_` + topic + `"` },
		}
		db := wsql.BeginnerFromPgx(pool)
		sqlPub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: sqlSchema, AutoInitializeSchema: true}, logger)
		if err != nil {
			b.Fatal(err)
		}
		const fwdTopic = "forwarder"
		queue := rabbitPlainQueue(b, "wm-outbox")
		outPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: fwdTopic})
		body := outboxBody()
		for start := 0; start < b.N; start += outboxFillTx {
			msgs := make([]*message.Message, 0, outboxFillTx)
			for i := start; i < min(b.N, start+outboxFillTx); i++ {
				m := message.NewMessage(watermill.NewUUID(), body)
				m.Metadata.Set("key", fmt.Sprintf("customer-%d", i%outboxKeys))
				msgs = append(msgs, m)
			}
			if err := outPub.Publish(queue, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		// Statistics, as for ackwise's table.
		if _, err := pool.Exec(context.Background(), `ANALYZE `+pgx.Identifier{schema, "messages_" + fwdTopic}.Sanitize()); err != nil {
			b.Fatal(err)
		}
		sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
			ConsumerGroup: "relay", SchemaAdapter: sqlSchema, OffsetsAdapter: offsets, InitializeSchema: true,
			PollInterval: 10 * time.Millisecond,
		}, logger)
		if err != nil {
			b.Fatal(err)
		}
		amqpCfg := wamqp.NewDurableQueueConfig(rabbitURL())
		amqpCfg.Publish.ConfirmDelivery = true
		amqpPub, err := wamqp.NewPublisher(amqpCfg, logger)
		if err != nil {
			b.Fatal(err)
		}
		defer amqpPub.Close()
		fwd, err := forwarder.NewForwarder(sub, amqpPub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cpu0 := cpuNow()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- fwd.Run(ctx) }()
		waitQueueDepth(b, queue, b.N)
		b.StopTimer()
		b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/event")
		cancel()
		_ = fwd.Close()
		<-done
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}

// countingStore counts the relay's statements on the table: claims and
// marks (the only ones on the happy path).
type countingStore struct {
	outbox.Store
	claims, marks   atomic.Int64
	claimNs, markNs atomic.Int64 // time spent in each
}

func (s *countingStore) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]outbox.Row, error) {
	s.claims.Add(1)
	t := time.Now()
	rows, err := s.Store.Claim(ctx, owner, limit, lease)
	s.claimNs.Add(int64(time.Since(t)))
	return rows, err
}

func (s *countingStore) MarkSent(ctx context.Context, ids []int64) error {
	s.marks.Add(1)
	t := time.Now()
	defer func() { s.markNs.Add(int64(time.Since(t))) }()
	return s.Store.MarkSent(ctx, ids)
}

// BenchmarkOutboxAdd is the price of the outbox in the application's
// transaction. Each iteration runs, alternately so that the machine's drift
// hits both alike, "update" (BEGIN; UPDATE one invoice row; COMMIT) and
// "update+outbox" (the same with Store.Add of a 200-byte event before the
// COMMIT, and the trigger's NOTIFY at commit unless no-notify), and
// reports each one's time per transaction and their ratio (update's time
// over update+outbox's: 1 means free).
func BenchmarkOutboxAdd(b *testing.B) {
	for _, notify := range []bool{true, false} {
		name := "notify"
		if !notify {
			name = "no-notify"
		}
		b.Run(name, func(b *testing.B) {
			pool, schema := outboxSchema(b, 4)
			ctx := context.Background()
			store, err := pgoutbox.New(pool, pgoutbox.Config{Table: schema + ".outbox", NoNotify: !notify})
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			invoices := pgx.Identifier{schema, "invoices"}.Sanitize()
			if _, err := pool.Exec(ctx, `CREATE TABLE `+invoices+` (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO `+invoices+` SELECT g, 'open' FROM generate_series(0, 9999) g`); err != nil {
				b.Fatal(err)
			}
			body := outboxBody()
			update := func(tx pgx.Tx, i int) error {
				_, err := tx.Exec(ctx, `UPDATE `+invoices+` SET status = 'paid' WHERE id = $1`, i%10000)
				return err
			}
			var plain, withOutbox time.Duration
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return update(tx, i) }); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := update(tx, i+5000); err != nil {
						return err
					}
					return store.Add(ctx, tx, &ackwise.Message{Key: fmt.Sprintf("customer-%d", i%outboxKeys), Payload: body})
				})
				if err != nil {
					b.Fatal(err)
				}
				plain += t1.Sub(t0)
				withOutbox += time.Since(t1)
			}
			b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "update-ns/tx")
			b.ReportMetric(float64(withOutbox.Nanoseconds())/float64(b.N), "outbox-ns/tx")
			b.ReportMetric(float64(plain)/float64(withOutbox), "ratio")
		})
	}
}
