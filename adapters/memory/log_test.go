package memory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

func TestPartitionOfMatchesKafka(t *testing.T) {
	t.Parallel()
	// Kafka's Utils.murmur2 test vectors, through toPositive and modulo.
	for _, c := range []struct {
		key  string
		hash int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		want := int32((uint32(c.hash) & 0x7fffffff) % 7)
		if got := memory.PartitionOf(c.key, 7); got != want {
			t.Errorf("PartitionOf(%q, 7) = %d, want %d", c.key, got, want)
		}
	}
}

func TestLogPartitionsOffsetsAndOrder(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	src := tb.member(t, "ev", "g")
	if got := fmt.Sprint(src.Assigned()); got != "[0 1 2 3]" {
		t.Fatalf("assigned %s", got)
	}
	caps := src.Capabilities()
	if !caps.Log || !caps.Ordered || caps.Delay || caps.ExtendLease || caps.DeliveryCount {
		t.Fatalf("caps = %+v", caps)
	}
	keys := []string{"alpha", "beta", "gamma", "delta", "epsilon"}
	var all []*ackwise.Message
	for i := range 50 {
		all = append(all, msg(fmt.Sprint(i), keys[i%len(keys)]))
	}
	tb.publish(t, "ev", all...)
	got := recv(t, src, 50)
	next := map[int32]int64{}
	lastByKey := map[string]int{}
	for _, m := range got {
		if want := memory.PartitionOf(m.Key, 4); m.Partition != want {
			t.Fatalf("%s in partition %d, want %d", m.ID, m.Partition, want)
		}
		if m.Offset != next[m.Partition] {
			t.Fatalf("%s at offset %d of %d, want %d", m.ID, m.Offset, m.Partition, next[m.Partition])
		}
		next[m.Partition]++
		if m.BrokerID != fmt.Sprintf("ev/%d@%d", m.Partition, m.Offset) {
			t.Fatalf("BrokerID %q", m.BrokerID)
		}
		var id int
		fmt.Sscan(m.ID, &id)
		if prev, ok := lastByKey[m.Key]; ok && prev > id {
			t.Fatalf("key %s out of order: %d after %d", m.Key, id, prev)
		}
		lastByKey[m.Key] = id
		if m.Attempt != 1 || m.Source != "ev" {
			t.Fatalf("facts %+v", m)
		}
	}
	st := mustStats(t, tb.b, "ev")
	var sum int64
	for _, e := range st.EndOffsets {
		sum += e
	}
	if sum != 50 || len(st.EndOffsets) != 4 {
		t.Fatalf("end offsets %v", st.EndOffsets)
	}
}

func TestLogCommitsSettledPrefixOnly(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g") // auto-created, 1 partition
	for i := range 5 {
		tb.publish(t, "ev", msg(fmt.Sprint(i), "k"))
	}
	ms := recv(t, src, 5)
	ack := func(i int) {
		t.Helper()
		if err := src.Ack(tb.ctx, ms[i]); err != nil {
			t.Fatal(err)
		}
	}
	ack(1)
	ack(3)
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 0)
	ack(0)
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 2) // 0,1 settled; 2 not
	env := dlq.New(ms[2], dlq.ReasonPermanent, errors.New("x"), ackwise.ClassPermanent, tb.clk.Now(), "c", "")
	if err := src.DeadLetter(tb.ctx, ms[2], env); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 4) // dead-lettered counts as settled
	ack(4)
	memorytest.WaitForCommitted(t, tb.b, "ev", "g", 0, 5)
	// A second settle of a delivery fails and changes nothing.
	if err := src.Ack(tb.ctx, ms[4]); err == nil {
		t.Fatal("second Ack of one delivery: nil, want an error")
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 5)
	if st := mustStats(t, tb.b, "ev"); st.Acked != 4 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLogDeadLetterToTopicDLQ(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	tb.publish(t, "ev", &ackwise.Message{ID: "e", Key: "k", Payload: []byte{9, 8}, Headers: ackwise.HeadersOf("a", "b")})
	m := recvOne(t, src)
	env := dlq.New(m, dlq.ReasonMaxAttempts, errors.New("boom"), ackwise.ClassTransient, tb.clk.Now(), "c", "")
	if err := src.DeadLetter(tb.ctx, m, env); err != nil {
		t.Fatal(err)
	}
	dl := memorytest.RequireDeadLettered(t, tb.b, "ev", "e", dlq.ReasonMaxAttempts)
	if dl.Event.To != "ev.dlq" || dl.Message == nil || !bytes.Equal(dl.Message.Payload, []byte{9, 8}) || dl.Message.Headers.Get("a") != "b" {
		t.Fatalf("dead letter %+v / %+v", dl.Event, dl.Message)
	}
	dec, err := dlq.Decode(dl.Message.Headers)
	if err != nil || dec.Partition != 0 || dec.Offset != 0 || dec.Source != "ev" {
		t.Fatalf("envelope %+v, %v", dec, err)
	}
}

