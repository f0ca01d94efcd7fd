package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/kafka"
)

// A consumer-group source with a retry-topic chain and a dead-letter topic,
// fed by a sink, on an in-process kfake broker.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	client := kafka.ClientConfig{Brokers: cluster.ListenAddrs()}
	cfg := kafka.SourceConfig{
		ClientConfig: client,
		Topic:        "orders",
		Group:        "billing",
		RetryTiers:   []time.Duration{time.Minute, 10 * time.Minute},
	}
	fmt.Println(cfg.Topics())
	if err := kafka.CreateTopics(ctx, cfg, 3, 1); err != nil {
		panic(err)
	}

	sink, err := kafka.NewSink(ctx, kafka.SinkConfig{ClientConfig: client, Topic: "orders"})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "order-42-created", Key: "order-42", Payload: []byte(`{"total":42}`)}); err != nil {
		panic(err)
	}

	src, err := kafka.NewSource(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer src.Close()
	buf := make([]*ackwise.Message, 16)
	n, err := src.Receive(ctx, buf)
	if err != nil {
		panic(err)
	}
	m := buf[:n][0]
	fmt.Println(m.ID, m.Key, string(m.Payload), m.Attempt)
	if err := src.Ack(ctx, m); err != nil {
		panic(err)
	}
	// Output:
	// [orders orders.retry.1m orders.retry.10m orders.dlq]
	// order-42-created order-42 {"total":42} 1
}
