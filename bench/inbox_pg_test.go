package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
)

// inboxWorkers is the number of concurrent handlers, as a consumer with
// concurrency 8 would run.
const inboxWorkers = 8

type inboxVariant struct {
	name string
	h    ackwise.Handler
}

type inboxFixture struct {
	pool     *pgxpool.Pool
	schema   string // quoted
	store    *pginbox.Store
	variants []inboxVariant
}

// newInboxFixture connects to PostgreSQL, creates a schema of its own with
// the inbox tables and an effects table (dropped by b.Cleanup; a bigint
// identity primary key, event_id, amount), and builds
// the handlers compared:
//
//   - effect-autocommit: the effect's INSERT alone, no transaction, no
//     dedupe (the ceiling; not safe against redelivery);
//   - effect-tx: BEGIN; INSERT effect; COMMIT, no dedupe;
//   - inbox: middleware.Inbox over pginbox — BEGIN; INSERT record … ON
//     CONFLICT DO NOTHING; INSERT effect; COMMIT;
//   - inbox-one-round-trip: the same with pginbox.Config.OneRoundTripClaim
//     ("BEGIN; INSERT record" sent as one query);
//   - handwritten-on-conflict: the inbox's statements written by hand in
//     pgx.BeginFunc (what the middleware itself costs);
//   - naive-select-insert: BEGIN; SELECT record; INSERT record; INSERT
//     effect; COMMIT — the dedupe people write first (which, unlike the
//     inbox, turns a race into a unique-violation error).
func newInboxFixture(b *testing.B) *inboxFixture {
	url := os.Getenv("ACKWISE_TEST_POSTGRES")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = inboxWorkers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		b.Fatalf("PostgreSQL unreachable: %v", err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "ackwise_bench_" + hex.EncodeToString(rnd[:])
	schema := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			b.Errorf("drop schema: %v", err)
		}
	})
	storeCfg := pginbox.Config{Table: name + ".inbox", VersionTable: name + ".versions"}
	store, err := pginbox.New(pool, storeCfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	storeCfg.OneRoundTripClaim = true
	store1RT, err := pginbox.New(pool, storeCfg)
	if err != nil {
		b.Fatal(err)
	}
	effects := schema + ".effects"
	// The effect table has a primary key, as a real table would; set
	// ACKWISE_BENCH_EFFECT_NO_PK=1 for a heap without any index (the
	// cheapest possible effect, which makes every dedupe look costlier).
	effectPK := "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
	if os.Getenv("ACKWISE_BENCH_EFFECT_NO_PK") != "" {
		effectPK = ""
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (`+effectPK+`event_id text NOT NULL, amount int NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	insertEffect := `INSERT INTO ` + effects + ` (event_id, amount) VALUES ($1, 10)`
	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	inbox1RT, err := middleware.Inbox(store1RT, middleware.InboxConfig{Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	effectInTx := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		_, err := pginbox.Tx(ctx).Exec(ctx, insertEffect, msg.ID)
		return err
	})
	f := &inboxFixture{pool: pool, schema: schema, store: store}
	f.variants = []inboxVariant{
		{"effect-autocommit", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			_, err := pool.Exec(ctx, insertEffect, msg.ID)
			return err
		})},
		{"effect-tx", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertEffect, msg.ID)
				return err
			})
		})},
		{"inbox", inbox(effectInTx)},
		{"inbox-one-round-trip", inbox1RT(effectInTx)},
		{"handwritten-on-conflict", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `INSERT INTO `+schema+`.inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, "bench", msg.ID)
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				_, err = tx.Exec(ctx, insertEffect, msg.ID)
				return err
			})
		})},
		{"naive-select-insert", ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var seen bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+schema+`.inbox WHERE consumer = $1 AND event_id = $2)`,
					"bench", msg.ID).Scan(&seen); err != nil || seen {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.inbox (consumer, event_id) VALUES ($1, $2)`, "bench", msg.ID); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, insertEffect, msg.ID)
				return err
			})
		})},
	}
	return f
}

func (f *inboxFixture) truncate(b *testing.B) {
	if _, err := f.pool.Exec(context.Background(), `TRUNCATE `+f.schema+`.effects, `+f.schema+`.inbox`); err != nil {
		b.Fatal(err)
	}
}

var runSeq atomic.Int64

// run handles n first deliveries with inboxWorkers workers, one message
// per call of h, and returns the elapsed time.
func (f *inboxFixture) run(b *testing.B, h ackwise.Handler, n int) time.Duration {
	one := ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
		return h.Handle(ctx, msgs[0])
	})
	return f.runBatches(b, one, n, 1)
}

// BenchmarkInboxPostgres measures each handler variant (see
// newInboxFixture) on its own: one op is one message, a one-row effect.
//
// Run: go test -run '^$' -bench 'InboxPostgres$' -benchtime 4000x -count 10 .
func BenchmarkInboxPostgres(b *testing.B) {
	f := newInboxFixture(b)
	for _, v := range f.variants {
		b.Run(v.name, func(b *testing.B) {
			f.truncate(b)
			b.ResetTimer()
			d := f.run(b, v.h, b.N)
			b.ReportMetric(float64(b.N)/d.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkInboxPostgresRatio measures the variants in paired rounds: one op
// is a round in which every variant, in a random order, handles the same
// number of messages. It reports each variant's median msgs/s over the
// rounds and the median of the per-round ratios, which a machine whose load
// drifts (other processes on 2 shared cores) disturbs far less than
// separate runs.
//
// Run: go test -run '^$' -bench 'InboxPostgresRatio' -benchtime 20x -count 3 .
func BenchmarkInboxPostgresRatio(b *testing.B) {
	const perRound = 1000
	f := newInboxFixture(b)
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	order := slices.Clone(f.variants)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		f.truncate(b)
		b.StartTimer()
		mrand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		round := map[string]float64{}
		for _, v := range order {
			round[v.name] = perRound / f.run(b, v.h, perRound).Seconds()
			rates[v.name] = append(rates[v.name], round[v.name])
		}
		for _, base := range []string{"effect-autocommit", "effect-tx", "naive-select-insert"} {
			for _, v := range []string{"inbox", "inbox-one-round-trip"} {
				k := v + "/" + base
				ratios[k] = append(ratios[k], round[v]/round[base])
			}
		}
	}
	for name, r := range rates {
		b.ReportMetric(median(r), name+"-msgs/s")
	}
	for name, r := range ratios {
		b.ReportMetric(median(r), name)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