func TestLogNackUnsupported(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	tb.publish(t, "ev", msg("a", ""))
	m := recvOne(t, src)
	if err := src.Nack(tb.ctx, m, 0); !errors.Is(err, memory.ErrNackUnsupported) {
		t.Fatalf("Nack = %v", err)
	}
	if err := src.ExtendLease(tb.ctx, m, 0); err != nil {
		t.Fatalf("ExtendLease = %v", err)
	}
	if !src.Valid(m) {
		t.Fatal("Nack changed the delivery")
	}
}

func TestLogReleaseRedeliversInSameMember(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	tb.publish(t, "ev", msg("0", "k"), msg("1", "k"), msg("2", "k"))
	ms := recv(t, src, 2)
	if err := src.Release(tb.ctx, ms[1]); err != nil {
		t.Fatal(err)
	}
	if err := src.Release(tb.ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 10)
	n, err := src.Receive(tb.ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	// Released records first, in offset order, then the new one.
	if g := fmt.Sprint(ids(buf[:n])); g != "[0 1 2]" {
		t.Fatalf("got %s", g)
	}
	if buf[0].Attempt != 2 || buf[2].Attempt != 1 {
		t.Fatalf("attempts %d %d", buf[0].Attempt, buf[2].Attempt)
	}
	for _, m := range buf[:n] {
		if err := src.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 3)
}

func TestLogRebalance(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	a := tb.member(t, "ev", "g")
	// One record per partition: find a key for each.
	keys := map[int32]string{}
	for i := 0; len(keys) < 4; i++ {
		k := fmt.Sprint("key", i)
		if _, ok := keys[memory.PartitionOf(k, 4)]; !ok {
			keys[memory.PartitionOf(k, 4)] = k
		}
	}
	for p := range int32(4) {
		tb.publish(t, "ev", msg(fmt.Sprint("p", p), keys[p]))
	}
	got := recv(t, a, 4)
	byPart := map[int32]*ackwise.Message{}
	for _, m := range got {
		byPart[m.Partition] = m
	}
	if err := a.Ack(tb.ctx, byPart[0]); err != nil {
		t.Fatal(err)
	}

	b := tb.member(t, "ev", "g")
	if ga, gb := fmt.Sprint(a.Assigned()), fmt.Sprint(b.Assigned()); ga != "[0 1]" || gb != "[2 3]" {
		t.Fatalf("assignment a=%s b=%s", ga, gb)
	}
	// a keeps partitions 0 and 1 and their deliveries.
	if !a.Valid(byPart[1]) {
		t.Fatal("kept partition's delivery invalid")
	}
	if err := a.Ack(tb.ctx, byPart[1]); err != nil {
		t.Fatal(err)
	}
	// Deliveries of the lost partitions are invalid and their acks ignored.
	if a.Valid(byPart[2]) {
		t.Fatal("lost partition's delivery valid")
	}
	if err := a.Ack(tb.ctx, byPart[2]); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack on lost partition = %v", err)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 2, 0)
	// b re-reads them from the committed offset.
	again := recv(t, b, 2)
	for _, m := range again {
		if m.Partition < 2 || m.Offset != 0 || m.Attempt != 2 {
			t.Fatalf("b got %+v", m)
		}
		if err := b.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for p := range int32(4) {
		memorytest.RequireCommitted(t, tb.b, "ev", "g", p, 1)
	}

	// b leaves: a owns everything again.
	b.Close()
	if ga := fmt.Sprint(a.Assigned()); ga != "[0 1 2 3]" {
		t.Fatalf("after leave a=%s", ga)
	}
	tb.publish(t, "ev", msg("late", keys[3]))
	if m := recvOne(t, a); m.ID != "late" || m.Partition != 3 || m.Offset != 1 {
		t.Fatalf("a got %+v", m)
	}
}

func TestLogGroupsAreIndependent(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	g1 := tb.member(t, "ev", "g1")
	tb.publish(t, "ev", msg("a", ""))
	m := recvOne(t, g1)
	if err := g1.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	g2 := tb.member(t, "ev", "g2") // a new group starts at the earliest offset
	if m := recvOne(t, g2); m.ID != "a" || m.Attempt != 1 {
		t.Fatalf("g2 got %+v", m)
	}
}

func TestLogCrashRereadsFromCommitted(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a := tb.member(t, "ev", "g")
	for i := range 4 {
		tb.publish(t, "ev", msg(fmt.Sprint(i), "k"))
	}
	ms := recv(t, a, 4)
	for _, i := range []int{0, 2} {
		if err := a.Ack(tb.ctx, ms[i]); err != nil {
			t.Fatal(err)
		}
	}
	a.Crash()
	if _, err := a.Receive(tb.ctx, make([]*ackwise.Message, 1)); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Receive after crash = %v", err)
	}
	if err := a.Ack(tb.ctx, ms[1]); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack after crash = %v", err)
	}
	b := tb.member(t, "ev", "g")
	got := recv(t, b, 3)
	if g := fmt.Sprint(ids(got)); g != "[1 2 3]" {
		t.Fatalf("b got %s", g)
	}
	if got[0].Attempt != 2 || got[2].Attempt != 2 {
		t.Fatalf("attempts %d %d", got[0].Attempt, got[2].Attempt)
	}
}

