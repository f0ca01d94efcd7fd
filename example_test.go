package ackwise_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise"
)

func ExampleRetryAfter() {
	// A payment API answered 429 with Retry-After: 30.
	err := fmt.Errorf("charge card: %w", ackwise.RetryAfter(errors.New("429 Too Many Requests"), 30*time.Second))
	d, _ := ackwise.RetryAfterOf(err)
	fmt.Println(ackwise.ClassOf(err), d)
	// Output: rate-limited 30s
}

func ExamplePermanent() {
	err := fmt.Errorf("decode order: %w", ackwise.Permanent(errors.New("unexpected end of JSON input")))
	fmt.Println(ackwise.ClassOf(err))
	// Output: permanent
}

func ExampleHeaders() {
	h := ackwise.HeadersOf("x-tenant", "acme")
	h.Add("x-hop", "eu-1")
	h.Add("x-hop", "us-2") // a repeated key, as Kafka allows
	fmt.Println(h.Get("x-hop"), h.Has("x-tenant"))

	h.Set("x-hop", "ap-3") // one value again
	h.Del("x-tenant")
	fmt.Println(h)
	// Output:
	// us-2 true
	// [{x-hop ap-3}]
}
