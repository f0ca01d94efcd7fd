package consumer_test

import (
	"fmt"
	"time"

	"github.com/ackwise/ackwise/consumer"
)

// Two samples of a backlog a minute apart, and what was consumed between
// them: 10,000 msgs/s consumed, 8,000 msgs/s arriving, 6 million left.
func ExampleEstimateDrain() {
	d := consumer.EstimateDrain(6_120_000, 6_000_000, 600_000, time.Minute)
	fmt.Printf("consume %.0f/s, ingress %.0f/s, drained in %v\n", d.ConsumeRate, d.IngressRate, d.Time)

	// Growing: never drained at these rates.
	d = consumer.EstimateDrain(6_000_000, 6_120_000, 480_000, time.Minute)
	fmt.Println(d.Draining(), d.Time == consumer.NotDraining)
	// Output:
	// consume 10000/s, ingress 8000/s, drained in 50m0s
	// false true
}