func TestLogSeekReplays(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	for i := range 3 {
		tb.publish(t, "ev", msg(fmt.Sprint(i), ""))
	}
	old := recv(t, src, 3)
	for _, m := range old {
		if err := src.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 3)
	if err := tb.b.SeekGroup("ev", "g", 0, 1); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 1)
	if g := fmt.Sprint(ids(recv(t, src, 2))); g != "[1 2]" {
		t.Fatalf("replay got %s", g)
	}
	// Deliveries made before the seek are invalid.
	if src.Valid(old[0]) {
		t.Fatal("pre-seek delivery valid")
	}
	if err := tb.b.SeekGroup("ev", "g", 0, memory.OffsetEarliest); err != nil {
		t.Fatal(err)
	}
	if g := fmt.Sprint(ids(recv(t, src, 3))); g != "[0 1 2]" {
		t.Fatalf("replay from earliest got %s", g)
	}
	if err := tb.b.SeekGroup("ev", "g", 0, memory.OffsetLatest); err != nil {
		t.Fatal(err)
	}
	requireNothing(t, src)
	for _, bad := range []struct {
		part int32
		off  int64
		want string
	}{{1, 0, "partition = 1"}, {0, 4, "offset = 4"}, {0, -3, "offset = -3"}} {
		err := tb.b.SeekGroup("ev", "g", bad.part, bad.off)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(bad.want)) {
			t.Fatalf("SeekGroup(%d, %d) = %v, want %q", bad.part, bad.off, err, bad.want)
		}
	}
}

func TestLogRetention(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Retention: 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 2500 {
		tb.publish(t, "ev", msg(fmt.Sprint(i), ""))
	}
	msgs, err := tb.b.Messages("ev")
	if err != nil || fmt.Sprint(ids(msgs)) != "[2497 2498 2499]" {
		t.Fatalf("retained %v, %v", ids(msgs), err)
	}
	src := tb.member(t, "ev", "g")
	if m := recvOne(t, src); m.ID != "2497" || m.Offset != 2497 {
		t.Fatalf("first after retention: %+v", m)
	}
}

func TestLogCloseWakesReceive(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	src.Close()
	if err := <-errc; !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Receive = %v", err)
	}
}

