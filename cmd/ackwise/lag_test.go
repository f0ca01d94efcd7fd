package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestKafkaLagRates: between lag's two samples 50 records arrive and the
// group commits past the half of the topic it had not read: ingress and
// consume rates are those counts over the window, the backlog what is left,
// and the group was never joined (no member, no rebalance of live ones).
func TestKafkaLagRates(t *testing.T) {
	t.Parallel()
	c, addr := kfakeCluster(t)
	topic := fmt.Sprintf("orders-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	createTopic(t, ctx, c, topic, 2)
	sink, err := adapters.OpenSink(ctx, "kafka://"+addr+"/"+topic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	publish := func(prefix string, n int) {
		t.Helper()
		msgs := make([]*ackwise.Message, n)
		for i := range msgs {
			msgs[i] = &ackwise.Message{ID: fmt.Sprint(prefix, i), Key: fmt.Sprint("k", i), Payload: []byte("p")}
		}
		if err := sink.Publish(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	publish("a", 100)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(at func(end int64) int64) int64 {
		t.Helper()
		var offs kadm.Offsets
		var sum int64
		ends.Each(func(o kadm.ListedOffset) {
			offs.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: at(o.Offset), LeaderEpoch: -1})
			sum += at(o.Offset)
		})
		resp, err := adm.CommitOffsets(ctx, "billing", offs)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	half := commit(func(end int64) int64 { return end / 2 })

	r, err := lagAcross(ctx, "kafka://"+addr+"/"+topic+"?group=billing", func(context.Context) error {
		publish("b", 50)
		all := commit(func(end int64) int64 { return end })
		if all-half == 0 {
			return fmt.Errorf("nothing committed between the samples")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	secs := r.WindowSeconds
	if !r.Log || r.BacklogStart != 100-half || r.Backlog != 50 || len(r.Partitions) != 2 ||
		math.Abs(*r.IngressRate*secs-50) > 1e-6 || math.Abs(*r.ConsumeRate*secs-float64(100-half)) > 1e-6 {
		t.Fatalf("%+v (ingress %v, consume %v over %vs); want backlog %d then 50, 50 in, %d consumed", r, *r.IngressRate, *r.ConsumeRate, secs, 100-half, 100-half)
	}
	if (r.DrainRate > 0) != (100-half > 50) || r.DrainRate > 0 && math.Abs(*r.DrainSeconds-50/r.DrainRate) > 1e-6 {
		t.Fatalf("drain rate %v, drain seconds %v", r.DrainRate, r.DrainSeconds)
	}
	groups, err := adm.DescribeGroups(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if g := groups["billing"]; len(g.Members) != 0 || g.State != "Empty" {
		t.Fatalf("group billing: state %q, %d members; lag must not join it", g.State, len(g.Members))
	}

	code, out, errOut := ackwiseRun(t, "lag", "kafka://"+addr+"/"+topic+"?group=billing", "--window", "10ms")
	if code != exitOK || !strings.Contains(out, "backlog: 50 records (was 50)") || !strings.Contains(out, "ingress: 0.0 msg/s") ||
		!strings.Contains(out, "time to drain: never") || !strings.Contains(out, "partitions:\n  "+topic+"/0 end=") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, _, errOut := ackwiseRun(t, "lag", "kafka://"+addr+"/"+topic, "--window", "10ms"); code != exitFailed || !strings.Contains(errOut, "no group= parameter") {
		t.Fatalf("lag without a group: exit %d, stderr %s", code, errOut)
	}
}
