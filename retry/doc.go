// Package retry holds the retry policy: how many attempts a message gets and
// how long to wait before each redelivery: exponential backoff with jitter and
// a cap (also as a github.com/cenkalti/backoff/v4 BackOff, for in-process
// retries), or a tiered schedule (1m, 10m, 1h …) that describes the delays of
// a retry-topic chain or of wait queues.
//
// A policy only computes delays. The consumer engine applies them either
// through the broker's own delay mechanism (visibility timeout, wait queue,
// retry topic) or in place with a timer that holds back only the message's
// key (consumer.RetryMode); either way no worker sleeps while holding a
// message.
package retry