func TestJoinGroupValidation(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if _, err := tb.b.JoinGroup("ev", ""); err == nil {
		t.Fatal("empty group accepted")
	}
	if _, err := tb.b.Committed("nope", "g"); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("Committed of missing topic = %v", err)
	}
}

func TestLogReceiveHonoursContext(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	ctx, cancel := context.WithCancel(tb.ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive = %v", err)
	}
	// Still a member: a later Receive gets records.
	tb.publish(t, "ev", msg("a", ""))
	if m := recvOne(t, src); m.ID != "a" {
		t.Fatalf("got %q", m.ID)
	}
}

func TestLogMoreMembersThanPartitions(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	a := tb.member(t, "ev", "g")
	b := tb.member(t, "ev", "g")
	c := tb.member(t, "ev", "g")
	if fmt.Sprint(a.Assigned(), b.Assigned(), c.Assigned()) != "[0] [1] []" {
		t.Fatalf("assignment %v %v %v", a.Assigned(), b.Assigned(), c.Assigned())
	}
	got := make(chan string, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if _, err := c.Receive(tb.ctx, buf); err != nil {
			t.Error(err)
			return
		}
		got <- buf[0].ID
	}()
	k := "x"
	for i := 0; memory.PartitionOf(k, 2) != 0; i++ {
		k = fmt.Sprint("x", i)
	}
	tb.publish(t, "ev", msg("p0", k))
	a.Close() // range assignment over b, c: b takes 0, c takes 1
	if fmt.Sprint(b.Assigned(), c.Assigned()) != "[0] [1]" {
		t.Fatalf("assignment %v %v", b.Assigned(), c.Assigned())
	}
	b.Close() // c takes partition 0 and its unread record
	if id := <-got; id != "p0" {
		t.Fatalf("c got %q", id)
	}
}

func TestLogWithoutHistory(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{DisableHistory: true})
	if err != nil {
		t.Fatal(err)
	}
	src, err := b.JoinGroup("ev", "g")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, b, "ev", msg("a", ""), msg("b", ""))
	for _, m := range recv(t, src, 2) {
		if err := src.Ack(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := b.Committed("ev", "g"); err != nil || c[0] != 2 {
		t.Fatalf("committed %v, %v", c, err)
	}
	b.Outage(time.Minute, "ev")
	if _, err := src.Receive(context.Background(), make([]*ackwise.Message, 1)); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Receive in outage = %v", err)
	}
}

// Retention drops records a member has not settled or not read yet: the
// dropped ones no longer hold back the commit.
func TestLogRetentionWhileInFlight(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Retention: 2}); err != nil {
		t.Fatal(err)
	}
	src := tb.member(t, "ev", "g")
	tb.publish(t, "ev", msg("a", ""))
	a := recvOne(t, src)                                          // offset 0, in flight
	tb.publish(t, "ev", msg("b", ""), msg("c", ""), msg("d", "")) // keeps 2..3
	got := recv(t, src, 2)
	if fmt.Sprint(ids(got)) != "[c d]" {
		t.Fatalf("got %v", ids(got))
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 0) // a still holds it back
	if err := src.Ack(tb.ctx, a); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 2) // b was dropped unread
	if err := src.Release(tb.ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "ev", msg("e", ""), msg("f", "")) // drops c (released) and d
	if m := recvOne(t, src); m.ID != "e" {
		t.Fatalf("got %q", m.ID)
	}
	if err := src.Ack(tb.ctx, got[1]); err != nil { // d
		t.Fatal(err)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 4) // c is gone: settled by retention
}

func TestBrokerNamesAndClock(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.publish(t, "b", msg("x", ""))
	if err := tb.b.CreateTopic("a", memory.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(tb.b.Names()); got != "[a b]" {
		t.Fatalf("Names = %s", got)
	}
	if tb.b.Clock() != tb.clk {
		t.Fatal("Clock is not the configured clock")
	}
	src := tb.member(t, "a", "g")
	if !strings.HasPrefix(src.ID(), "a/g#") {
		t.Fatalf("ID %q", src.ID())
	}
	src.Crash()
	if src.Valid(&ackwise.Message{}) {
		t.Fatal("valid after crash")
	}
}
